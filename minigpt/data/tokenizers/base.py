"""The one interface every tokenizer offers, and how tokenizers are written to disk.

    tok.encode(text) -> list[int]        plain text; "<|endoftext|>" typed in the text stays text
    tok.decode(ids) -> str               the end-of-text id decodes to "<|endoftext|>"
    tok.eot_id, tok.vocab_size, tok.kind, tok.name
    tok.token_byte_lengths() -> (V,)     UTF-8 bytes of each id's text; 0 for <|endoftext|> (bits per byte)
    tok.save(folder)                     tokenizer.json (+ kind-specific files); load_tokenizer(folder)

Specials are never produced by `encode`: a corpus that happens to contain the marker's spelling
must not be able to forge a document boundary. Code that wants a boundary adds `eot_id` itself.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

EOT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_FORMAT_VERSION = 1


class Tokenizer(ABC):
    """Text <-> token ids. `vocab_size` counts every id including `eot_id` (ids are 0..vocab_size-1)."""

    kind: str  # bpe | gpt2 | cl100k | char | byte
    name: str  # readable, e.g. "bpe-4096" or "cl100k_base"
    vocab_size: int
    eot_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def _decode(self, ids: list[int]) -> str: ...

    @abstractmethod
    def token_byte_lengths(self) -> np.ndarray:
        """(V,) int64: how many UTF-8 bytes of text each id stands for, so the bytes a sequence of ids
        decodes to is the sum of their entries. Special tokens such as <|endoftext|> count 0: they are
        document boundaries, not text of the corpus. Byte-level tokens that hold part of a multi-byte
        character count the bytes they hold, so a character split over tokens still sums to its length.
        Bits per byte (a loss every tokenizer can be compared on) divides the nats by ln 2 and this sum."""

    @abstractmethod
    def _spec(self, folder: Path) -> dict[str, Any]:
        """Write any extra files into `folder`; return the kind-specific entries of tokenizer.json."""

    def encode_batch(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
        """Encode many texts; tiktoken-backed kinds do this on `num_threads` threads (0 = all cores)."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids (a list, or a 1-d tensor/array) back to text. Invalid UTF-8 becomes U+FFFD."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if ids and not 0 <= min(ids) <= max(ids) < self.vocab_size:
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise ValueError(f"token id {bad} is outside {self.name}'s vocabulary 0..{self.vocab_size - 1}")
        return self._decode(ids)

    def save(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        spec = {
            "format_version": TOKENIZER_FORMAT_VERSION,
            "kind": self.kind,
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eot_id": self.eot_id,
            **self._spec(folder),
        }
        (folder / TOKENIZER_FILE).write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"
