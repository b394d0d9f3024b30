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
import os
import shlex
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from minigpt.config import TrainConfig, register_configs, to_object
from minigpt.errors import USER_ERROR_EXIT_CODE, UserError
from minigpt.training.distributed import DistEnv, broadcast_object, process_group

register_configs()
# `${minigpt_suffix:${run_name}}` in the run folder's name: "_<run_name>" when run_name is set, else nothing.
if not OmegaConf.has_resolver("minigpt_suffix"):
    OmegaConf.register_new_resolver("minigpt_suffix", lambda name: f"_{name}" if name else "")


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> None:
    from minigpt.training.trainer import train  # after composition: `--help`/`--cfg` stay fast

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        config = to_object(cfg, TrainConfig)
        _share_job((config, out_dir))
        result = train(config, out_dir, env=ENV)
    except UserError as e:
        _fail(str(e))
    except OSError as e:  # e.g. a checkpoint that cannot be written: disk full, read-only folder
        _fail(_os_error(e))
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
        _fail(f"[rank {ENV.rank}] {e}")


def _resume_command(out_dir: Path) -> str:
    launcher = (f"torchrun --nproc_per_node={ENV.world_size} scripts/train.py" if ENV.enabled
                else "python scripts/train.py")
    kept = [a for a in sys.argv[1:] if not a.startswith(("trainer.resume=", "hydra.run.dir="))]
    return " ".join([launcher, *map(shlex.quote, [*kept, "trainer.resume=auto", f"hydra.run.dir={out_dir}"])])


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def _os_error(e: OSError) -> str:
    return (f"cannot write {e.filename or ''}: {e.strerror or e} "
            "(choose a writable folder: hydra.run.dir=... or data.cache_dir=...)")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


def _run_rank0() -> None:
    # Hydra prints config errors (a misspelled key, a bad value) as a multi-line report. Unless the user asks
    # for that report (HYDRA_FULL_ERROR=1), let the exception reach us and print one line instead.
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        if ENV.enabled and {"-m", "--multirun"} & set(sys.argv):
            _fail("a Hydra multirun (-m) cannot run under torchrun; start one torchrun per setting")
        main()
    except (HydraException, OmegaConfBaseException) as e:
        if full_error:
            raise
        cause = f": {_first_line(e.__cause__)}" if e.__cause__ is not None else ""
        hint = "(`--cfg job` shows every key, `--info defaults` every file)"
        _fail(f"{_first_line(e).rstrip('.')}{cause} {hint}")
    except OSError as e:  # Hydra could not create the run folder
        if full_error:
            raise
        _fail(_os_error(e))
    finally:
        _share_job(None)  # if rank 0 stopped before training, release the waiting ranks


if __name__ == "__main__":
    try:
        ENV = DistEnv.from_env()
    except UserError as e:
        _fail(str(e))
    try:
        with process_group(ENV):
            _run_rank0() if ENV.is_main else _follow_rank0()
    except KeyboardInterrupt:  # Ctrl-C before the training loop began (it handles its own): nothing to save
        print("interrupted before training started; nothing was written to checkpoints", file=sys.stderr)
        sys.exit(130)
