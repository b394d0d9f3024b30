"""Where a run starts, decided before any work: the checkpoint `trainer.resume` names, or none.

`trainer.resume`:
    null          start from scratch; refused if the run folder already holds a checkpoint (never overwrite),
                  unless that checkpoint was written by this very job before it was requeued (a SLURM or
                  submitit job keeps its job id when requeued): then as `auto`
    auto          this run folder's latest checkpoint, if any (`last`, or `.last.old` after a crash mid-swap)
    <path>        a checkpoint folder or run folder, continued in this (new) run folder
                  (a checkpoint without optimizer state, like an imported one, is for trainer.init_from)

The resumed run must be the same run: same model, tokenizer and data (same_run.py refuses anything else,
naming each differing key); a changed course (lr, schedule horizon, batch) is allowed with one warning line
per key. How the loop then continues the checkpoint, or fine-tunes a model (`trainer.init_from`), is
minigpt/training/start.py's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import resolve_checkpoint
from minigpt.cluster.dist_env import DistEnv
from minigpt.errors import UserError
from minigpt.runs import same_run
from minigpt.training.config import TrainConfig
from minigpt.training.start import Start, fine_tuning

log = logging.getLogger(__name__)


def starting_point(cfg: TrainConfig, out_dir: Path,
                   env: DistEnv) -> tuple[TrainConfig, Start, dict[str, Any] | None]:
    """The run's config (a fine-tuning run's has its source's model config), where it starts, and the
    meta.json of the checkpoint it continues (None: it continues none). Refuses, before any work, a bad path,
    a checkpoint the run would overwrite, and a resume into another run."""
    resume_from = resume_source(cfg, out_dir, env)  # before any work: a bad path fails at once
    if cfg.trainer.resume == "auto" and resume_from is None:
        log.info("trainer.resume=auto: no checkpoint in %s yet, starting from scratch", out_dir)
    cfg, init = fine_tuning(cfg, resume_from)  # trainer.init_from: the source's model config
    saved = same_run.check_same_run(resume_from, cfg, env)  # another run: refused; a new course: warned
    return cfg, Start(resume_from, init, same_run.corpus_of(saved)), saved


def resume_source(cfg: TrainConfig, out_dir: Path, env: DistEnv | None = None) -> Path | None:
    """The checkpoint to resume from, or None; refuses to overwrite an existing run's checkpoint."""
    resume = cfg.trainer.resume
    folder = out_dir / "checkpoints"
    has_checkpoint = any((folder / name / ckpt.META).is_file() for name in ("last", ".last.old"))
    if resume is None and has_checkpoint and env is not None and env.job_id is not None:
        latest = resolve_checkpoint(out_dir)
        if ckpt.read_meta(latest).get("job_id") == env.job_id:
            log.info("job %s was requeued: continuing its own checkpoint %s (as trainer.resume=auto)",
                     env.job_id, latest)
            return latest
    if resume == "auto":
        return resolve_checkpoint(out_dir) if has_checkpoint else None
    if resume is not None:
        path = resolve_checkpoint(resume)
        # memory-mapped: only the keys are read here, the tensors when the run loads them
        if "optimizer" not in ckpt.load_state(path, mmap=True):  # e.g. scripts/import_hf.py's checkpoints
            raise UserError(f"checkpoint {path} holds no optimizer state, so there is no run to resume; "
                            f"fine-tune from it instead: trainer.init_from={path} (and no trainer.resume)")
        return path
    if (folder / "last").exists() or (folder / ".last.old").exists():
        raise UserError(
            f"{out_dir} already holds a checkpoint; continue it with trainer.resume=auto, "
            "or choose another hydra.run.dir"
        )
    return None
