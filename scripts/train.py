"""Train a model: `python scripts/train.py [group=option ...] [key=value ...]` (see configs/train.yaml).

Thin on purpose: compose the config (Hydra), convert it to dataclasses once, and hand it to the library's
`train(cfg, out_dir)`. Bad input ends with one line on stderr and exit code 2; set HYDRA_FULL_ERROR=1 for
Hydra's full report and traceback instead. Ctrl-C (or SIGTERM) stops after the current step, writes a
checkpoint and prints the command that resumes it.

Under `torchrun` (one machine or several), `srun` or a multi-task job of `hydra/launcher=submitit_slurm`, only
global rank 0 goes through Hydra; the other ranks train rank 0's config in rank 0's run folder
(minigpt/training/launch.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from minigpt.cli import hydra_output_files, run_cli, to_object
from minigpt.config import register_configs
from minigpt.errors import exit_with_error, reports_user_errors
from minigpt.training.config import TrainConfig
from minigpt.training.launch import Launch, rank0_task, this_process

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@reports_user_errors
@rank0_task  # a submitit job runs this in each of its tasks: task 0 trains through it, the others follow
def main(cfg: DictConfig) -> None:
    from minigpt.training.trainer import train  # after composition: `--help`/`--cfg` stay fast

    launch = this_process()  # not a global of this script: submitit runs main in processes of its own
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    config = to_object(cfg, TrainConfig)
    launch.share((config, out_dir))
    result = train(config, out_dir, env=launch.env, record_files=hydra_output_files(cfg))  # see train.yaml
    if result.interrupted:
        print(f"stopped at step {result.step}; checkpoint: {result.checkpoint}")
        overrides = list(HydraConfig.get().overrides.task)  # this job's own, also in a sweep
        print(f"resume with:  {launch.resume_command(out_dir, overrides)}")
        return
    if result.sample:
        print(f"\n--- sample after {result.step} steps ---\n{result.sample}\n---")
    print(f"val loss {result.first_val_loss:.3f} -> {result.val_loss:.3f} (best {result.best_val_loss:.3f}), "
          f"{result.val_bpb:.3f} bits/byte, {result.tokens_per_s:,.0f} tokens/s, MFU {100 * result.mfu:.1f}%")
    print(f"checkpoint:  {result.checkpoint}")
    print(f"tensorboard: .venv/bin/tensorboard --logdir {out_dir / 'tb'}   (or `make tensorboard`)")


def check_launcher_installed(argv: list[str]) -> None:
    """hydra/launcher=slurm|local need the optional plugin; without it Hydra only says a config is missing."""
    names = {a.split("=", 1)[1] for a in argv if a.startswith("hydra/launcher=")}
    if names & {"slurm", "local", "submitit_slurm", "submitit_local"} and \
            importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        exit_with_error(f"hydra/launcher={names.pop()} needs Hydra's submitit launcher plugin: "
                        "pip install -e '.[cluster]'")


if __name__ == "__main__":
    check_launcher_installed(sys.argv[1:])
    Launch.from_environ().run_process(lambda: run_cli(main), sys.argv[1:])
