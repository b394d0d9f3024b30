"""The runs of a configs x seeds sweep as data, and each config's summary over its seeds.

The speedrun and the ablation lab train every config with several seeds in one Hydra multirun (the Makefile's
`speedrun` and `ablation` targets), then describe each job by a `RunRecord`: a row of their JSON that keeps
what the result depends on and what it cost,

    config      the job's own overrides without its seed and budget ("default": none)
    seed        trainer.seed: the initial weights (where the shapes agree) and the order of the batches
    budget      the budget's limits, e.g. `trainer.max_flops=8.16e+12`
    machine     CPU model, cores, device (and GPU), the dtype the matmuls ran in, torch
    params      the model's non-embedding parameters (the N of its 6N FLOPs per token)
    steps, tokens, flops, train_seconds, tokens_per_s      what the run did, and how fast
    val_loss, bits_per_byte                                 what it learned

so rows from two machines can be put in one file and compared at equal FLOPs. `summarize` turns the rows
into one line per (config, budget): the mean and 95% interval over the seeds, and the paired comparison
with the baseline config of the same budget (`stats.py`).

A sweep whose jobs did not all finish is not reported as if they had: `sweep_jobs` returns the jobs that
used their whole budget, and `failed_jobs` names the others, those that stopped early (an error, a signal,
a diverged run: no checkpoint, or one short of the budget) and those that never started (a multirun stops at
the first job that exits, so the jobs after it have no folder; `multirun.yaml` says how many there were).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
from pathlib import Path

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import resolve_checkpoint
from minigpt.errors import UserError
from minigpt.lab.stats import Interval, Paired, mean_interval, paired_comparison

BUDGET_KEYS = ("max_steps", "max_time", "max_tokens", "max_flops", "max_tokens_per_param")
DEFAULT = "default"  # the config label of a job without overrides of its own


@dataclasses.dataclass
class RunRecord:
    """One trained run of a sweep (see the module docstring)."""

    config: str
    seed: int
    budget: str
    machine: dict
    steps: int
    params: int  # non-embedding parameters (GPT.num_params: the N of 6N FLOPs per token)
    tokens: int  # training tokens over all ranks
    flops: float  # model FLOPs trained (GPT.flops_per_token x tokens)
    train_seconds: float  # wall-clock seconds of the training steps, evaluation and checkpoints excluded
    tokens_per_s: float  # tokens / train_seconds: a side fact of the machine and its load
    val_loss: float  # nats per token
    bits_per_byte: float
    command: str  # trains this run again
    date: str

    @property
    def key(self) -> tuple:
        """What a rerun replaces: the same config, budget and seed on the same kind of machine."""
        return (self.config, self.budget, self.seed, self.machine.get("cpu"), self.machine.get("dtype"))


def job_overrides(run: Path) -> list[str]:
    """The overrides Hydra recorded for this job (`.hydra/overrides.yaml`, a YAML list of strings)."""
    path = Path(run) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        raise UserError(f"{run} has no .hydra/overrides.yaml: is it a run folder of scripts/train.py?")
    overrides = _load_yaml(path)
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise UserError(f"{path} is not a list of overrides (key=value strings); it is damaged: restore it, "
                        "or move the run out of the sweep")
    return overrides


def _load_yaml(path: Path):
    """`path`'s YAML as plain data; a file that does not parse is one line naming it."""
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path} cannot be read as YAML ({cause}); it is damaged: restore it, or move the "
                        "run out of the sweep") from None


def config_label(overrides: list[str]) -> str:
    """The overrides that make a config: all but the seed and the budget (those are the sweep's axes)."""
    axes = ("trainer.seed=", *(f"trainer.{k}=" for k in BUDGET_KEYS))
    own = [o for o in overrides if not o.startswith(axes)]
    return " ".join(own) or DEFAULT


def budget_label(trainer: dict) -> str:
    """The budget limits a resolved `trainer` config sets, as overrides: `trainer.max_flops=8.16e+12`."""
    parts = []
    for key in BUDGET_KEYS:
        value = trainer.get(key)
        if value is not None:
            parts.append(f"trainer.{key}=" + (f"{value:.4g}" if isinstance(value, float) else str(value)))
    return " ".join(parts)


def budget_unit(budget: str) -> str:
    """The budget in its own unit, for a table: `8.16e+12 FLOPs`, `1,500,000 tokens`, `3min`, `1500 steps`."""
    words = {"max_flops": "FLOPs", "max_tokens": "tokens", "max_steps": "steps", "max_time": "",
             "max_tokens_per_param": "tokens per parameter"}
    parts = []
    for item in budget.split():
        key, value = item.removeprefix("trainer.").split("=", 1)
        number = f"{int(value):,}" if key in ("max_tokens", "max_steps") else value
        parts.append(f"{number} {words[key]}".strip())
    return " or ".join(parts)


