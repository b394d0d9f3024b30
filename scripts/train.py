"""Train a model: `python scripts/train.py [group=option ...] [key=value ...]` (see configs/train.yaml).

Thin on purpose: compose the config (Hydra), convert it to dataclasses once, and hand it to the library's
`train(cfg, out_dir)`. Bad input ends with one line on stderr and exit code 2; set HYDRA_FULL_ERROR=1 for
Hydra's full report and traceback instead. Ctrl-C (or SIGTERM) stops after the current step, writes a
checkpoint and prints the command that resumes it.

Under `torchrun --nproc_per_node=N` only rank 0 goes through Hydra; the other ranks train rank 0's config in
rank 0's run folder (minigpt/training/launch.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from minigpt.config import register_configs, run_cli, to_object
from minigpt.errors import reports_user_errors
from minigpt.training.config import TrainConfig
from minigpt.training.launch import Launch

register_configs()
# `${minigpt_suffix:${run_name}}` in the run folder's name: "_<run_name>" when run_name is set, else nothing.
if not OmegaConf.has_resolver("minigpt_suffix"):
    OmegaConf.register_new_resolver("minigpt_suffix", lambda name: f"_{name}" if name else "")
LAUNCH = Launch.from_environ()  # this process in torchrun's RANK/WORLD_SIZE, or alone


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.training.trainer import train  # after composition: `--help`/`--cfg` stay fast

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    config = to_object(cfg, TrainConfig)
    LAUNCH.share((config, out_dir))
    result = train(config, out_dir, env=LAUNCH.env)
    if result.interrupted:
        print(f"stopped at step {result.step}; checkpoint: {result.checkpoint}")
        print(f"resume with:  {LAUNCH.resume_command(out_dir, sys.argv[1:])}")
        return
    if result.sample:
        print(f"\n--- sample after {result.step} steps ---\n{result.sample}\n---")
    print(f"val loss {result.first_val_loss:.3f} -> {result.val_loss:.3f} (best {result.best_val_loss:.3f}), "
          f"{result.val_bpb:.3f} bits/byte, {result.tokens_per_s:,.0f} tokens/s, MFU {100 * result.mfu:.1f}%")
    print(f"checkpoint:  {result.checkpoint}")
    print(f"tensorboard: .venv/bin/tensorboard --logdir {out_dir / 'tb'}   (or `make tensorboard`)")


if __name__ == "__main__":
    LAUNCH.run(lambda: run_cli(main), sys.argv[1:])
