"""data=files: corpora larger than memory, read a document at a time from local parquet / jsonl / text files.

A file's name decides how it is read:

    *.parquet              one document per row of the `data.text_key` column (pyarrow; a record batch of
                           BATCH_ROWS rows in memory at a time)
    *.jsonl, *.jsonl.gz    one document per line, a JSON object whose `data.text_key` field is the text
    anything else          the whole file is one document (UTF-8 text), so one such file must fit in memory

Nothing else is held: `prepare` streams the documents straight into the encoder and the shard files.

**Split.** Document i of file f is in val when `unit_hash(f"{f}#{i}") < data.val_ratio`, where f is the
file's path relative to the folder its `data.paths` entry names. That is decided while streaming, for each
document alone, so it needs no second pass; it stays the same when files are added or the corpus moves to
another folder (or to another node's local disk); and a long file still gives val documents. Empty and null
texts are skipped, but still count in i, so they never shift the split of the others.

**Fingerprint.** The names, byte sizes and modification times of the files plus the settings that shape the
documents: no pass over the content, so reusing a 100 GB corpus' cache costs a `stat` per file. Anything
that rewrites a file changes its mtime; editing one in place and then restoring its size and mtime would go
unnoticed (delete the cache folder then).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minigpt.data.config import DataConfig
from minigpt.data.documents import Document, collect_files, unit_hash
from minigpt.errors import UserError

BATCH_ROWS = 1024  # parquet rows decoded at a time: a few MB of text for web-sized documents
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass(frozen=True)
class SourceFile:
    path: Path  # absolute
    name: str  # relative to its data.paths entry's folder: what the split hashes
    bytes: int
    mtime_ns: int


@dataclass(frozen=True)
class StreamedCorpus:
    """The files of a `data=files` corpus, opened for streaming (nothing is read until iterated)."""

    files: list[SourceFile]
    text_key: str
    val_ratio: float
    encoding_errors: str

    @classmethod
    def open(cls, cfg: DataConfig) -> StreamedCorpus:
        files = []
        for path, root in collect_files(cfg):
            st = path.stat()
            files.append(SourceFile(path, path.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
        return cls(files, cfg.text_key, cfg.val_ratio, cfg.encoding_errors)

    def tagged_documents(self) -> Iterator[tuple[str, Document]]:
        """(split, document) for every non-empty document, in file order, then row order."""
        for f in self.files:
            for i, text in enumerate(self._records(f)):
                if text:
                    name = f"{f.name}#{i}"
                    yield ("val" if unit_hash(name) < self.val_ratio else "train"), Document(name, text)
            if _stat(f.path) != (f.bytes, f.mtime_ns):  # the fingerprint would no longer describe the tokens
                raise UserError(f"{f.path} changed while it was being read; run the command again")

    def documents(self, split: str) -> Iterator[Document]:
        return (doc for s, doc in self.tagged_documents() if s == split)

    def fingerprint_lines(self) -> Iterator[str]:
        settings = {"text_key": self.text_key, "val_ratio": self.val_ratio, "errors": self.encoding_errors}
        yield json.dumps(settings, sort_keys=True) + "\n"
        for f in self.files:
            yield f"{f.name}\0{f.bytes}\0{f.mtime_ns}\n"

    def describe(self) -> dict[str, Any]:
        """meta.json's record of the corpus: its files (listing millions of documents would not help)."""
        sources = [{"name": f.name, "path": str(f.path), "bytes": f.bytes, "mtime_ns": f.mtime_ns}
                   for f in self.files]
        return {"sources": sources}

    def _records(self, f: SourceFile) -> Iterator[str | None]:
        if f.path.name.endswith(".parquet"):
            return _parquet_texts(f.path, self.text_key)
        if f.path.name.endswith(JSONL_SUFFIXES):
            return _jsonl_texts(f.path, self.text_key, self.encoding_errors)
        return iter([_whole_file(f.path, self.encoding_errors)])


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _whole_file(path: Path, errors: str) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (bad byte at offset {e.start}); convert or remove it, "
                        "or set data.encoding_errors=replace") from None
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror or e}); restore it or remove it from data.paths"
                        ) from None


def _jsonl_texts(path: Path, key: str, errors: str) -> Iterator[str | None]:
    """Each line's `key` field (None for blank lines and null texts). Lines are decoded one by one, so a
    bad byte is reported on its own line."""
    opener = gzip.open if path.name.endswith(".gz") else open
    lineno = 0
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                line = raw.decode("utf-8", errors=errors)
                yield _field(json.loads(line), key, path, lineno) if line.strip() else None
    except UnicodeDecodeError:
        raise UserError(f"{path} line {lineno} is not UTF-8; fix the file or set "
                        "data.encoding_errors=replace") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} line {lineno} is not JSON ({e.msg} at column {e.colno}); "
                        "each line of a .jsonl file must be one JSON object") from None
    except (OSError, EOFError) as e:  # a damaged or truncated gzip stream
        raise UserError(f"{path} cannot be read ({type(e).__name__}: {e}); replace or remove the file"
                        ) from None


def _field(record: Any, key: str, path: Path, lineno: int) -> str | None:
    if not isinstance(record, dict):
        raise UserError(f"{path} line {lineno} is a JSON {type(record).__name__}, not an object with a "
                        f"{key!r} field")
    if key not in record:
        fields = ", ".join(list(record)[:8])
        raise UserError(f"{path} line {lineno} has no {key!r} field (it has: {fields}); "
                        "set data.text_key to the field that holds the text")
    text = record[key]
    if text is not None and not isinstance(text, str):
        raise UserError(f"{path} line {lineno}: field {key!r} is a {type(text).__name__}, not text; "
                        "set data.text_key to the field that holds the text")
    return text


def _parquet_texts(path: Path, key: str) -> Iterator[str | None]:
    """Each row's `key` column (None for nulls), a record batch at a time."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"reading {path} needs pyarrow: pip install -e '.[data]' (or pip install pyarrow)"
                        ) from None
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        if key not in schema.names:
            raise UserError(f"{path} has no column {key!r} (it has: {', '.join(schema.names[:8])}); "
                            "set data.text_key to the column that holds the text")
        kind = schema.field(key).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise UserError(f"{path}: column {key!r} holds {kind}, not text; "
                            "set data.text_key to a text column")
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[key]):
            yield from batch.column(0).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path} is not a readable parquet file ({type(e).__name__}: {e}); "
                        "replace or remove it") from None

