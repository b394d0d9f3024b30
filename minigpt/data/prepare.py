"""Text -> tokenizer -> flat token files, cached by a fingerprint of everything that shapes them.

A prepared dataset is a folder `<cache_root>/<source>-<tokenizer>-<fingerprint[:12]>/`:

    train.bin, val.bin   every document as [<|endoftext|>, its tokens...], concatenated; little-endian
                         uint16 when the vocabulary fits (vocab_size <= 65536), else uint32
    tokenizer/           the tokenizer's files (`load_tokenizer`), copied into every checkpoint
    meta.json            corpus, files and sizes, token counts, tokenizer, dtype, fingerprint, timings

The fingerprint hashes the tokenizer settings and the exact documents of each split (names and
content), so any change to the corpus or its settings gets a fresh folder, and an unchanged one
is reused at once. The folder is built under a temporary name and renamed when complete: an
interrupted prepare leaves no half dataset (and two processes racing simply both finish).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.sources import Corpus, Document, load_corpus
from minigpt.data.tokenizers import Tokenizer, build_tokenizer, load_tokenizer
from minigpt.errors import UserError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
META_FILE = "meta.json"
TOKENIZER_DIR = "tokenizer"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}  # meta.json name -> on-disk dtype
ENCODE_CHUNK_CHARS = 4_000_000  # documents per encode_batch call: enough for every thread, bounded memory


@dataclass
class PreparedData:
    """A prepared dataset folder, opened."""

    dir: Path
    meta: dict[str, Any]
    tokenizer: Tokenizer

    @property
    def train_path(self) -> Path:
        return self.dir / "train.bin"

    @property
    def val_path(self) -> Path:
        return self.dir / "val.bin"

    @property
    def tokenizer_dir(self) -> Path:
        return self.dir / TOKENIZER_DIR

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def prepare_dataset(
    data_cfg: DataConfig,
    tokenizer_cfg: TokenizerConfig,
    cache_root: Path | None = None,
    *,
    progress: bool = True,
) -> PreparedData:
    """Prepare (or reuse) the token files for this corpus and tokenizer.

    `cache_root` defaults to `data_cfg.cache_dir`. In distributed training call this on rank 0
    first and on the other ranks after a barrier: they then find the finished folder.
    """
    cache_root = Path(cache_root if cache_root is not None else data_cfg.cache_dir)
    t0 = time.perf_counter()
    corpus = load_corpus(data_cfg, cache_root)
    fingerprint = _fingerprint(corpus, tokenizer_cfg)
    final = cache_root / f"{data_cfg.source}-{tokenizer_cfg.kind}-{fingerprint[:12]}"
    t_collect = time.perf_counter() - t0
    if (final / META_FILE).is_file():
        log.info("reusing prepared data in %s", final)
        return load_prepared(final)

    tmp = cache_root / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        meta = _build(tmp, corpus, data_cfg, tokenizer_cfg, progress=progress)
        meta["fingerprint"] = fingerprint
        meta["timings_s"]["collect"] = round(t_collect, 3)
        meta["timings_s"]["total"] = round(time.perf_counter() - t0, 3)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if final.is_dir() and not (final / META_FILE).is_file():
                raise UserError(f"{final} is incomplete (no {META_FILE}); delete it and run again") from None
            if not final.is_dir():
                raise
            # else: another process (e.g. another rank) finished the same dataset first; use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(
        "prepared %s: %d train + %d val tokens in %.1f s",
        final, meta["tokens"]["train"], meta["tokens"]["val"], meta["timings_s"]["total"],
    )
    return load_prepared(final)


def load_prepared(folder: Path) -> PreparedData:
    """Open a folder written by `prepare_dataset`."""
    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise UserError(f"{folder} is not a prepared dataset (no {META_FILE}); run scripts/prepare_data.py")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(
            f"{meta_path} has format_version {meta.get('format_version')}, "
            f"this minigpt reads {FORMAT_VERSION}; "
            f"delete {folder} and prepare again"
        )
    return PreparedData(folder, meta, load_tokenizer(folder / TOKENIZER_DIR))


def _fingerprint(corpus: Corpus, tokenizer_cfg: TokenizerConfig) -> str:
    """sha256 over the format, the tokenizer settings that change ids, and each split's documents."""
    h = hashlib.sha256()
    settings: dict[str, Any] = {"format_version": FORMAT_VERSION, "tokenizer": tokenizer_cfg.kind}
    if tokenizer_cfg.kind == "bpe":
        settings |= {"vocab_size": tokenizer_cfg.bpe_vocab_size, "train_chars": tokenizer_cfg.train_chars}
    h.update(json.dumps(settings, sort_keys=True).encode())
    for split, docs in (("train", corpus.train), ("val", corpus.val)):
        for doc in docs:
            text_hash = hashlib.sha256(doc.text.encode("utf-8")).hexdigest()
            h.update(f"{split}\0{doc.name}\0{text_hash}\n".encode())
    return h.hexdigest()


