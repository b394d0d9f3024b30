"""Train a model: `python scripts/train.py [group=option ...] [key=value ...]` (see configs/train.yaml).

Thin on purpose: compose the config (Hydra), convert it to dataclasses once, and hand it to the library's
`train(cfg, out_dir)`. Bad input ends with one line on stderr and exit code 2; set HYDRA_FULL_ERROR=1 for
Hydra's full report and traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from minigpt.config import TrainConfig, register_configs, to_object
from minigpt.errors import USER_ERROR_EXIT_CODE, UserError

register_configs()
# `${minigpt_suffix:${run_name}}` in the run folder's name: "_<run_name>" when run_name is set, else nothing.
if not OmegaConf.has_resolver("minigpt_suffix"):
    OmegaConf.register_new_resolver("minigpt_suffix", lambda name: f"_{name}" if name else "")


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> None:
    from minigpt.training.trainer import train  # after composition: `--help`/`--cfg` stay fast

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = train(to_object(cfg, TrainConfig), out_dir)
    except UserError as e:
        _fail(str(e))
    if result.sample:
        print(f"\n--- sample after {result.step} steps ---\n{result.sample}\n---")
    print(f"val loss {result.first_val_loss:.3f} -> {result.val_loss:.3f} (best {result.best_val_loss:.3f}), "
          f"{result.tokens_per_s:,.0f} tokens/s")
    print(f"checkpoint:  {result.checkpoint}")
    print(f"tensorboard: .venv/bin/tensorboard --logdir {out_dir / 'tb'}   (or `make tensorboard`)")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


if __name__ == "__main__":
    # Hydra prints config errors (a misspelled key, a bad value) as a multi-line report. Unless the user asks
    # for that report (HYDRA_FULL_ERROR=1), let the exception reach us and print one line instead.
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
    except OSError as e:  # e.g. a run folder that cannot be created: the message names the path
        if full_error:
            raise
        _fail(f"{e} (check hydra.run.dir and the permissions of the folders it names)")
