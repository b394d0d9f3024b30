"""Data speed: preparing the default corpus, the tokenizer's encode rate, what verifying a cache costs,
and the loader's rate across shards.

The prepare runs into a fresh temporary cache folder, so nothing cached is reused: reading the standard
library's sources, training the BPE, encoding both splits and writing the shards (the per-phase times
come from the dataset's own meta.json). Encode MB/s is measured on the validation split's text (UTF-8
bytes per second) with one call per document and with the threaded batch encoder.

Verification (minigpt/data/verify.py): reusing the default corpus' cache with `data.verify=stamp` (a stat
per shard) and `data.verify=hash` (sha256 of every shard), and the same two on a synthetic shard set of
SYNTHETIC_MB (random uint16 tokens in 100M-token shards, the default shard size), read from the page cache
right after writing it -- reading from a cold disk is slower and bound by the disk, not the hash.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.loader import BatchLoader
from minigpt.data.prepare import prepare_dataset
from minigpt.data.shards import ShardWriter, TokenSplit
from minigpt.data.sources import load_corpus
from minigpt.data.verify import find_damage
from minigpt.fast.timing import Timing, time_call

SYNTHETIC_MB = 500  # the size asked of the verification measurement: a mid-sized corpus' shards
SHARD_TOKENS = DataConfig().shard_tokens
LOADER_SHAPE = (16, 1024)  # B, T: a GPT-2-sized batch of windows


def bench_data(quick: bool = False, repeats: int = 3) -> dict:
    data_cfg = DataConfig()
    # quick=true caps the BPE's training text; the encode still covers the whole corpus
    tok_cfg = TokenizerConfig(train_chars=1_000_000) if quick else TokenizerConfig()
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-data-") as tmp:
        start = time.perf_counter()
        prepared = prepare_dataset(data_cfg, tok_cfg, Path(tmp), progress=False)
        prepare_s = time.perf_counter() - start
        corpus = load_corpus(data_cfg, Path(tmp))
        reuse = {mode: _median(lambda m=mode: find_damage(prepared.dir, prepared.meta, m), repeats)
                 for mode in ("stamp", "hash")}
        reuse_prepare_s = _median(lambda: prepare_dataset(data_cfg, tok_cfg, Path(tmp), progress=False),
                                  repeats)
    tok = prepared.tokenizer
    texts = [d.text for d in corpus.val]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    one = Timing.from_samples([time_call(lambda: [tok.encode(t) for t in texts]) for _ in range(repeats)])
    batch = Timing.from_samples([time_call(lambda: tok.encode_batch(texts)) for _ in range(repeats)])
    return {
        "corpus": data_cfg.source, "tokenizer": tok.name, "train_chars": tok_cfg.train_chars,
        "prepare_s": prepare_s, "phases_s": prepared.meta.get("timings_s", {}),
        "tokens": prepared.meta.get("tokens", {}), "encode_bytes": n_bytes,
        "encode_mb_per_s": n_bytes / 1e6 / one.median, "encode_batch_mb_per_s": n_bytes / 1e6 / batch.median,
        "shard_mb": sum(r["bytes"] for s in ("train", "val") for r in prepared.meta["shards"][s]) / 1e6,
        "reuse_prepare_s": reuse_prepare_s, "verify_s": reuse,
        "synthetic": _bench_synthetic(SYNTHETIC_MB // 5 if quick else SYNTHETIC_MB, repeats),
    }


def _median(fn, repeats: int) -> float:
    return Timing.from_samples([time_call(fn) for _ in range(repeats)]).median


def _bench_synthetic(megabytes: int, repeats: int) -> dict:
    """Write `megabytes` of random tokens as shards (hashing while writing), then verify them both ways."""
    n_tokens = megabytes * 10**6 // 2
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-shards-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        with ShardWriter(folder, "train", "uint16", SHARD_TOKENS) as writer:
            for first in range(0, n_tokens, 10_000_000):  # 20 MB at a time, as the encoder hands them over
                writer.write(rng.integers(0, 2**16, min(10_000_000, n_tokens - first), dtype=np.uint16))
            records = writer.close()
        write_s = time.perf_counter() - start
        meta = {"shards": {"train": records, "val": []}, "tokenizer": {"files": {}}}
        # hash first: it also writes the stamps that the stamp runs then find
        verify = {m: _median(lambda m=m: find_damage(folder, meta, m), repeats) for m in ("hash", "stamp")}
        split = TokenSplit("train", [folder / r["file"] for r in records], "uint16")
        B, T = LOADER_SHAPE
        loader = BatchLoader(split, T, B, seed=0)
        n_batches = 200
        load_s = time_call(lambda: [loader.next_batch() for _ in range(n_batches)])
    return {"mb": megabytes, "shards": len(records), "write_s": write_s, "verify_s": verify,
            "hash_mb_per_s": megabytes / verify["hash"],
            "loader_tokens_per_s": n_batches * B * T / load_s, "loader_shape": [B, T]}