def _build(
    folder: Path, corpus: Corpus, data_cfg: DataConfig, tokenizer_cfg: TokenizerConfig, *, progress: bool
) -> dict[str, Any]:
    """Train/obtain the tokenizer, write both bins; return meta.json's content (minus fingerprint)."""
    t0 = time.perf_counter()
    # bpe learns only from train (val must be unseen); char needs every character it will meet.
    learn_from = corpus.train if tokenizer_cfg.kind == "bpe" else corpus.train + corpus.val
    tokenizer = build_tokenizer(tokenizer_cfg, (d.text for d in learn_from))
    tokenizer.save(folder / TOKENIZER_DIR)
    t_tok = time.perf_counter() - t0

    dtype_name = "uint16" if tokenizer.vocab_size <= 2**16 else "uint32"
    tokens, chars = {}, {}
    t0 = time.perf_counter()
    for split, docs in (("train", corpus.train), ("val", corpus.val)):
        tokens[split] = write_tokens(
            folder / f"{split}.bin", docs, tokenizer, DTYPES[dtype_name], data_cfg.num_threads, progress
        )
        chars[split] = sum(len(d.text) for d in docs)
    t_enc = time.perf_counter() - t0
    mb = sum(len(d.text.encode("utf-8")) for d in corpus.train + corpus.val) / 1e6
    return {
        "format_version": FORMAT_VERSION,
        "source": data_cfg.source,
        "layout": "each document is <|endoftext|> followed by its tokens; documents concatenated",
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": dtype_name,
        "tokens": tokens,
        "chars": chars,
        "tokenizer": {"kind": tokenizer.kind, "name": tokenizer.name, "dir": TOKENIZER_DIR},
        "files": {
            "train": [{"name": d.name, "chars": len(d.text)} for d in corpus.train],
            "val": [{"name": d.name, "chars": len(d.text)} for d in corpus.val],
        },
        "config": {"data": asdict(data_cfg), "tokenizer": asdict(tokenizer_cfg)},
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "timings_s": {"tokenizer": round(t_tok, 3), "encode": round(t_enc, 3)},
        "encode_mb_per_s": round(mb / max(t_enc, 1e-9), 2),
    }


def write_tokens(
    path: Path, docs: list[Document], tokenizer: Tokenizer, dtype: np.dtype, num_threads: int, progress: bool
) -> int:
    """Encode `docs` in chunks and append [eot, tokens...] per document to `path`; return the count."""
    n_tokens = 0
    total = sum(len(d.text) for d in docs)
    # disable=None: show the bar only on a terminal, so logs and CI output stay free of it.
    disable = None if progress else True
    bar = tqdm(total=total, unit="char", unit_scale=True, desc=f"encode {path.stem}", disable=disable)
    with open(path, "wb") as f, bar:
        for chunk in _chunks(docs, ENCODE_CHUNK_CHARS):
            for ids in tokenizer.encode_batch([d.text for d in chunk], num_threads=num_threads):
                row = np.empty(len(ids) + 1, dtype=dtype)
                row[0] = tokenizer.eot_id
                row[1:] = ids
                f.write(row.tobytes())
                n_tokens += len(row)
            bar.update(sum(len(d.text) for d in chunk))
    return n_tokens


def _chunks(docs: list[Document], max_chars: int) -> list[list[Document]]:
    chunks: list[list[Document]] = [[]]
    size = 0
    for doc in docs:
        if chunks[-1] and size + len(doc.text) > max_chars:
            chunks.append([])
            size = 0
        chunks[-1].append(doc)
        size += len(doc.text)
    return chunks
