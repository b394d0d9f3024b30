"""Text -> tokenizer -> sharded token files, cached by a fingerprint of everything that shapes them.

A prepared dataset is a folder `<cache_root>/<source>-<tokenizer>-<fingerprint[:12]>/`:

    train_000.bin, ...   every document as [<|endoftext|>, its tokens...], concatenated and cut into shards of
    val_000.bin, ...     data.shard_tokens tokens (shards.py: the format, and why sha256)
    tokenizer/           the tokenizer's files (`load_tokenizer`), copied into every checkpoint
    meta.json            each split's shards (tokens, bytes, sha256), the tokenizer files' sha256, the dtype,
                         token / document / character / byte counts, the corpus, settings and timings
    verified.json        when each shard was last hashed (verify.py)

The fingerprint of a corpus read whole (pystdlib, shakespeare, text) hashes the exact documents of each
split (names and a hash of their content); that of a streamed one (files) hashes its files' names, sizes
and mtimes instead, so it costs no pass over the data (streaming.py). Both add the tokenizer settings and
the format version. Any change gets a fresh folder; an unchanged one is verified and reused.

A damaged folder (verify.py) is rebuilt, with one warning: it is derived data. When the corpus itself is
gone (files deleted, shakespeare offline and not downloaded), an intact folder prepared earlier with the
same settings is used, with a warning; a damaged one stops with one line, as nothing could rebuild it.

Concurrency: the folder is built under a temporary name and renamed when complete, so an interrupted
prepare leaves nothing behind, and processes preparing the same dataset at once (ranks, nodes sharing a
filesystem, two jobs) all end with the same intact folder: the first rename wins, the others find an
intact folder and drop their copy. A damaged folder is moved aside before its replacement is renamed in;
jobs that have its shards mapped keep reading them (POSIX keeps a moved or deleted file alive while open).

An interrupted prepare (Ctrl-C, SIGTERM: minigpt/signals.py) removes its temporary folder on the way out;
one killed outright (SIGKILL) cannot, so every prepare first sweeps the cache of the temporaries of processes
that are gone (temporaries.py).

A write that fails (a full disk, a file size limit) ends with one line naming the dataset folder that was
being prepared, and leaves no temporary folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.documents import SPLITS, SourceMissing
from minigpt.data.encode import encode_corpus
from minigpt.data.shards import HASH, ShardWriter, TokenSplit, dtype_for
from minigpt.data.sources import Corpus, load_corpus
from minigpt.data.streaming import StreamedCorpus
from minigpt.data.temporaries import remove_dead_temporaries, temporary_name
from minigpt.data.tokenizers import Tokenizer, build_tokenizer, load_tokenizer
from minigpt.data.verify import META_FILE, TOKENIZER_DIR, find_damage, folder_digests, read_meta, stamp_now
from minigpt.errors import UserError

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: sharded bins with sizes and hashes in meta.json (1: one train.bin / val.bin)
# Settings that change files or speed, never tokens: left out of the fingerprint and the config key.
NOT_SHAPING = ("cache_dir", "num_workers", "shard_tokens", "verify")


@dataclass
class PreparedData:
    """A prepared dataset folder, opened."""

    dir: Path
    meta: dict[str, Any]
    tokenizer: Tokenizer

    def split(self, name: str) -> TokenSplit:
        """The `train` or `val` tokens as one stream over their shards (memory-mapped, sizes checked)."""
        return TokenSplit.open(self.dir, name, self.meta)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


@dataclass(frozen=True)
class GivenTokenizer:
    """A tokenizer handed to `prepare_dataset` instead of a config (fine-tuning: the source checkpoint's).

    It is identified in the fingerprint by the sha256 of the files it saves, so data tokenised by two
    different tokenizers of one kind never share a cache folder.
    """

    tokenizer: Tokenizer
    digest: str

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> GivenTokenizer:
        h = hashlib.sha256()
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save(Path(tmp))
            for f in sorted(Path(tmp).rglob("*")):
                if f.is_file():
                    h.update(f"{f.relative_to(tmp).as_posix()}\0".encode() + f.read_bytes())
        return cls(tokenizer, h.hexdigest())

    @property
    def kind(self) -> str:
        return self.tokenizer.kind


class CorpusChanged(UserError):
    """The corpus' fingerprint is not the one expected (a resumed run's checkpoint recorded another)."""

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"the corpus changed: fingerprint {expected[:12]} expected, {found[:12]} found")
        self.expected, self.found = expected, found


def prepare_dataset(
    data_cfg: DataConfig,
    tokenizer_cfg: TokenizerConfig | GivenTokenizer,
    cache_root: Path | None = None,
    *,
    progress: bool = True,
    expect_fingerprint: str | None = None,
) -> PreparedData:
    """Prepare (or verify and reuse) the token shards for this corpus and tokenizer.

    `tokenizer_cfg` is the tokenizer to build, or a `GivenTokenizer` to use as it is. `cache_root`
    defaults to `data_cfg.cache_dir`. In distributed training call this on rank 0 first and on the other
    ranks after a barrier: they then find the finished folder. `expect_fingerprint`: raise CorpusChanged,
    before anything is built, if the corpus is not that one (a resumed run's).
    """
    cache_root = Path(cache_root if cache_root is not None else data_cfg.cache_dir)
    t0 = time.perf_counter()
    remove_dead_temporaries(cache_root)
    try:
        corpus = load_corpus(data_cfg, cache_root)
    except SourceMissing as missing:
        return _reuse_without_sources(cache_root, data_cfg, tokenizer_cfg, missing)
    fingerprint = _fingerprint(corpus, tokenizer_cfg)
    if expect_fingerprint is not None and fingerprint != expect_fingerprint:
        raise CorpusChanged(expect_fingerprint, fingerprint)
    final = cache_root / f"{data_cfg.source}-{tokenizer_cfg.kind}-{fingerprint[:12]}"
    t_collect = time.perf_counter() - t0
    if final.exists():
        damage = _damage(final, data_cfg.verify)
        if damage is None:
            log.info("reusing prepared data in %s", final)
            return load_prepared(final)
        log.warning("the prepared data in %s is damaged (%s); rebuilding it", final, damage)

    tmp = temporary_name(final, ".tmp")
    try:
        tmp.mkdir(parents=True)
        meta = _build(tmp, corpus, data_cfg, tokenizer_cfg, progress=progress)
        meta |= {"fingerprint": fingerprint, "config_key": config_key(data_cfg, tokenizer_cfg)}
        meta["timings_s"] |= {"collect": round(t_collect, 3), "total": round(time.perf_counter() - t0, 3)}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        stamp_now(tmp, meta)
        won = _publish(tmp, final, data_cfg.verify)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.filename is not None and not Path(os.fsdecode(e.filename)).is_relative_to(tmp):
            raise
        # a failed write into the temporary folder: name the folder it was for (the temporary is gone)
        raise OSError(e.errno, e.strerror, str(final)) from None
    except BaseException:  # Ctrl-C, SIGTERM, a bad document: nothing half-built stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if won:
        log.info("prepared %s: %d train + %d val tokens in %.1f s",
                 final, meta["tokens"]["train"], meta["tokens"]["val"], meta["timings_s"]["total"])
    else:
        log.info("another process prepared %s first; using it", final)
    return load_prepared(final)


def load_prepared(folder: Path) -> PreparedData:
    """Open a folder written by `prepare_dataset` (its shards are opened, and their sizes checked, by
    `PreparedData.split`; `prepare_dataset` verifies their content)."""
    folder = Path(folder)
    meta, problem = read_meta(folder, FORMAT_VERSION)
    if meta is None:
        raise UserError(f"{folder} is not a prepared dataset of this minigpt ({problem}); "
                        "prepare it again (scripts/prepare_data.py)")
    return PreparedData(folder, meta, load_tokenizer(folder / TOKENIZER_DIR))


def config_key(data_cfg: DataConfig, tokenizer_cfg: TokenizerConfig | GivenTokenizer) -> str:
    """A hash of the settings alone (no corpus content): how a cache is found when its corpus is gone."""
    data = {k: v for k, v in asdict(data_cfg).items() if k not in NOT_SHAPING}
    data["paths"] = [os.path.abspath(os.path.expanduser(p)) for p in data_cfg.paths]
    key = {"format_version": FORMAT_VERSION, "data": data, "tokenizer": _tokenizer_settings(tokenizer_cfg)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _tokenizer_settings(tokenizer_cfg: TokenizerConfig | GivenTokenizer) -> dict[str, Any]:
    if isinstance(tokenizer_cfg, GivenTokenizer):
        return {"tokenizer": tokenizer_cfg.kind, "given_sha256": tokenizer_cfg.digest}
    settings: dict[str, Any] = {"tokenizer": tokenizer_cfg.kind}
    if tokenizer_cfg.kind == "bpe":
        settings |= {"vocab_size": tokenizer_cfg.bpe_vocab_size, "train_chars": tokenizer_cfg.train_chars}
    return settings


def _fingerprint(corpus: Corpus | StreamedCorpus, tokenizer_cfg: TokenizerConfig | GivenTokenizer) -> str:
    """sha256 over the format, the tokenizer settings that change ids, and the corpus' own lines."""
    h = hashlib.sha256()
    h.update(json.dumps({"format_version": FORMAT_VERSION, **_tokenizer_settings(tokenizer_cfg)},
                        sort_keys=True).encode())
    for line in corpus.fingerprint_lines():
        h.update(line.encode("utf-8"))
    return h.hexdigest()


def _damage(folder: Path, verify: str) -> str | None:
    meta, problem = read_meta(folder, FORMAT_VERSION)
    return problem if meta is None else find_damage(folder, meta, verify)


def _build(
    folder: Path, corpus: Corpus | StreamedCorpus, data_cfg: DataConfig,
    tokenizer_cfg: TokenizerConfig | GivenTokenizer,
    *, progress: bool,
) -> dict[str, Any]:
    """Train/obtain the tokenizer, write both splits' shards; return meta.json's content (minus keys)."""
    t0 = time.perf_counter()
    # bpe learns only from train (val must be unseen); char needs every character it will meet.
    if tokenizer_cfg.kind == "bpe":
        learn_from = (d.text for d in corpus.documents("train"))
    else:
        learn_from = (d.text for _, d in corpus.tagged_documents())
    if isinstance(tokenizer_cfg, GivenTokenizer):
        tokenizer = tokenizer_cfg.tokenizer
    else:
        tokenizer = build_tokenizer(tokenizer_cfg, learn_from)
    tokenizer.save(folder / TOKENIZER_DIR)
    t_tok = time.perf_counter() - t0

    t0 = time.perf_counter()
    dtype = dtype_for(tokenizer.vocab_size)
    writers = {split: ShardWriter(folder, split, dtype, data_cfg.shard_tokens) for split in SPLITS}
    total = sum(len(d.text) for _, d in corpus.tagged_documents()) if isinstance(corpus, Corpus) else None
    counts = encode_corpus(corpus.tagged_documents(), tokenizer, folder / TOKENIZER_DIR, writers,
                           num_workers=data_cfg.num_workers, progress=progress, total_chars=total)
    shards = {split: writer.close() for split, writer in writers.items()}
    t_enc = time.perf_counter() - t0
    for split in SPLITS:
        if not counts[split].documents:
            raise UserError(f"data={data_cfg.source} gave no {split} documents with data.val_ratio="
                            f"{data_cfg.val_ratio}; change data.val_ratio or add documents")
    tokenizer_files = folder_digests(folder / TOKENIZER_DIR)
    n_bytes = sum(c.bytes for c in counts.values())
    return {
        "format_version": FORMAT_VERSION,
        "source": data_cfg.source,
        "layout": "each document is <|endoftext|> followed by its tokens; documents concatenated; "
                  "a split is its shards concatenated in the order listed",
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": dtype,
        "hash": HASH,
        "shards": shards,
        "tokens": {split: sum(r["tokens"] for r in shards[split]) for split in SPLITS},
        "documents": {split: counts[split].documents for split in SPLITS},
        "chars": {split: counts[split].chars for split in SPLITS},
        "bytes": {split: counts[split].bytes for split in SPLITS},
        "tokenizer": {"kind": tokenizer.kind, "name": tokenizer.name, "dir": TOKENIZER_DIR,
                      "files": tokenizer_files},
        **corpus.describe(),
        "config": {"data": asdict(data_cfg), "tokenizer": _tokenizer_settings(tokenizer_cfg)
                   if isinstance(tokenizer_cfg, GivenTokenizer) else asdict(tokenizer_cfg)},
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "timings_s": {"tokenizer": round(t_tok, 3), "encode": round(t_enc, 3)},
        "encode_mb_per_s": round(n_bytes / 1e6 / max(t_enc, 1e-9), 2),
    }


def _publish(tmp: Path, final: Path, verify: str) -> bool:
    """Rename the finished `tmp` to `final`; True if it is ours. If `final` exists, keep it when it is intact
    (another process finished the same dataset first: identical content), else move it aside and put `tmp`
    in its place."""
    for _ in range(3):  # each round either succeeds or finds a folder another process just put there
        try:
            os.rename(tmp, final)  # fails when `final` is a non-empty folder
            return True
        except OSError:
            if not final.is_dir():
                raise
        if _damage(final, verify) is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        aside = temporary_name(final, ".damaged")
        try:
            os.rename(final, aside)
        except FileNotFoundError:  # another process moved it first
            continue
        shutil.rmtree(aside, ignore_errors=True)
    raise UserError(f"{final} keeps changing while it is being replaced; stop the other jobs preparing it "
                    "and run again")


def _reuse_without_sources(
    cache_root: Path, data_cfg: DataConfig, tokenizer_cfg: TokenizerConfig | GivenTokenizer,
    missing: SourceMissing,
) -> PreparedData:
    """The corpus is gone: serve the newest folder prepared with the same settings, if it verifies."""
    key = config_key(data_cfg, tokenizer_cfg)
    candidates = []
    for folder in cache_root.glob(f"{data_cfg.source}-{tokenizer_cfg.kind}-*"):
        meta, _ = read_meta(folder, FORMAT_VERSION)
        if meta is not None and meta.get("config_key") == key:
            candidates.append((folder.joinpath(META_FILE).stat().st_mtime, folder))
    if not candidates:
        raise missing
    folder = max(candidates)[1]
    damage = _damage(folder, data_cfg.verify)
    if damage is not None:
        raise UserError(f"the prepared data in {folder} is damaged ({damage}) and cannot be rebuilt because "
                        f"its corpus is gone: {missing} -- restore the corpus files to rebuild it")
    log.warning("%s; using the data prepared from it earlier in %s (verified against its meta.json)",
                missing, folder)
    return load_prepared(folder)
