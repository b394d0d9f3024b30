"""Prepare token files: `python scripts/prepare_data.py [data=...] [tokenizer=...] [key=value ...]`.

Thin on purpose: compose configs/prepare.yaml, convert it to dataclasses once and call
`prepare_dataset`. The result is cached by fingerprint under data.cache_dir (outputs/data/ by
default); running it again with the same settings returns at once. Bad input ends with one line on
stderr and exit code 2; HYDRA_FULL_ERROR=1 shows Hydra's full report for config errors.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from minigpt.config import PrepareConfig, register_configs, to_object
from minigpt.data.prepare import prepare_dataset
from minigpt.errors import USER_ERROR_EXIT_CODE, UserError

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare")
def main(cfg: DictConfig) -> None:
    try:
        pc = to_object(cfg, PrepareConfig)
        prepared = prepare_dataset(pc.data, pc.tokenizer)
    except UserError as e:
        _fail(str(e))
    except OSError as e:  # e.g. data.cache_dir under a file, or on a read-only disk
        _fail(_os_error(e))
    meta = prepared.meta
    print(f"prepared:  {prepared.dir}")
    print(f"tokenizer: {prepared.tokenizer.name} ({meta['vocab_size']} ids, {meta['dtype']} bins)")
    for split in ("train", "val"):
        n_files = len(meta["files"][split])
        print(f"{split + ':':10} {meta['tokens'][split]:,} tokens from {n_files} document(s)")
    t = meta["timings_s"]
    print(f"time:      {t['total']:.1f} s when built (tokenizer {t['tokenizer']:.1f} s, "
          f"encode {t['encode']:.1f} s at {meta['encode_mb_per_s']:.1f} MB/s)")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def _os_error(e: OSError) -> str:
    return f"cannot write {e.filename or ''}: {e.strerror or e} (choose a writable data.cache_dir=...)"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


if __name__ == "__main__":
    # Hydra prints config errors as a multi-line report; unless HYDRA_FULL_ERROR=1 asks for it,
    # let the exception reach us and print one line instead.
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        if full_error:
            raise
        cause = f": {_first_line(e.__cause__)}" if e.__cause__ is not None else ""
        hint = "(`--cfg job` shows every key, `--info defaults` every file)"
        _fail(f"{_first_line(e).rstrip('.')}{cause} {hint}")
    except OSError as e:  # Hydra's run folder could not be created
        if full_error:
            raise
        _fail(_os_error(e))
