"""The two tokenizers without merges: one id per character, or one id per UTF-8 byte.

Both put `<|endoftext|>` last, like the bpe tokenizer, so `eot_id == vocab_size - 1` everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from minigpt.data.tokenizers.base import EOT, Tokenizer
from minigpt.errors import UserError


class CharTokenizer(Tokenizer):
    """Id i is the i-th distinct character of the corpus in code-point order; the corpus is the
    whole of it (train and val), so preparing never meets an unknown character. Generation can."""

    kind = "char"

    def __init__(self, chars: Sequence[str]):
        if any(len(c) != 1 for c in chars) or list(chars) != sorted(set(chars)):
            raise ValueError("chars must be distinct single characters in code-point order")
        self.chars = list(chars)
        self.name = f"char-{len(self.chars)}"
        self.vocab_size = len(self.chars) + 1
        self.eot_id = len(self.chars)
        self._codepoints = np.array([ord(c) for c in self.chars], dtype=np.uint32)  # sorted
        self._itos = [*self.chars, EOT]

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> CharTokenizer:
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        return cls(sorted(seen))

    def encode(self, text: str) -> list[int]:
        # Vectorised lookup: the text as UTF-32 code points, each found by binary search in the
        # sorted vocabulary, in numpy: many times faster than a Python dict lookup per character.
        codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        ids = np.searchsorted(self._codepoints, codes)
        known = ids < len(self.chars)
        known[known] = self._codepoints[ids[known]] == codes[known]
        if not known.all():
            c = chr(int(codes[np.argmin(known)]))
            raise UserError(
                f"character {c!r} (U+{ord(c):04X}) is not in the char tokenizer's vocabulary "
                f"({len(self.chars)} characters, those of its corpus); remove it or use tokenizer=byte or bpe"
            )
        return ids.tolist()

    def _decode(self, ids: list[int]) -> str:
        return "".join(self._itos[i] for i in ids)

    def token_byte_lengths(self) -> np.ndarray:
        # surrogatepass: a lone surrogate (possible only in a hand-made vocabulary) counts its 3 bytes
        return np.array([len(c.encode("utf-8", "surrogatepass")) for c in self.chars] + [0], dtype=np.int64)

    def _spec(self, folder: Path) -> dict[str, Any]:
        return {"chars": self.chars}

    @classmethod
    def from_spec(cls, folder: Path, spec: dict[str, Any]) -> CharTokenizer:
        return cls(spec["chars"])


class ByteTokenizer(Tokenizer):
    """Ids 0..255 are the UTF-8 bytes, 256 is `<|endoftext|>`. Any text encodes."""

    kind = "byte"
    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def _decode(self, ids: list[int]) -> str:
        # Decode the bytes between end-of-text ids; a model can emit a byte sequence that is not
        # valid UTF-8, which becomes U+FFFD rather than an exception mid-generation.
        pieces, run = [], bytearray()
        for i in ids:
            if i == self.eot_id:
                pieces += [run.decode("utf-8", errors="replace"), EOT]
                run = bytearray()
            else:
                run.append(i)
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)

    def token_byte_lengths(self) -> np.ndarray:
        return np.array([1] * 256 + [0], dtype=np.int64)  # one byte per id, none for <|endoftext|>

    def _spec(self, folder: Path) -> dict[str, Any]:
        return {}

    @classmethod
    def from_spec(cls, folder: Path, spec: dict[str, Any]) -> ByteTokenizer:
        return cls()