def read_record(run: Path, val_loss: float, bits_per_byte: float) -> RunRecord:
    """A finished run's row, from its last checkpoint and its recorded overrides, with the val numbers the
    caller measured (the speedrun scores the whole split, the lab the trainer's own windows)."""
    meta = ckpt.read_meta(resolve_checkpoint(run))
    overrides = job_overrides(run)
    trainer = meta["config"]["trainer"]
    seconds = meta.get("train_seconds") or 0.0
    return RunRecord(
        config=config_label(overrides), seed=int(trainer["seed"]), budget=budget_label(trainer),
        machine=meta.get("machine") or {}, steps=meta["step"], params=int(meta.get("params") or 0),
        tokens=meta["tokens_seen"],
        flops=float(meta.get("flops") or 0.0), train_seconds=seconds,
        tokens_per_s=meta["tokens_seen"] / max(seconds, 1e-9), val_loss=val_loss, bits_per_byte=bits_per_byte,
        command=" ".join(["python scripts/train.py", *map(shlex.quote, overrides)]),
        date=datetime.date.today().isoformat(),
    )


# ------------------------------------------------------------------------------------------------- summaries


def per_seed(runs: list[RunRecord], field: str) -> dict[int, float]:
    """`field` of each seed's run; a seed run more than once (on two machines, say) gives the mean of them."""
    values: dict[int, list[float]] = {}
    for r in runs:
        values.setdefault(r.seed, []).append(getattr(r, field))
    return {seed: sum(v) / len(v) for seed, v in sorted(values.items())}


@dataclasses.dataclass
class ConfigSummary:
    """One config at one budget over its seeds; `versus` is None for the baseline itself (or without one)."""

    config: str
    budget: str
    runs: list[RunRecord]
    versus: Paired | None  # compared on the metric `summarize` was given

    @property
    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.runs})

    def interval(self, field: str) -> Interval:
        """The mean of `field` over the seeds, with its 95% interval."""
        return mean_interval(list(per_seed(self.runs, field).values()))

    def mean(self, field: str) -> float:
        return self.interval(field).mean


def summarize(rows: list[RunRecord], baseline: str, metric: str = "val_loss") -> list[ConfigSummary]:
    """One summary per (config, budget), in the order the rows first show them; each compared on `metric`,
    seed by seed, with the `baseline` config's runs of the same budget."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for row in rows:
        groups.setdefault((row.config, row.budget), []).append(row)
    out = []
    for (config, budget), runs in groups.items():
        base = groups.get((baseline, budget))
        versus = None if base is None or config == baseline else \
            paired_comparison(per_seed(runs, metric), per_seed(base, metric))
        out.append(ConfigSummary(config, budget, runs, versus))
    return out


def sweep_jobs(sweep_dir: Path, command: str) -> list[Path]:
    """The finished runs of a multirun folder (a checkpoint at the end of the budget), in job order:
    `<job number>`, `<job number>_<name>...`; `command` is what makes such a sweep, for the error message."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise UserError(f"{sweep_dir} is not a folder; pass the sweep folder `{command}` wrote")
    runs = sorted((p for p in _job_folders(sweep_dir) if finished(p)), key=_job_order)
    if not runs:
        raise UserError(f"no finished runs (checkpoints/last at the end of the budget) in {sweep_dir}; run "
                        f"`{command}` first")
    return runs


def failed_jobs(sweep_dir: Path) -> list[dict]:
    """The jobs of a multirun folder that did not finish, as `{"job": ..., "reason": ...}`: started ones by
    their folder, those that never started as `job <number>` (see the module docstring)."""
    sweep_dir = Path(sweep_dir)
    out = [{"job": p.name, "reason": _why_unfinished(p)}
           for p in sorted(_job_folders(sweep_dir), key=_job_order) if not finished(p)]
    started = {_job_order(p)[0] for p in _job_folders(sweep_dir)}
    expected = expected_jobs(sweep_dir)
    for number in range(expected or 0):
        if number not in started:
            out.append({"job": f"job {number}", "reason": "never started (the sweep stopped before it)"})
    return out


