"""Tokenizers: one interface (`Tokenizer`), five kinds, saved and loaded from a folder.

    bpe      byte-level BPE trained on the corpus with rustbpe, run by tiktoken (the default)
    gpt2     tiktoken's GPT-2 encoding (50257 ids)      } need tiktoken's file: network or
    cl100k   tiktoken's cl100k_base (GPT-4, 100277 ids)  } a populated TIKTOKEN_CACHE_DIR
    char     one id per distinct corpus character
    byte     one id per UTF-8 byte (257 ids)

Read in this order:
    base.py           the interface every kind offers, and the tokenizer.json a folder holds
    simple.py         char and byte: the two without merges
    tiktoken_bpe.py   bpe, gpt2 and cl100k: byte-level BPE run by tiktoken (bpe trained with rustbpe)
and this file: `build_tokenizer` (a config -> a tokenizer) and `load_tokenizer` (a folder -> the tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from minigpt.data.config import TokenizerConfig
from minigpt.data.tokenizers.base import EOT, TOKENIZER_FILE, TOKENIZER_FORMAT_VERSION, Tokenizer
from minigpt.data.tokenizers.simple import ByteTokenizer, CharTokenizer
from minigpt.data.tokenizers.tiktoken_bpe import TiktokenTokenizer, named_tokenizer, train_bpe
from minigpt.errors import UserError

__all__ = [
    "EOT",
    "ByteTokenizer",
    "CharTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "build_tokenizer",
    "load_tokenizer",
]


def build_tokenizer(cfg: TokenizerConfig, texts: Iterable[str] = ()) -> Tokenizer:
    """Make the configured tokenizer. `texts` is what it learns from: bpe merges are learned from
    them (pass the train split), char takes its alphabet from them (pass the whole corpus);
    gpt2 / cl100k / byte ignore them."""
    if cfg.kind == "bpe":
        return train_bpe(texts, cfg.bpe_vocab_size, cfg.train_chars)
    if cfg.kind == "char":
        return CharTokenizer.from_texts(texts)
    if cfg.kind == "byte":
        return ByteTokenizer()
    return named_tokenizer(cfg.kind)


def load_tokenizer(folder: Path) -> Tokenizer:
    """The tokenizer `Tokenizer.save(folder)` wrote, exactly (no network, no retraining)."""
    folder = Path(folder)
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(
            f"no {TOKENIZER_FILE} in {folder}; point to a prepared dataset's or checkpoint's tokenizer/"
        )
    spec = json.loads(path.read_text(encoding="utf-8"))
    version = spec.get("format_version")
    if version != TOKENIZER_FORMAT_VERSION:
        raise UserError(
            f"{path} has tokenizer format_version {version}, this minigpt reads {TOKENIZER_FORMAT_VERSION}; "
            "re-prepare the data or use a matching minigpt"
        )
    kind = spec["kind"]
    if kind in ("bpe", "gpt2", "cl100k"):
        return TiktokenTokenizer.from_spec(folder, spec)
    if kind == "char":
        return CharTokenizer.from_spec(folder, spec)
    if kind == "byte":
        return ByteTokenizer.from_spec(folder, spec)
    raise UserError(f"{path} names an unknown tokenizer kind {kind!r}")
