"""`train(cfg, out_dir)`: one training run, from claiming its folder to its last checkpoint.

The loop itself is minigpt/training/'s (the Trainer); around it, the run is kept safe:

    claim the folder          one training per folder; nothing written into it until every check passed
                              (run_folder.py)
    work out the start        scratch, the checkpoint `trainer.resume` names, or a model to fine-tune; a
                              resume into another run is refused (resume.py, same_run.py)
    build the Trainer         every other refusal happens here, still before anything is written
    accept, then fit          the record files and held log lines go in; the loop runs
    on a failure              under torchrun, a rank that finds another one gone names it, and the last
                              intact checkpoint, in one line (minigpt/cluster/peers.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from minigpt.checkpoint import format as ckpt
from minigpt.cluster import distributed, peers
from minigpt.cluster.dist_env import DistEnv
from minigpt.data.prepare import CorpusChanged
from minigpt.errors import UserError
from minigpt.runs import same_run
from minigpt.runs.resume import starting_point
from minigpt.runs.run_folder import RunFolder
from minigpt.training.config import TrainConfig
from minigpt.training.trainer import Trainer, TrainResult


def train(cfg: TrainConfig, out_dir: Path, *, env: DistEnv | None = None,
          record_files: dict[str, str] | None = None) -> TrainResult:
    """Train per `cfg`, writing checkpoints and TensorBoard logs under `out_dir` (rank 0 only).

    `env` is this process's place in a torchrun job, whose process group is already initialised; None: alone.
    `record_files` (relative path -> text, e.g. the script's .hydra/ configs) are written into `out_dir` once
    the run has passed every check: a refused run leaves the folder as it was (run_folder.py).
    """
    env = env or DistEnv()
    run = RunFolder(Path(out_dir), enabled=env.is_main, record_files=record_files)
    trainer: Trainer | None = None
    peers.next_train_call()
    try:
        refusal = distributed.broadcast_object(run.claim(), env)  # rank 0 locks; all stop if it cannot
        if refusal is not None:
            raise UserError(refusal)
        trainer = start_trainer(cfg, run, env)  # every other refusal: here, before anything is written
        run.accept()
        if env.is_main:
            ckpt.remove_stale_temporaries(run.path / "checkpoints")  # left by a crash mid-write
        return trainer.fit()
    except BaseException as e:
        if not env.enabled:
            raise
        if peers.is_peer_failure(e):  # another rank is gone: say which, in one line (peers.py)
            step = trainer.progress.step if trainer is not None else None
            raise peers.lost_rank_error(e, env, run.path, step, run.log_to_file) from None
        peers.report_own_failure(env)  # this rank's own line says why; the others stay quiet
        raise
    finally:
        run.release()


def start_trainer(cfg: TrainConfig, run: RunFolder, env: DistEnv,
                  clock: Callable[[], float] = time.perf_counter) -> Trainer:
    """The run's Trainer, built from where the run starts; a resume into another run is refused (the data
    the Trainer prepared included). Writes nothing into the run folder."""
    cfg, start, saved = starting_point(cfg, run.path, env)
    try:
        trainer = Trainer(cfg, run.path, env=env, start=start, check_folder=run.check, clock=clock)
    except CorpusChanged as e:  # the checkpoint's corpus changed under the same data.* settings
        raise UserError(same_run.corpus_changed(start.checkpoint, e.expected, e.found)) from None
    if saved is not None:
        same_run.check_data(saved, trainer.data, start.checkpoint)
    return trainer
