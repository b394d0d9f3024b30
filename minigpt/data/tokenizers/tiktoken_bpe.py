"""Byte-level BPE through `tiktoken.Encoding`: the corpus-trained `bpe` and the named `gpt2` / `cl100k`.

Training uses `rustbpe` (Rust, parallel); encoding and decoding use tiktoken (Rust, threaded batch
API). Both speak the same language: a split pattern (a regex that cuts text into pre-tokens, here
GPT-4's) plus "mergeable ranks" (token bytes -> id, where a lower id is a merge learned earlier).
So the trained tokenizer *is* a tiktoken encoding, and it is saved in tiktoken's own rank format:
one line per token, `base64(token bytes) id`.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import rustbpe
import tiktoken

from minigpt.data.tokenizers.base import EOT, Tokenizer
from minigpt.errors import UserError

RANKS_FILE = "ranks.tiktoken"
NAMED_ENCODINGS = {"gpt2": "gpt2", "cl100k": "cl100k_base"}  # tokenizer.kind -> tiktoken's name


class TiktokenTokenizer(Tokenizer):
    """Any tiktoken encoding that has an `<|endoftext|>` special token."""

    def __init__(self, kind: str, encoding: tiktoken.Encoding):
        self.kind = kind
        self.name = encoding.name
        self.encoding = encoding
        self.vocab_size = encoding.n_vocab  # max token id + 1, specials included
        self.eot_id = encoding.encode_single_token(EOT)

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
        threads = num_threads or os.cpu_count() or 1
        return self.encoding.encode_ordinary_batch(list(texts), num_threads=threads)

    def _decode(self, ids: list[int]) -> str:
        try:
            return self.encoding.decode(ids)
        except KeyError as e:  # an id inside the range that names no token (cl100k has a few gaps)
            raise ValueError(f"{self.name} has no token {e}") from None

    def token_byte_lengths(self) -> np.ndarray:
        """Each rank's byte string's length; specials, and ids that name no token (cl100k has a few), 0."""
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for token, rank in self.encoding._mergeable_ranks.items():
            lengths[rank] = len(token)
        return lengths

    def _spec(self, folder: Path) -> dict[str, Any]:
        # `_mergeable_ranks`, `_pat_str` and `_special_tokens` are what tiktoken's README tells
        # users to read when extending an encoding; they are the whole definition of the encoding.
        write_ranks(folder / RANKS_FILE, self.encoding._mergeable_ranks)
        return {
            "ranks_file": RANKS_FILE,
            "pattern": self.encoding._pat_str,
            "special_tokens": dict(self.encoding._special_tokens),
        }

    @classmethod
    def from_spec(cls, folder: Path, spec: dict[str, Any]) -> TiktokenTokenizer:
        encoding = tiktoken.Encoding(
            name=spec["name"],
            pat_str=spec["pattern"],
            mergeable_ranks=read_ranks(folder / spec["ranks_file"]),
            special_tokens={k: int(v) for k, v in spec["special_tokens"].items()},
        )
        return cls(spec["kind"], encoding)


def write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    """tiktoken's .tiktoken format: `base64(token) rank` per line, in rank order."""
    ordered = sorted(ranks.items(), key=lambda item: item[1])
    lines = [f"{base64.b64encode(token).decode('ascii')} {rank}\n" for token, rank in ordered]
    path.write_text("".join(lines), encoding="ascii")


def read_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def train_bpe(texts: Iterable[str], vocab_size: int, train_chars: int | None = None) -> TiktokenTokenizer:
    """Learn `vocab_size - 257` merges on `texts` (256 byte tokens first, `<|endoftext|>` last).

    `train_chars` caps the characters read (texts in order, the last one cut), to bound training
    time on large corpora; the cut only limits what the merges are learned from.
    """
    trainer = rustbpe.Tokenizer()
    n_ranks = vocab_size - 1  # every id except the special one
    # pattern=None: rustbpe's default split pattern, GPT-4's (cl100k): contractions, letter runs,
    # digit groups of at most 3, punctuation runs, whitespace handled so "  x" splits before " x".
    trainer.train_from_iterator(_capped(texts, train_chars), n_ranks)
    if trainer.vocab_size < n_ranks:
        raise UserError(
            f"the train split only supports {trainer.vocab_size + 1} bpe tokens, fewer than "
            f"tokenizer.vocab_size={vocab_size}; lower tokenizer.vocab_size or use a larger corpus"
        )
    ranks = {bytes(token): rank for token, rank in trainer.get_mergeable_ranks()}
    encoding = tiktoken.Encoding(
        name=f"bpe-{vocab_size}",
        pat_str=trainer.get_pattern(),
        mergeable_ranks=ranks,
        special_tokens={EOT: len(ranks)},  # the last id: vocab_size - 1
    )
    return TiktokenTokenizer("bpe", encoding)


def _capped(texts: Iterable[str], max_chars: int | None) -> Iterable[str]:
    if max_chars is None:
        yield from texts
        return
    left = max_chars
    for text in texts:
        if left <= 0:
            return
        yield text[:left]
        left -= len(text)


def named_tokenizer(kind: str) -> TiktokenTokenizer:
    """tiktoken's published gpt2 / cl100k_base encodings, from its cache or the network."""
    name = NAMED_ENCODINGS[kind]
    try:
        encoding = tiktoken.get_encoding(name)
    except Exception as e:  # requests/urllib errors, hash mismatches, unwritable caches, ...
        raise UserError(
            f"tokenizer={kind} needs tiktoken's {name!r} file, which could not be loaded "
            f"({type(e).__name__}); "
            f"connect to the network once, or put the cached file in a folder named by TIKTOKEN_CACHE_DIR; "
            f"tokenizer=bpe works offline"
        ) from None
    return TiktokenTokenizer(kind, encoding)
