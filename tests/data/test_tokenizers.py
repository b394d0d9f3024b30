"""Tokenizers: exact round trips, the trained BPE against rustbpe's own encoder, save/load, offline errors."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import requests
import rustbpe
import tiktoken
import tiktoken.load
import tiktoken.registry
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers import (
    EOT,
    ByteTokenizer,
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    build_tokenizer,
    load_tokenizer,
)
from minigpt.errors import UserError

VOCAB = 320


def synthetic_text(seed: int, n_lines: int = 400) -> str:
    """Python-ish lines from a small vocabulary, so BPE has frequent pairs to merge."""
    rng = random.Random(seed)
    words = ["def", "return", "self", "value", "for", "in", "range", "if", "else", "print", "x", "y", "idx"]
    lines = []
    for _ in range(n_lines):
        indent = "    " * rng.randint(0, 2)
        body = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
        lines.append(f"{indent}{body}({rng.randint(0, 999)}):  # café ✓\n")
    return "".join(lines)


TRAIN_TEXTS = [synthetic_text(i) for i in range(4)]
REAL_FILES = ["os.py", "json/decoder.py", "textwrap.py"]


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=VOCAB), TRAIN_TEXTS)


def real_texts() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [(root / f).read_text(encoding="utf-8") for f in REAL_FILES]


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=200))
def test_bpe_and_byte_round_trip_any_unicode(bpe: Tokenizer, text: str) -> None:
    for tok in (bpe, ByteTokenizer()):
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size and i != tok.eot_id for i in ids)
        assert tok.decode(ids) == text


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=200))
def test_char_round_trips_text_over_its_own_alphabet(text: str) -> None:
    tok = CharTokenizer.from_texts([text])
    assert tok.vocab_size == len(set(text)) + 1
    ids = tok.encode(text)
    assert ids == [sorted(set(text)).index(c) for c in text]  # id = rank of the character's code point
    assert tok.decode(ids) == text


def test_round_trip_on_real_files(bpe: Tokenizer) -> None:
    texts = real_texts()
    for tok in (bpe, ByteTokenizer(), CharTokenizer.from_texts(texts)):
        for text in texts:
            assert tok.decode(tok.encode(text)) == text
        assert [tok.decode(ids) for ids in tok.encode_batch(texts, num_threads=2)] == texts


def test_byte_ids_are_the_utf8_bytes() -> None:
    tok = ByteTokenizer()
    text = "héllo ✓ 🐍"
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert (tok.vocab_size, tok.eot_id) == (257, 256)
    assert tok.decode([104, 256, 105]) == f"h{EOT}i"
    assert tok.decode([0xE2, 0x9C]) == "\ufffd"  # a cut multi-byte character does not raise


def test_bpe_matches_rustbpe_and_its_configured_shape(bpe: Tokenizer) -> None:
    # A second backend: rustbpe trained the same way encodes with its own Rust code.
    reference = rustbpe.Tokenizer()
    reference.train_from_iterator(iter(TRAIN_TEXTS), VOCAB - 1)
    for text in [synthetic_text(99), *real_texts()[:1]]:
        assert bpe.encode(text) == reference.encode(text)
    assert bpe.vocab_size == VOCAB
    assert bpe.eot_id == VOCAB - 1
    assert bpe.decode([bpe.eot_id]) == EOT
    assert len(bpe.encode(TRAIN_TEXTS[0])) < len(TRAIN_TEXTS[0].encode()) / 2  # merges compress


def test_bpe_saves_in_tiktoken_format_and_reloads_exactly(bpe: Tokenizer, tmp_path: Path) -> None:
    bpe.save(tmp_path / "tok")
    # tiktoken's own reader accepts the rank file: 256 bytes + merges, every id but the special one
    ranks = tiktoken.load.load_tiktoken_bpe(str(tmp_path / "tok" / "ranks.tiktoken"))
    assert sorted(ranks.values()) == list(range(VOCAB - 1))
    assert all(ranks[bytes([b])] == b for b in range(256))
    again = load_tokenizer(tmp_path / "tok")
    assert (again.kind, again.name, again.vocab_size, again.eot_id) == ("bpe", bpe.name, VOCAB, VOCAB - 1)
    for text in [synthetic_text(7), *real_texts()]:
        assert again.encode(text) == bpe.encode(text)


@pytest.mark.parametrize("kind", ["char", "byte"])
def test_char_and_byte_save_and_reload(kind: str, tmp_path: Path) -> None:
    texts = real_texts()
    tok = build_tokenizer(TokenizerConfig(kind=kind), texts)
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert type(again) is type(tok) and again.vocab_size == tok.vocab_size and again.eot_id == tok.eot_id
    assert again.encode(texts[0]) == tok.encode(texts[0])
    assert again.vocab_size - 1 == again.eot_id


def test_special_token_text_stays_plain_text(bpe: Tokenizer) -> None:
    for tok in (bpe, ByteTokenizer()):
        ids = tok.encode(f"a{EOT}b")
        assert tok.eot_id not in ids
        assert tok.decode(ids) == f"a{EOT}b"


def test_decode_accepts_tensors_and_rejects_unknown_ids(bpe: Tokenizer) -> None:
    ids = bpe.encode("return self.value")
    assert bpe.decode(torch.tensor(ids)) == "return self.value"
    with pytest.raises(ValueError, match="outside"):
        bpe.decode([VOCAB])


def test_char_unknown_character_is_a_user_error() -> None:
    tok = CharTokenizer.from_texts(["abc"])
    with pytest.raises(UserError, match=r"'z' \(U\+007A\).*tokenizer=byte"):
        tok.encode("abz")


def test_bpe_vocab_larger_than_the_corpus_allows_is_a_user_error() -> None:
    with pytest.raises(UserError, match="lower tokenizer.vocab_size"):
        build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=2000), ["tiny text, tiny text"])


def test_bpe_train_chars_caps_what_merges_learn_from() -> None:
    capped = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=VOCAB, train_chars=5000), TRAIN_TEXTS)
    reference = rustbpe.Tokenizer()
    reference.train_from_iterator(iter([TRAIN_TEXTS[0][:5000]]), VOCAB - 1)
    assert capped.encode(TRAIN_TEXTS[1]) == reference.encode(TRAIN_TEXTS[1])


def test_tokenizer_config_validation() -> None:
    with pytest.raises(UserError, match="tokenizer.kind='wordpiece'"):
        TokenizerConfig(kind="wordpiece")
    with pytest.raises(UserError, match="at least 257"):
        TokenizerConfig(kind="bpe", vocab_size=100)
    for kind, key in (("byte", "vocab_size"), ("char", "train_chars")):  # refused, never silently ignored
        with pytest.raises(UserError, match=f"tokenizer.{key} applies only to tokenizer=bpe"):
            TokenizerConfig(kind=kind, **{key: 300})
    assert TokenizerConfig().bpe_vocab_size == 4096 and TokenizerConfig(kind="char").vocab_size is None


def test_load_tokenizer_without_files_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("kind", ["gpt2", "cl100k"])
def test_named_encodings_offline_give_one_line(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(url: str) -> bytes:
        raise requests.exceptions.ConnectionError(f"Failed to resolve host for {url}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty cache
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # nothing loaded in this process either
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    with pytest.raises(UserError) as err:
        build_tokenizer(TokenizerConfig(kind=kind))
    message = str(err.value)
    assert "\n" not in message
    assert "TIKTOKEN_CACHE_DIR" in message and "network" in message and "tokenizer=bpe" in message
    assert "ConnectionError" in message  # the simulated outage, not some other failure


# -- token_byte_lengths: the bytes of text behind every id, for bits per byte -------------------------------


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=200))
def test_token_byte_lengths_sum_to_the_utf8_length(bpe: Tokenizer, text: str) -> None:
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates are not text a file can hold
    for tok in (bpe, ByteTokenizer(), CharTokenizer.from_texts([text])):
        table = tok.token_byte_lengths()
        assert table.shape == (tok.vocab_size,) and table.dtype == np.int64
        assert table[tok.eot_id] == 0  # a document boundary, not text
        ids = tok.encode(text)
        assert int(table[ids].sum()) == len(text.encode("utf-8"))


def test_bpe_byte_lengths_match_tiktokens_decoder_even_for_partial_characters(bpe: Tokenizer) -> None:
    table = bpe.token_byte_lengths()
    for i in range(bpe.vocab_size - 1):  # every token but the special one, against tiktoken's own bytes
        assert table[i] == len(bpe.encoding.decode_single_token_bytes(i))
    ids = bpe.encode("🐍")  # rare in the training text: four single-byte tokens, none a whole character
    assert [int(table[i]) for i in ids] == [1, 1, 1, 1]


def test_named_style_encodings_give_specials_and_unused_ids_zero_bytes() -> None:
    # A byte-level encoding whose special token sits at 70000, as in tiktoken's named encodings: the ids
    # between the last rank and the special name no token (cl100k_base has such gaps).
    enc = tiktoken.Encoding("gappy", pat_str=r"\s+|\S+", mergeable_ranks={bytes([b]): b for b in range(256)}
                            | {b"ab": 256}, special_tokens={EOT: 70_000})
    table = TiktokenTokenizer("cl100k", enc).token_byte_lengths()
    assert table.shape == (70_001,)
    assert table[:256].tolist() == [1] * 256 and table[256] == 2
    assert not table[257:].any()
