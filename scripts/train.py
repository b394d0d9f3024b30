"""Train a model: `python scripts/train.py [group=option ...] [key=value ...]` (see configs/train.yaml).

Thin on purpose: compose the config (Hydra), convert it to dataclasses once, and hand it to the library's
`train(cfg, out_dir)`. Bad input ends with one line on stderr and exit code 2; set HYDRA_FULL_ERROR=1 for
Hydra's full report and traceback instead. Ctrl-C, SIGTERM, SIGHUP, SIGUSR1 or SIGUSR2 stop after the
current step, write a checkpoint, print the command that resumes it and exit 128+N (in a submitit job the
signal then goes on to submitit, which requeues the job: docs/faults.md).

Under `torchrun` (one machine or several), `srun` or a multi-task job of `hydra/launcher=submitit_slurm`, only
global rank 0 goes through Hydra; the other ranks train rank 0's config in rank 0's run folder
(minigpt/cluster/launch.py, `train_along`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from minigpt.cli import hydra_output_files, reports_user_errors, run_cli, to_object
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.launch import Job, Launch, rank0_task, this_process
from minigpt.config import register_configs
from minigpt.errors import exit_with_error
from minigpt.signals import signal_name
from minigpt.training.config import TrainConfig

register_configs()


def train_along(job: Job, env: DistEnv) -> int | None:
    """What every rank but 0 does: train the config rank 0 composed, in its run folder; the stop signal that
    ended the run early, if one did."""
    from minigpt.runs.train import train  # torch only where a rank trains: `--help`/`--cfg` stay fast

    return train(*job, env=env).stop_signal


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@reports_user_errors
@rank0_task(train_along)  # a submitit job runs this in each of its tasks: task 0 trains, the others along
def main(cfg: DictConfig) -> None:
    from minigpt.runs.train import train  # after composition: `--help`/`--cfg` stay fast

    launch = this_process()  # not a global of this script: submitit runs main in processes of its own
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    config = to_object(cfg, TrainConfig)
    launch.share((config, out_dir))
    result = train(config, out_dir, env=launch.env, record_files=hydra_output_files(cfg))  # see train.yaml
    if result.interrupted:
        overrides = list(HydraConfig.get().overrides.task)  # this job's own, also in a sweep
        resume = launch.resume_command(out_dir, overrides)
        print(f"stopped at step {result.step}; checkpoint: {result.checkpoint}")
        print(f"resume with:  {resume}")
        launch.after_stop(result.stop_signal, f"stopped by {signal_name(result.stop_signal)} at step "
                          f"{result.step}, checkpoint {result.checkpoint} written; resume with: {resume}")
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
    Launch.from_environ(train_along).run_process(lambda: run_cli(main), sys.argv[1:])
