"""Where the text comes from: the corpora, read into documents and split train/val.

A small corpus is a list of `Document`s (one per file), read at once. Splitting happens here, by
document, so no validation text can leak into training: multi-file corpora are split by a stable hash
of each file's relative path, a single document (tiny-shakespeare, or one user file) by its tail.

    pystdlib     the running interpreter's standard library (*.py), present wherever Python is
    shakespeare  tiny-shakespeare (~1.1 MB), downloaded once into the cache and sha256-checked
    text         the user's own files, folders or globs
    files        parquet / jsonl / txt shards of any size, streamed (streaming.py)
"""

from __future__ import annotations

import hashlib
import logging
import os
import sysconfig
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minigpt.data.config import DataConfig
from minigpt.data.documents import SPLITS, Document, SourceMissing, collect_files, unit_hash, walk_files
from minigpt.data.streaming import StreamedCorpus
from minigpt.errors import UserError

log = logging.getLogger(__name__)

# karpathy/char-rnn's data/tinyshakespeare/input.txt: 1,115,394 bytes. The digest is the one many
# independent projects pin for this file; a download that does not match it is rejected.
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_FILE = "tinyshakespeare.txt"
DOWNLOAD_TIMEOUT_S = 30


@dataclass(frozen=True)
class Corpus:
    """A corpus small enough to hold: its documents read, split, and fingerprinted by their content."""

    train: list[Document]
    val: list[Document]

    def documents(self, split: str) -> Iterator[Document]:
        yield from getattr(self, split)

    def tagged_documents(self) -> Iterator[tuple[str, Document]]:
        """(split, document) for the whole corpus: train, then val."""
        for split in SPLITS:
            yield from ((split, d) for d in getattr(self, split))

    def fingerprint_lines(self) -> Iterator[str]:
        """What the cache key hashes: each document's split, name and a hash of its text."""
        for split, doc in self.tagged_documents():
            yield f"{split}\0{doc.name}\0{hashlib.sha256(doc.text.encode('utf-8')).hexdigest()}\n"

    def describe(self) -> dict[str, Any]:
        """meta.json's record of the corpus: every document's name and length."""
        files = {s: [{"name": d.name, "chars": len(d.text)} for d in getattr(self, s)] for s in SPLITS}
        return {"files": files}


def load_corpus(cfg: DataConfig, cache_root: Path) -> Corpus | StreamedCorpus:
    """The configured corpus: read and split now (pystdlib, shakespeare, text) or opened for streaming
    (files). Both kinds offer documents(split), tagged_documents(), fingerprint_lines() and describe()."""
    if cfg.source == "files":
        return StreamedCorpus.open(cfg)
    if cfg.source == "pystdlib":
        docs = read_pystdlib(cfg)
    elif cfg.source == "shakespeare":
        docs = [Document(SHAKESPEARE_FILE, read_shakespeare(cfg, cache_root))]
    else:
        docs = read_text_paths(cfg)
    if not docs:
        raise UserError(f"data={cfg.source} found no non-empty documents; check data.paths / data.exclude")
    return split_documents(docs, cfg.val_ratio)


# ---------------------------------------------------------------------------------------------
# Splitting


def split_documents(docs: list[Document], val_ratio: float) -> Corpus:
    """Split by document: a file is in val when the hash of its name falls below `val_ratio`.

    The hash keeps a file on the same side when other files are added or removed. With few
    files the threshold can leave a side empty, so the lowest (highest) hash is moved over.
    A single document is cut instead: its last `val_ratio` of characters, from a line start.
    """
    if len(docs) == 1:
        return _split_tail(docs[0], val_ratio)
    ranked = sorted(docs, key=lambda d: unit_hash(d.name))
    n_val = sum(unit_hash(d.name) < val_ratio for d in ranked)
    n_val = min(max(n_val, 1), len(docs) - 1)
    val_names = {d.name for d in ranked[:n_val]}
    # Keep the corpus' own (deterministic) order within each split.
    return Corpus(
        train=[d for d in docs if d.name not in val_names], val=[d for d in docs if d.name in val_names]
    )


def _split_tail(doc: Document, val_ratio: float) -> Corpus:
    cut = int(len(doc.text) * (1.0 - val_ratio))
    newline = doc.text.find("\n", cut)
    if newline != -1 and newline + 1 < len(doc.text):
        cut = newline + 1  # start val on a fresh line rather than mid-word
    if not 0 < cut < len(doc.text):
        raise UserError(f"{doc.name} is too short ({len(doc.text)} characters) to split into train and val")
    n = len(doc.text)
    return Corpus(
        train=[Document(f"{doc.name}[0:{cut}]", doc.text[:cut])],
        val=[Document(f"{doc.name}[{cut}:{n}]", doc.text[cut:])],
    )


# ---------------------------------------------------------------------------------------------
# pystdlib


def pystdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read_pystdlib(cfg: DataConfig, root: Path | None = None) -> list[Document]:
    """The standard library's *.py files in sorted path order, skipping `cfg.exclude` folders,
    files over `cfg.max_file_bytes`, empty files and the rare file that is not UTF-8."""
    root = root or pystdlib_root()
    exclude = set(cfg.exclude)
    docs = []
    for path in walk_files(root, exclude):
        if not path.name.endswith(".py") or path.stat().st_size > cfg.max_file_bytes:
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            log.info("skipping %s: not UTF-8", path)
            continue
        if text:
            docs.append(Document(path.relative_to(root).as_posix(), text))
    return docs


# ---------------------------------------------------------------------------------------------
# shakespeare


def read_shakespeare(cfg: DataConfig, cache_root: Path) -> str:
    """The cached tiny-shakespeare text, downloading it on first use."""
    path = cache_root / "downloads" / SHAKESPEARE_FILE
    if path.exists():
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == SHAKESPEARE_SHA256:
            return data.decode("utf-8")
        log.warning("%s does not match its sha256; downloading it again", path)
    data = _download(cfg.url, path)
    return data.decode("utf-8")


def _download(url: str, path: Path) -> bytes:
    log.info("downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except Exception as e:  # URLError, timeouts, HTTP errors, resets: all mean "not available now"
        raise SourceMissing(
            f"data=shakespeare could not download {url} ({type(e).__name__}: {e}); connect to the internet, "
            f"or save the file as {path}, or use data=pystdlib (offline) or data=text 'data.paths=[...]'"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise UserError(
            f"the file downloaded from {url} has sha256 {digest[:16]}..., "
            f"expected {SHAKESPEARE_SHA256[:16]}...; "
            "check data.url, or use data=pystdlib / data=text"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # atomic: a crash never leaves a truncated file under the real name
    return data


# ---------------------------------------------------------------------------------------------
# text


def read_text_paths(cfg: DataConfig) -> list[Document]:
    """The files of `cfg.paths` (see `collect_files`), one document each, named relative to the launch
    folder (`_display_name`)."""
    docs = []
    for f, _ in collect_files(cfg):
        name = _display_name(f)
        try:
            text = f.read_bytes().decode("utf-8", errors=cfg.encoding_errors)
        except UnicodeDecodeError as e:
            raise UserError(
                f"{name} is not UTF-8 text (bad byte at offset {e.start}); convert or remove it, "
                "or set data.encoding_errors=replace"
            ) from None
        if text:
            docs.append(Document(name, text))
    return docs


def _display_name(path: Path) -> str:
    """Relative to the launch folder when below it (so the split does not depend on where the
    project lives), absolute otherwise."""
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()
