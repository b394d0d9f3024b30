"""Resuming means continuing the same run: the new config against the one its checkpoint was trained with.

Every key of the config falls in one of three kinds:

    identity   what the weights are (model.*), what their ids mean (tokenizer.*) and what they are trained
               and validated on (data.*, except where the cache lives and how it is read): another value
               makes it another run, so resuming is refused, naming every differing key. A different run
               that starts from these weights is a fine-tune: trainer.init_from (it may change the data).
    course     how the rest of the run goes: the lr schedule and its horizon (optim.*, the budget:
               trainer.max_steps, max_time, max_tokens, max_flops, max_tokens_per_param), the optimizer's
               knobs, the batch (trainer.batch_size, grad_accum_steps, tokens_per_step, and the batch-size and
               sequence-length warmups), the data order
               (trainer.seed), dropout, what validation scores (trainer.eval_tokens): allowed, with one
               warning line per key saying what it changes.
    neither    where and how it runs or reports (device.*, logging.*, eval_every, ckpt_every, strategy, ...):
               silent.

The run's number of processes must be the checkpoint's (`check_world_size`): every rank's position in its
own data stream is part of the saved state.

The checkpoint's config is meta.json's `config`; a key it predates means its default. The keys cannot show
the corpus' own content: the run prepares its data expecting the checkpoint's corpus (`corpus_of`), so a
changed corpus is refused before anything is prepared for it (`corpus_changed` says so), and `check_data`
then checks that the prepared data's tokenizer files are the checkpoint's too.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from minigpt.checkpoint.format import TOKENIZER_HASHES, read_meta
from minigpt.cluster.dist_env import DistEnv
from minigpt.data.prepare import NOT_SHAPING, PreparedData
from minigpt.data.verify import TOKENIZER_DIR, folder_digests
from minigpt.errors import UserError
from minigpt.training.budget import Budget
from minigpt.training.config import TrainConfig
from minigpt.training.optim import LRSchedule
from minigpt.training.step import grad_accum_steps

log = logging.getLogger(__name__)

COURSE_MODEL_KEYS = ("dropout", "attn_dropout")  # how to train, not what the weights are
SILENT_MODEL_KEYS = ("attention", "online_block_size")  # the same numbers, computed another way
SCHEDULE_KEYS = ("lr", "schedule", "warmup_steps", "decay_steps", "min_lr_ratio", "cooldown_ratio")
BUDGET_KEYS = ("max_steps", "max_time", "max_tokens", "max_flops", "max_tokens_per_param")  # the lr's horizon
WARMUP_KEYS = ("batch_warmup_steps", "batch_warmup_start", "seq_len_warmup_steps", "seq_len_warmup_start")
COURSE_TRAINER_KEYS = (*BUDGET_KEYS, "batch_size", "grad_accum_steps", "tokens_per_step", "seed",
                       "eval_tokens", *WARMUP_KEYS)


def check_same_run(resume_from: Path | None, cfg: TrainConfig, env: DistEnv) -> dict[str, Any] | None:
    """Before any work: refuse to resume `resume_from` into another run, and warn once per key that changes
    the run's course (same_run.py). Returns the checkpoint's meta.json (None: not resuming)."""
    if resume_from is None:
        return None
    meta = read_meta(resume_from)
    check_world_size(meta.get("world_size", 1), env, resume_from)
    tc = cfg.trainer
    block = cfg.model.block_size
    tokens = tc.batch_size * block * env.world_size * grad_accum_steps(tc, block, env.world_size)
    step = int(meta.get("step", 0))
    before = meta.get("tokens_seen", 0) // step if step else tokens
    lines = compare(meta.get("config") or {}, cfg, resume_from, step, meta.get("train_seconds") or 0.0,
                    (before, tokens), meta)
    for line in lines:
        log.warning("resuming with a changed course: %s", line)
    return meta


def corpus_of(meta: dict[str, Any] | None) -> str | None:
    """The fingerprint of the corpus a checkpoint (its meta.json) was trained on; None: no checkpoint, or
    one that predates fingerprints."""
    return ((meta or {}).get("data") or {}).get("fingerprint")


def check_world_size(saved: int, env: DistEnv, path: object) -> None:
    """Refuse to resume a checkpoint written by another number of processes: every rank's position in its own
    data stream is part of the saved state, and tokens per step scale with the process count."""
    if saved == env.world_size:
        return
    how = ("plain `python scripts/train.py`" if saved == 1
           else f"`torchrun --nproc_per_node={saved} scripts/train.py ...` or `make train-ddp NPROC={saved}`")
    raise UserError(f"checkpoint {path} was written by {saved} process(es) but this run has "
                    f"{env.world_size}; resume it with {saved} (launch with {how})")


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1}} -> {"optim.lr": 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def kind_of(key: str) -> str:
    """identity | course | neither, for a flat key such as `optim.lr` (see the module docstring)."""
    section, _, name = key.partition(".")
    if section == "model":
        if name in COURSE_MODEL_KEYS:
            return "course"
        return "neither" if name in SILENT_MODEL_KEYS else "identity"
    if section == "tokenizer" or (section == "data" and name not in NOT_SHAPING):
        return "identity"
    if section == "optim" or (section == "trainer" and name in COURSE_TRAINER_KEYS):
        return "course"
    return "neither"


def compare(saved: dict[str, Any], cfg: TrainConfig, checkpoint: object, step: int, seconds: float,
            tokens_per_step: tuple[int, int], meta: dict[str, Any] | None = None) -> list[str]:
    """Refuse a resume into another run (UserError naming every identity key that differs); return one line
    per changed course key, saying what it changes from checkpoint step `step` on. `saved` is the
    checkpoint's config (meta.json), `tokens_per_step` (the checkpoint's, this run's), `meta` the rest of
    its meta.json (the tokens seen, FLOPs and parameters a budget of tokens or FLOPs is measured in)."""
    before = {**flat(dataclasses.asdict(TrainConfig())), **flat(saved)}
    after = flat(dataclasses.asdict(cfg))
    changed = [k for k in after if k in before and before[k] != after[k]]
    identity = [k for k in changed if kind_of(k) == "identity"]
    if identity:
        raise UserError(_refusal(identity, before, after, checkpoint))
    return [_course_line(k, before, after, cfg, step, seconds, tokens_per_step, meta or {})
            for k in changed if kind_of(k) == "course"]


def _refusal(keys: list[str], before: dict, after: dict, checkpoint: object) -> str:
    differences = ", ".join(f"{k}={before[k]!r} there, {after[k]!r} here" for k in keys)
    sections = {k.split(".")[0] for k in keys}
    names = {"model": "model config", "tokenizer": "tokenizer", "data": "data set"}
    what = " and ".join(name for section, name in names.items() if section in sections)
    if sections & {"model", "tokenizer"}:  # a fine-tune keeps both too
        fix = "resume with its settings (the config in its meta.json)"
    else:
        fix = ("resume with its settings, or fine-tune its weights on this data: "
               f"trainer.init_from={checkpoint} (and no trainer.resume)")
    return (f"checkpoint {checkpoint} was trained with a different {what}, so this would be another run: "
            f"{differences}; {fix}")


def _course_line(key: str, before: dict, after: dict, cfg: TrainConfig, step: int, seconds: float,
                 tokens_per_step: tuple[int, int], meta: dict[str, Any]) -> str:
    was, now = before[key], after[key]
    head = f"{key}={now} (the checkpoint's: {was})"
    section, _, name = key.partition(".")
    if name in SCHEDULE_KEYS or (section == "trainer" and name in BUDGET_KEYS):
        return f"{head}: {_lr_change(key, before, cfg, step, seconds, tokens_per_step[1], meta)}"
    if name in ("batch_size", "grad_accum_steps", "tokens_per_step"):
        old, new = tokens_per_step
        return (f"{head}: a step now trains on {new:,} tokens instead of {old:,}; the data stream goes on "
                "from where it was")
    if name == "seed":
        return (f"{head}: the batches after step {step} come from another stream than the run's (dropout "
                "goes on from the checkpoint's state)")
    if section == "trainer" and name in WARMUP_KEYS:
        return f"{head}: the batches' sizes and context lengths follow the new warmup from step {step} on"
    if name == "eval_tokens":
        return (f"{head}: validation now scores other windows, so val losses (and which checkpoint is "
                f"`best`) before and after step {step} are not comparable")
    if section == "model":
        return f"{head}: training goes on with another {name} from step {step}"
    return f"{head}: the optimizer's {name} changes from step {step} on"


def _lr_change(key: str, before: dict, cfg: TrainConfig, step: int, seconds: float, tokens_per_step: int,
               meta: dict[str, Any]) -> str:
    """The lr of the next step under the checkpoint's schedule and with only `key` changed; the budget's
    rates (FLOPs per token, parameters) are the checkpoint's, from its meta.json."""
    tokens = int(meta.get("tokens_seen") or 0)
    flops_per_token = (meta.get("flops") or 0.0) / tokens if tokens else 0.0
    rates = (tokens_per_step, flops_per_token, int(meta.get("params") or 0))

    def schedule(values: dict) -> LRSchedule:
        optim = dataclasses.replace(cfg.optim, **{k: values[f"optim.{k}"] for k in SCHEDULE_KEYS})
        trainer = dataclasses.replace(cfg.trainer, **{k: values[f"trainer.{k}"] for k in BUDGET_KEYS})
        return LRSchedule(optim, Budget(trainer.max_steps, trainer.max_seconds, trainer.max_tokens,
                                        trainer.max_flops, trainer.max_tokens_per_param, *rates))

    only = {**before, key: flat(dataclasses.asdict(cfg))[key]}
    try:
        old, new = schedule(before).lr(step, seconds, tokens), schedule(only).lr(step, seconds, tokens)
    except ValueError:  # a checkpoint that predates the FLOPs and parameter counts in meta.json
        return "the schedule's horizon moved"
    if old == new:
        return f"the lr schedule from step {step} on is the same ({old:.2e} next)"
    verb = "jumps" if new > old * 1.5 or new < old / 1.5 else "goes"
    horizon = key in (*(f"trainer.{k}" for k in BUDGET_KEYS), "optim.decay_steps")
    why = "the schedule's horizon moved" if horizon else "the schedule changed"
    return f"{why}, so the lr of step {step + 1} {verb} from {old:.2e} to {new:.2e}"