def failed_note(failed: list[dict] | None) -> list[str]:
    """A report's lines naming the jobs of its sweep that did not finish (their configs show fewer seeds)."""
    if not failed:
        return []
    jobs = "; ".join(f"`{f['job']}`: {f['reason']}" for f in failed)
    return ["", f"**Not in the table: {len(failed)} job(s) of the sweep did not finish** ({jobs})."]


def finished(run: Path) -> bool:
    """Whether `run`'s last checkpoint was written at the end of its budget (not by a run that stopped)."""
    from minigpt.training.budget import Budget, parse_duration

    path = Path(run) / "checkpoints" / "last"
    if not (path / "meta.json").is_file():
        return False
    meta = ckpt.read_meta(path)
    trainer, tokens = meta["config"]["trainer"], int(meta["tokens_seen"])
    max_time = trainer.get("max_time")
    budget = Budget(max_steps=trainer.get("max_steps"), max_tokens=trainer.get("max_tokens"),
                    max_seconds=None if max_time is None else parse_duration(max_time),
                    max_flops=trainer.get("max_flops"),
                    max_tokens_per_param=trainer.get("max_tokens_per_param"),
                    flops_per_token=float(meta.get("flops") or 0.0) / max(tokens, 1) or 1.0,
                    params=int(meta.get("params") or 1))
    return budget.done(int(meta["step"]), float(meta.get("train_seconds") or 0.0), tokens)


def expected_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the multirun in `sweep_dir` launched: the product of the lengths of its `a,b,c` sweeps
    (Hydra's `multirun.yaml`); None where it cannot tell (no file, or a range/glob sweep)."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return None
    config = _load_yaml(path)
    try:
        overrides = config["hydra"]["overrides"]["task"]
    except (KeyError, TypeError):
        raise UserError(f"{path} has no hydra.overrides.task: it is not Hydra's multirun record") from None
    count = 1
    for override in overrides:
        value = str(override).split("=", 1)[-1]
        if value.startswith(("range(", "glob(", "interval(", "tag(", "sort(", "shuffle(")):
            return None
        count *= len(sweep_values(value.removeprefix("choice(").removesuffix(")")))
    return count


def sweep_values(value: str) -> list[str]:
    """`a,b,[c,d]` -> [`a`, `b`, `[c,d]`]: Hydra's sweep commas, not those inside brackets or quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(value):
        if quote:
            quote = "" if ch == quote and value[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(value[start:i])
            start = i + 1
    return [*parts, value[start:]]


def _job_folders(sweep_dir: Path) -> list[Path]:
    """The folders of a multirun's jobs: those Hydra recorded a job in (`.hydra/`)."""
    return [p for p in Path(sweep_dir).iterdir() if p.is_dir() and (p / ".hydra").is_dir()]


def _job_order(p: Path) -> tuple[int, str]:
    head = p.name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, p.name)


def _why_unfinished(run: Path) -> str:
    if not (run / "checkpoints" / "last" / "meta.json").is_file():
        return "no checkpoint: it failed before its first one (its train.log says why)"
    step = ckpt.read_meta(run / "checkpoints" / "last")["step"]
    return f"stopped at step {step}, before the end of its budget (its train.log says why)"


def newest_sweep(root: Path, command: str) -> Path:
    """The newest multirun folder under `root` (`<root>/<date>/<time>/multirun.yaml`)."""
    sweeps = [p.parent for p in Path(root).glob("*/*/multirun.yaml")] if Path(root).is_dir() else []
    if not sweeps:
        raise UserError(f"no sweep under {root}; run `{command}` first (or pass sweep=<folder>)")
    return max(sweeps, key=lambda p: p.stat().st_mtime)


def machines(rows: list[RunRecord]) -> str:
    """`AMD EPYC 9R14, 2 cores, bfloat16, torch 2.13.0+cpu (2026-12-01)`, one per machine and date."""
    seen = []
    for r in rows:
        m = r.machine
        device = m.get("gpu") or f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores"
        seen.append(f"{device}, {m.get('dtype', '?')}, torch {m.get('torch', '?')} ({r.date})")
    return "; ".join(dict.fromkeys(seen)) or "no runs yet"


def replace_block(text: str, begin: str, end: str, block: str, name: str) -> str:
    """`text` with everything from `begin` to `end` (markers included) replaced by `block`, which carries
    its own markers; refused, naming the file, when the markers are missing."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise UserError(f"{name} has no {begin} ... {end} block; put the two markers where the table goes")
    return text[:start] + block + text[stop + len(end):]


def save_state(path: Path, state: dict) -> None:
    """Write a resumable tool's `state` as JSON through a temporary file and a rename: a crash never leaves
    half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
