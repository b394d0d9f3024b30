"""The on-disk token format: each split is a sequence of shard files, read back as one stream.

    train_000.bin, train_001.bin, ...   little-endian uint16 (vocabularies up to 65536 ids) or uint32 tokens,
    val_000.bin, ...                    `shard_tokens` per file, the last shard of a split holding the rest
    meta.json "shards"                  {split: [{"file", "tokens", "bytes", "sha256"}, ...]} in stream order

A split is the concatenation of its shards. Documents ([<|endoftext|>, tokens...]) and training or
evaluation windows run across shard boundaries, so the shard size changes files, never tokens or batches.

Content hash: sha256. Where the CPU has SHA instructions (x86 since ~2017 -- AMD Zen, Intel Goldmont/Ice
Lake -- and ARMv8 with crypto extensions) OpenSSL's sha256 runs on them and outpaces blake2b, which has no
hardware help and wins only on CPUs without SHA instructions (docs/performance.md); and sha256 is what the
rest of minigpt (fingerprints, the shakespeare download) and `sha256sum` already speak.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from minigpt.errors import UserError

DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}  # meta.json name -> on-disk dtype
HASH = "sha256"


def dtype_for(vocab_size: int) -> str:
    """The smallest dtype that holds every id: uint16 halves the files of any vocabulary up to 65536."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:03d}.bin"


class ShardWriter:
    """Appends tokens to `<split>_NNN.bin` files in `folder`, starting a new file every `shard_tokens`
    tokens, and hashes each file as it is written (no second read). `close()` returns the shard records."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        self.folder, self.split, self.shard_tokens = Path(folder), split, shard_tokens
        self.dtype_name, self.dtype = dtype, DTYPES[dtype]
        self.records: list[dict[str, Any]] = []
        self._file: BinaryIO | None = None
        self._hash = hashlib.new(HASH)
        self._in_shard = 0  # tokens in the open shard

    def write(self, tokens: np.ndarray) -> None:
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        while len(tokens):
            if self._file is None:  # opened lazily, so a split never ends with an empty shard
                # closed by _finish_shard, or by __exit__ on an error
                self._file = open(self.folder / shard_name(self.split, len(self.records)), "wb")  # noqa: SIM115
            take = min(len(tokens), self.shard_tokens - self._in_shard)
            block = memoryview(tokens[:take]).cast("B")
            self._file.write(block)
            self._hash.update(block)
            self._in_shard += take
            tokens = tokens[take:]
            if self._in_shard == self.shard_tokens:
                self._finish_shard()

    def close(self) -> list[dict[str, Any]]:
        if self._file is not None:
            self._finish_shard()
        return self.records

    def _finish_shard(self) -> None:
        assert self._file is not None
        self._file.close()
        self.records.append({
            "file": shard_name(self.split, len(self.records)), "tokens": self._in_shard,
            "bytes": self._in_shard * self.dtype.itemsize, HASH: self._hash.hexdigest(),
        })
        self._file, self._hash, self._in_shard = None, hashlib.new(HASH), 0

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:  # an error mid-write: close the file; the caller discards the folder
            self._file.close()


class TokenSplit:
    """One split of a prepared dataset: its shards memory-mapped and read as one stream of tokens.

    The OS pages the files in on demand and can drop those pages again, so even a split larger than RAM
    costs only what is being read.
    """

    def __init__(self, name: str, paths: list[Path], dtype: str):
        if not paths:
            raise ValueError(f"split {name!r} has no shards")
        self.name, self.paths, self.dtype = name, [Path(p) for p in paths], DTYPES[dtype]
        self.shards = [np.memmap(p, dtype=self.dtype, mode="r") for p in self.paths]
        # offsets[i] is the stream position of shard i's first token; offsets[-1] the split's length
        self.offsets = np.cumsum([0] + [len(s) for s in self.shards])

    @classmethod
    def open(cls, folder: Path, split: str, meta: dict[str, Any]) -> TokenSplit:
        """The split as meta.json lists it; a shard that is missing or not the size recorded is a UserError
        (the OS would map a truncated file without complaint, and an odd size would raise in numpy)."""
        folder = Path(folder)
        paths = []
        for record in meta["shards"][split]:
            path = folder / record["file"]
            size = path.stat().st_size if path.is_file() else None
            if size != record["bytes"]:
                found = "is missing" if size is None else f"has {size} bytes"
                raise UserError(f"{path} {found}, meta.json records {record['bytes']}: the prepared data is "
                                "damaged; run the command again to rebuild it")
            paths.append(path)
        return cls(split, paths, meta["dtype"])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """tokens[start : start + length] of the stream, (length,) in the file dtype, across shards."""
        if not 0 <= start <= start + length <= len(self):
            raise IndexError(f"tokens [{start}, {start + length}) are outside {self.name}'s {len(self)}")
        shard = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pieces = []
        while length > 0:
            local = start - int(self.offsets[shard])
            piece = self.shards[shard][local : local + length]
            pieces.append(piece)
            start, length, shard = start + len(piece), length - len(piece), shard + 1
        if len(pieces) == 1:
            return np.array(pieces[0])  # a copy in memory, not a view that keeps the map busy
        return np.concatenate(pieces) if pieces else np.empty(0, self.dtype)
