"""Data preparation speed: the default corpus prepared from scratch, and the tokenizer's encode rate.

The prepare runs into a fresh temporary cache folder, so nothing cached is reused: reading the
standard library's sources, training the BPE, encoding both splits and writing the token bins (the
per-phase times come from the dataset's own meta.json). Encode MB/s is measured on the validation
split's text (UTF-8 bytes per second) with one call per document and with the threaded batch encoder.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from minigpt.bench.timing import Timing, time_call
from minigpt.data.config import DataConfig, TokenizerConfig
from minigpt.data.prepare import prepare_dataset
from minigpt.data.sources import load_corpus


def bench_data(quick: bool = False, repeats: int = 3) -> dict:
    data_cfg = DataConfig()
    # --quick caps the BPE's training text; the encode still covers the whole corpus
    tok_cfg = TokenizerConfig(train_chars=1_000_000) if quick else TokenizerConfig()
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-data-") as tmp:
        start = time.perf_counter()
        prepared = prepare_dataset(data_cfg, tok_cfg, Path(tmp), progress=False)
        prepare_s = time.perf_counter() - start
        corpus = load_corpus(data_cfg, Path(tmp))
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
    }