def corpus_changed(checkpoint: object, recorded: str, found: str) -> str:
    """The refusal for a corpus whose content changed under the same data.* settings."""
    return (f"the corpus changed since checkpoint {checkpoint} was trained on it (the same data.* "
            f"settings, other content: fingerprint {recorded[:12]} there, {found[:12]} here), so its val "
            f"losses would not compare; restore the corpus, or fine-tune on it: "
            f"trainer.init_from={checkpoint} (and no trainer.resume)")


def check_data(meta: dict[str, Any], data: PreparedData, checkpoint: object) -> None:
    """The prepared data must be the checkpoint's: the same corpus content and the same tokenizer files."""
    recorded, found = (meta.get("data") or {}).get("fingerprint"), data.meta.get("fingerprint")
    if recorded and found and recorded != found:  # prepare_dataset checks first; a cache reused as it is
        raise UserError(corpus_changed(checkpoint, recorded, found))
    tokenizer = meta.get(TOKENIZER_HASHES)
    if isinstance(tokenizer, dict) and tokenizer != folder_digests(data.dir / TOKENIZER_DIR):
        raise UserError(
            f"the tokenizer prepared for this data ({data.dir / TOKENIZER_DIR}) is not the one checkpoint "
            f"{checkpoint} was trained with, whose ids its weights know; resume with the checkpoint's "
            "tokenizer settings, or fine-tune from it (trainer.init_from, which brings its own tokenizer)")
