"""Train a model: `python scripts/train.py [group=option ...] [key=value ...]` (see configs/train.yaml).

Thin on purpose: compose the config (Hydra), convert it to dataclasses once, and hand it to the library's
`train(cfg, out_dir)`. Bad input ends with one line on stderr and exit code 2; set HYDRA_FULL_ERROR=1 for
Hydra's full report and traceback instead. Ctrl-C (or SIGTERM) stops after the current step, writes a
checkpoint and prints the command that resumes it.

Under `torchrun --nproc_per_node=N` only rank 0 goes through Hydra: it composes the config and chooses the run
folder, then broadcasts both, so the other ranks train the very same config without creating run folders or
log files of their own.
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from minigpt.config import TrainConfig, register_configs, run_cli, to_object
from minigpt.errors import UserError, exit_with_error, reports_user_errors
from minigpt.training.distributed import DistEnv, broadcast_object, process_group

register_configs()
# `${minigpt_suffix:${run_name}}` in the run folder's name: "_<run_name>" when run_name is set, else nothing.
if not OmegaConf.has_resolver("minigpt_suffix"):
    OmegaConf.register_new_resolver("minigpt_suffix", lambda name: f"_{name}" if name else "")


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.training.trainer import train  # after composition: `--help`/`--cfg` stay fast

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    config = to_object(cfg, TrainConfig)
    _share_job((config, out_dir))
    result = train(config, out_dir, env=ENV)
    if result.interrupted:
        print(f"stopped at step {result.step}; checkpoint: {result.checkpoint}")
        print(f"resume with:  {_resume_command(out_dir)}")
        return
    if result.sample:
        print(f"\n--- sample after {result.step} steps ---\n{result.sample}\n---")
    print(f"val loss {result.first_val_loss:.3f} -> {result.val_loss:.3f} (best {result.best_val_loss:.3f}), "
          f"{result.tokens_per_s:,.0f} tokens/s")
    print(f"checkpoint:  {result.checkpoint}")
    print(f"tensorboard: .venv/bin/tensorboard --logdir {out_dir / 'tb'}   (or `make tensorboard`)")


ENV = DistEnv()  # this process's place under torchrun; set in __main__
_shared = False


def _share_job(job: tuple[TrainConfig, Path] | None) -> None:
    """Rank 0: hand the config and the run folder (or None: nothing to train) to the other ranks, once."""
    global _shared
    if not _shared:
        _shared = True
        broadcast_object(job, ENV)


def _follow_rank0() -> None:
    """Ranks > 0: train rank 0's config in rank 0's run folder, or exit if rank 0 stopped before training."""
    from minigpt.training.trainer import train

    logging.getLogger().setLevel(logging.ERROR)  # rank 0 reports; the others only speak up when they fail
    job = broadcast_object(None, ENV)
    if job is None:
        return
    try:
        train(job[0], job[1], env=ENV)
    except UserError as e:
        exit_with_error(f"[rank {ENV.rank}] {e}")


def _resume_command(out_dir: Path) -> str:
    launcher = (f"torchrun --nproc_per_node={ENV.world_size} scripts/train.py" if ENV.enabled
                else "python scripts/train.py")
    kept = [a for a in sys.argv[1:] if not a.startswith(("trainer.resume=", "hydra.run.dir="))]
    return " ".join([launcher, *map(shlex.quote, [*kept, "trainer.resume=auto", f"hydra.run.dir={out_dir}"])])


def _run_rank0() -> None:
    try:
        if ENV.enabled and {"-m", "--multirun"} & set(sys.argv):
            exit_with_error("a Hydra multirun (-m) cannot run under torchrun; start one torchrun per setting")
        run_cli(main)
    finally:
        _share_job(None)  # if rank 0 stopped before training, release the waiting ranks


if __name__ == "__main__":
    try:
        ENV = DistEnv.from_env()
    except UserError as e:
        exit_with_error(str(e))
    try:
        with process_group(ENV):
            _run_rank0() if ENV.is_main else _follow_rank0()
    except KeyboardInterrupt:  # Ctrl-C before the training loop began (it handles its own): nothing to save
        print("interrupted before training started; nothing was written to checkpoints", file=sys.stderr)
        sys.exit(130)
