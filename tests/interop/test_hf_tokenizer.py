"""Tokenizers in the Hugging Face format: `AutoTokenizer.from_pretrained` on an exported folder must give
exactly minigpt's ids (transformers' tokenizers library is the independent implementation), for bpe, byte and
char, and a tokenizer.json must read back into the minigpt tokenizer it came from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from interop_helpers import small_bpe, stdlib_texts

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.prepare import prepare_dataset
from minigpt.data.sources import load_corpus
from minigpt.data.tokenizers import EOT, ByteTokenizer, CharTokenizer, TiktokenTokenizer
from minigpt.errors import UserError
from minigpt.interop.fast_tokenizer import GPT2_PATTERN, fast_tokenizer
from minigpt.interop.hf_tokenizer import save_hf_tokenizer, tokenizer_from_hf

transformers = pytest.importorskip("transformers")

TRICKY = [
    "", "x", "<|endoftext|> typed in a text is text", "tabs\tand  double  spaces   \n\n\n  x",
    "crlf\r\nline\r\n", "digits 1234567 and 3.14159", "ünïcødé, 中文, emoji 😀🎉", "'s 'LL 'Re don't",
    "trailing spaces   ", "  leading", "\u00a0non-breaking\u2009thin",
]


def _tokenizers():
    texts = stdlib_texts()
    return {"bpe": small_bpe(), "byte": ByteTokenizer(), "char": CharTokenizer.from_texts(texts + TRICKY)}


@pytest.mark.parametrize("kind", ["bpe", "byte", "char"])
def test_autotokenizer_gives_our_ids_and_text_back(tmp_path: Path, kind: str) -> None:
    ours = _tokenizers()[kind]
    save_hf_tokenizer(ours, tmp_path, model_max_length=128)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for text in [*TRICKY, *stdlib_texts()]:
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids, text[:60]
        assert theirs.decode(ids) == text
    assert theirs.eos_token_id == theirs.bos_token_id == ours.eot_id
    assert theirs.decode([ours.eot_id]) == EOT
    back = tokenizer_from_hf(tmp_path)
    assert (back.kind, back.name, back.vocab_size, back.eot_id) == (ours.kind, ours.name, ours.vocab_size,
                                                                    ours.eot_id)
    assert all(back.encode(t) == ours.encode(t) for t in TRICKY)


def test_special_tokens_keep_their_ids_across_a_gap(tmp_path: Path) -> None:
    """cl100k's specials leave ids unused between them; the converted tokenizer keeps every id."""
    ranks = small_bpe().encoding._mergeable_ranks
    n = len(ranks)
    specials = {EOT: n + 1, "<|fim_prefix|>": n + 2, "<|endofprompt|>": n + 6}
    ours = TiktokenTokenizer("bpe", tiktoken.Encoding("gappy", pat_str=small_bpe().encoding._pat_str,
                                                       mergeable_ranks=ranks, special_tokens=specials))
    save_hf_tokenizer(ours, tmp_path, model_max_length=64)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert {s: theirs.convert_tokens_to_ids(s) for s in specials} == specials
    assert theirs("<|endofprompt|> x")["input_ids"] == ours.encode("<|endofprompt|> x")
    back = tokenizer_from_hf(tmp_path)
    assert back.encoding._special_tokens == specials and back.eot_id == n + 1


def test_a_gpt2_style_tokenizer_json_reads_back_with_gpt2s_pattern(tmp_path: Path) -> None:
    """GPT-2's own tokenizer.json has a ByteLevel pre-tokenizer with its built-in regex, not a Split."""
    from tokenizers import pre_tokenizers

    fast = fast_tokenizer(small_bpe())
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    fast.encode_special_tokens = True  # as transformers sets it from split_special_tokens
    fast.save(str(tmp_path / "tokenizer.json"))
    back = tokenizer_from_hf(tmp_path)
    assert back.encoding._pat_str == GPT2_PATTERN
    for text in [*TRICKY, *stdlib_texts()[:3]]:
        assert back.encode(text) == fast.encode(text).ids


def test_tokenizer_json_it_cannot_express_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    with pytest.raises(UserError, match="tokenizer_dir=DIR"):
        tokenizer_from_hf(tmp_path)
    save_hf_tokenizer(small_bpe(), tmp_path, model_max_length=64)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["model"]["merges"] = spec["model"]["merges"][::-1]  # not in id order: tiktoken would split otherwise
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match="not in the order of their token ids"):
        tokenizer_from_hf(tmp_path)
    with pytest.raises(UserError, match="has no tokenizer.json"):
        tokenizer_from_hf(tmp_path / "nowhere")


@pytest.mark.slow  # prepares the default corpus with the default tokenizer (~10 s on 2 cores)
def test_the_whole_val_split_of_the_default_corpus_encodes_to_the_prepared_ids(tmp_path: Path) -> None:
    """The val tokens `prepare` wrote (tiktoken) are what the exported HF tokenizer gives, document by
    document."""
    data = DataConfig(cache_dir=str(tmp_path / "cache"))
    prepared = prepare_dataset(data, TokenizerConfig(kind="bpe", train_chars=1_000_000), progress=False)
    save_hf_tokenizer(prepared.tokenizer, tmp_path / "hf", model_max_length=128)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    docs = list(load_corpus(data, tmp_path / "cache").documents("val"))
    encoded = theirs([d.text for d in docs])["input_ids"]
    ids = np.concatenate([[prepared.tokenizer.eot_id, *e] for e in encoded])  # the layout prepare writes
    val = prepared.split("val")
    expected = val.read(0, len(val))
    assert len(docs) > 10 and len(ids) > 50_000
    assert np.array_equal(ids, expected)
