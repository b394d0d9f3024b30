"""Prepare token files: `python scripts/prepare_data.py [data=...] [tokenizer=...] [key=value ...]`.

Thin on purpose: compose configs/prepare.yaml, convert it to dataclasses once and call
`prepare_dataset`. The result is cached by fingerprint under data.cache_dir (outputs/data/ by
default); running it again with the same settings verifies the cache and returns. Bad input ends
with one line on stderr and exit code 2; HYDRA_FULL_ERROR=1 shows Hydra's full report for config errors.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import PrepareConfig, register_configs
from minigpt.data.prepare import prepare_dataset

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    pc = to_object(cfg, PrepareConfig)
    prepared = prepare_dataset(pc.data, pc.tokenizer)
    meta = prepared.meta
    print(f"prepared:  {prepared.dir}")
    print(f"tokenizer: {prepared.tokenizer.name} ({meta['vocab_size']} ids, {meta['dtype']} bins)")
    for split in ("train", "val"):
        tokens, docs, shards = meta["tokens"][split], meta["documents"][split], len(meta["shards"][split])
        print(f"{split + ':':10} {tokens:,} tokens from {docs:,} document(s) in {shards} shard(s)")
    t = meta["timings_s"]
    print(f"time:      {t['total']:.1f} s when built (tokenizer {t['tokenizer']:.1f} s, "
          f"encode {t['encode']:.1f} s at {meta['encode_mb_per_s']:.1f} MB/s)")


if __name__ == "__main__":
    run_cli(main)
