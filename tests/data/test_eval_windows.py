"""Evaluation windows: the whole split covered (as scripts/evaluate.py stride=T covers it), budgets spread
evenly from the first document to the last, batches equal to slices of the shards, and target bytes that
add up to the UTF-8 bytes of the text they decode to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_loader import distinct_tokens, write_split
from test_prepare import expected_split_text, make_corpus, text_cfg

from minigpt.data.config import TokenizerConfig
from minigpt.data.eval_windows import IGNORE_INDEX, eval_batches, eval_windows
from minigpt.data.prepare import prepare_dataset
from minigpt.data.tokenizers import EOT
from minigpt.errors import UserError
from minigpt.inspect.perplexity import windows as evaluate_py_windows


def scored_positions(w) -> np.ndarray:
    """How often each stream position is scored as a target by windows `w`."""
    T = w.block_size
    n = int(w.starts[-1]) + T + 1
    counts = np.zeros(n, dtype=np.int64)
    for s, k in zip(w.starts.tolist(), w.scored.tolist(), strict=True):
        counts[s + 1 + T - k : s + T + 1] += 1
    return counts


@pytest.mark.parametrize(("n", "T"), [(9, 8), (17, 8), (20, 8), (1000, 64), (1025, 64), (12345, 100)])
def test_all_scores_every_target_once_exactly_like_evaluate_py(n: int, T: int) -> None:
    w = eval_windows(n, T)
    counts = scored_positions(w)
    assert len(counts) == n and counts[0] == 0 and np.all(counts[1:] == 1)
    assert w.n_targets == n - 1
    spans = list(evaluate_py_windows(n, T, T))  # the sliding-window evaluator, stride = block_size
    assert w.starts.tolist() == [s for s, _, _ in spans]
    assert w.scored.tolist() == [k for _, _, k in spans]


@pytest.mark.parametrize("budget", [1, 64, 5 * 64, 20 * 64 + 7, 100 * 64])
def test_a_budget_spreads_whole_windows_evenly_from_first_to_last(budget: int) -> None:
    n, T = 10_000, 64
    w = eval_windows(n, T, max_tokens=budget)
    k = max(2, budget // T)
    assert len(w) == k and np.all(w.scored == T) and w.n_targets == k * T
    assert w.starts[0] == 0 and w.starts[-1] == n - 1 - T  # the first token and the last are both read
    gaps = np.diff(w.starts)
    assert gaps.min() >= T  # disjoint
    assert gaps.max() - gaps.min() <= 1  # evenly spaced, up to rounding
    assert np.array_equal(eval_windows(n, T, max_tokens=budget).starts, w.starts)  # fixed


def test_a_budget_beyond_the_split_is_the_whole_split() -> None:
    whole = eval_windows(1000, 64)
    for budget in (15 * 64 + 64, 10**9):
        big = eval_windows(1000, 64, max_tokens=budget)
        assert np.array_equal(big.starts, whole.starts) and np.array_equal(big.scored, whole.scored)
    with pytest.raises(UserError, match=r"fewer than block_size \+ 1 = 65"):
        eval_windows(64, 64)


def test_batches_are_slices_of_the_shards_with_context_masked(tmp_path: Path) -> None:
    T, n = 8, 203  # 25 whole windows and a final stub of 2 targets
    tokens = distinct_tokens(n)
    split = write_split(tmp_path, tokens, shard_tokens=30, split="val")
    w = eval_windows(n, T)
    lengths = np.arange(1000) % 5  # a made-up byte table: id i is i % 5 bytes
    batches = list(eval_batches(split, w, 4, token_bytes=lengths))
    assert [len(b.x) for b in batches] == [4] * 6 + [2]
    xs, ys, nbytes = (torch.cat([getattr(b, f) for b in batches]) for f in ("x", "y", "target_bytes"))
    for row, (s, k) in enumerate(zip(w.starts.tolist(), w.scored.tolist(), strict=True)):
        assert xs[row].tolist() == tokens[s : s + T].tolist()
        target = tokens[s + 1 : s + T + 1].astype(np.int64)
        expected_y = np.where(np.arange(T) < T - k, IGNORE_INDEX, target)
        assert ys[row].tolist() == expected_y.tolist()
        assert nbytes[row].tolist() == np.where(expected_y == IGNORE_INDEX, 0, target % 5).tolist()
    assert (ys != IGNORE_INDEX).sum() == n - 1
    assert xs.dtype == ys.dtype == nbytes.dtype == torch.int64


def _strip_eot(tokenizer, ids: list[int]) -> str:
    """The text of `ids` without the document boundaries (decoded piece by piece between them)."""
    pieces, run = [], []
    for i in ids:
        if i == tokenizer.eot_id:
            pieces.append(tokenizer.decode(run))
            run = []
        else:
            run.append(i)
    return "".join(pieces) + tokenizer.decode(run)


def _raw_bytes(tokenizer, ids: list[int]) -> bytes:
    """The bytes the ids stand for, from the tokenizer's own decoder (tiktoken's) or the ids themselves."""
    return tokenizer.encoding.decode_bytes(ids) if tokenizer.kind == "bpe" else bytes(ids)


@pytest.fixture(scope="module", params=[("bpe", "ascii"), ("bpe", "unicode"), ("char", "unicode"),
                                        ("byte", "ascii"), ("byte", "unicode")])
def prepared_corpus(request, tmp_path_factory):
    kind, alphabet = request.param
    root = tmp_path_factory.mktemp(f"{kind}-{alphabet}")
    corpus = make_corpus(root / "corpus")
    if alphabet == "ascii":
        for p in corpus.iterdir():
            p.write_text(p.read_text(encoding="utf-8").replace("✓", "ok"))
    else:  # 2-, 3- and 4-byte characters: frequent ones bpe merges whole, rare ones it leaves as bytes
        rng = np.random.default_rng(0)
        for i, p in enumerate(sorted(corpus.iterdir())):
            rare = "".join(chr(c) for c in rng.integers(0x4E00, 0x9FFF, 40)) + "".join(
                chr(c) for c in rng.integers(0x1F300, 0x1F5FF, 40))
            extra = f"café 日本語 🐍{i} ñ€𝔘\n" * 20 + rare + "\n"
            p.write_text(p.read_text(encoding="utf-8") + extra, encoding="utf-8")
    cfg = text_cfg(corpus, shard_tokens=500)
    tok_cfg = TokenizerConfig(kind=kind, vocab_size=300 if kind == "bpe" else None)
    prepared = prepare_dataset(cfg, tok_cfg, root / "cache", progress=False)
    return prepared, corpus


def test_target_bytes_add_up_to_the_text_bytes(prepared_corpus) -> None:
    prepared, corpus = prepared_corpus
    tok, val = prepared.tokenizer, prepared.split("val")
    table = tok.token_byte_lengths()
    assert table.shape == (tok.vocab_size,) and table[tok.eot_id] == 0
    T = 16
    w = eval_windows(len(val), T)
    total, split_chars = 0, 0
    for batch in eval_batches(val, w, 8, token_bytes=table):
        for y, nbytes in zip(batch.y.tolist(), batch.target_bytes.tolist(), strict=True):
            scored = [t for t in y if t != IGNORE_INDEX]
            total += sum(nbytes)
            text = _strip_eot(tok, scored)
            if "\ufffd" in text:  # the window cuts a character: compare with the raw bytes of its tokens
                split_chars += 1
                assert sum(nbytes) == len(_raw_bytes(tok, [t for t in scored if t != tok.eot_id]))
            else:
                assert sum(nbytes) == len(text.encode("utf-8"))
    # Over the whole split: exactly the bytes of its files (the first token, an eot, is never a target).
    expected = expected_split_text(prepared.meta, "val", corpus).replace(EOT, "")
    assert total == len(expected.encode("utf-8")) == prepared.meta["bytes"]["val"]
    if tok.kind != "char" and prepared.meta["chars"]["val"] != prepared.meta["bytes"]["val"]:
        assert split_chars > 0  # windows do cut characters of the unicode corpus: that case was checked


def test_first_and_last_documents_are_scored(prepared_corpus) -> None:
    prepared, corpus = prepared_corpus
    tok, val = prepared.tokenizer, prepared.split("val")
    w = eval_windows(len(val), 16, max_tokens=3 * 16)
    batches = list(eval_batches(val, w, 8, token_bytes=tok.token_byte_lengths()))
    x, y = batches[0].x, batches[-1].y
    text = expected_split_text(prepared.meta, "val", corpus)
    first_doc, last_doc = text.split(EOT)[1], text.split(EOT)[-1]
    assert x[0, 0].item() == tok.eot_id  # the first window starts at the first document's boundary
    assert first_doc.startswith(_strip_eot(tok, x[0, 1:].tolist()).rstrip("\ufffd"))
    assert last_doc.endswith(_strip_eot(tok, y[-1].tolist()).lstrip("\ufffd"))  # ...the last ends the split
