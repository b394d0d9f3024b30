"""scripts/compare.py: is the candidate better than the baseline? Seeds are added until the answer is known.

A comparison is two arms, each a list of overrides of scripts/train.py (an experiment file, or keys), trained
at one budget of work (`budget`: the arms' own FLOPs budget unless given) with seeds first_seed,
first_seed + 1, ...: the same seed gives both arms the same batches in the same order and, where their
shapes agree, the same initial weights, so the difference of a pair, d = candidate - baseline of `metric`
(bits per byte on the whole val split by default), is free of much of the seed's luck. Pairs are trained
`pairs_per_look` at a time, the two arms side by side (compare_runs.py); after each group the sequential
test (compare_sequential.py) looks at every difference so far and stops at the first of

    better / worse        the confidence sequence of the mean difference excludes 0
    equivalent            it lies inside ±min_effect
    undecided             max_pairs pairs, neither: it says what size of difference the pairs could see

Every finished run is a row of `<out>/compare.json` (runs.RunRecord, with its arm) as soon as it is scored,
so a comparison that was stopped (Ctrl-C, a failed run, a full disk) resumes where it stopped when the same
command is run again; a half-trained run continues from its checkpoint. The guarantee of the sequential test
does not depend on when anyone looks, so resuming, looking in groups, or raising max_pairs after an
undecided verdict keeps it. Settings the verdict depends on (arms, budget, metric, min_effect, alpha, prior
scale, first seed) must be those the file was started with.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from minigpt.errors import UserError
from minigpt.lab.compare_runs import Multirun, check_not_a_sweep, failure_line, run_together
from minigpt.lab.compare_sequential import Verdict, decide
from minigpt.lab.runs import RunRecord, finished, save_state

log = logging.getLogger(__name__)

ARMS = ("baseline", "candidate")
RESULTS = "compare.json"
METRICS = ("bits_per_byte", "val_loss")


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a comparison's verdict depends on (a resumed comparison must have the same)."""

    baseline: tuple[str, ...]
    candidate: tuple[str, ...]
    budget: tuple[str, ...]  # overrides after each arm's own; empty: the arms' own budgets
    metric: str = "bits_per_byte"
    min_effect: float = 0.01
    alpha: float = 0.05
    prior_scale: float = 2.0
    first_seed: int = 1337

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise UserError(f"metric={self.metric!r} is not one of: {', '.join(METRICS)}")
        if not self.min_effect > 0:
            raise UserError(f"min_effect={self.min_effect} must be > 0 (the smallest difference that "
                            "matters, in the metric's unit)")
        if not 0 < self.alpha < 1:
            raise UserError(f"alpha={self.alpha} must be between 0 and 1 (e.g. 0.05)")
        if not self.prior_scale > 0:
            raise UserError(f"prior_scale={self.prior_scale} must be > 0")
        if tuple(self.baseline) == tuple(self.candidate):
            raise UserError("baseline and candidate are the same overrides; a comparison needs two configs")
        for arm in ARMS:
            check_not_a_sweep(arm, list(getattr(self, arm)))
        check_not_a_sweep("budget", list(self.budget))

    def arm(self, arm: str) -> tuple[str, ...]:
        """The arm's overrides, then the budget's (later ones win in Hydra)."""
        return (*getattr(self, arm), *self.budget)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


# ------------------------------------------------------------------------------------------- the state


def new_state(spec: Spec, name: str) -> dict:
    return {"name": name, "spec": spec.to_dict(), "runs": [], "failed": [], "verdict": None}


def load_state(path: Path, spec: Spec, name: str) -> dict:
    """The comparison in `path` (refused if it was started with other settings), or a new one."""
    if not path.exists():
        return new_state(spec, name)
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        [RunRecord(**{k: v for k, v in r.items() if k != "arm"}) for r in state["runs"]]
        old = state["spec"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a comparison's results file ({type(e).__name__}: {e}); move it away "
                        "to start again, or point out= elsewhere") from None
    new = spec.to_dict()
    changed = [f"{k}: {old.get(k)!r} there, {new[k]!r} now" for k in new if old.get(k) != new[k]]
    if changed:
        raise UserError(f"{path} holds a comparison with other settings ({'; '.join(changed)}); rerun it "
                        "with its own settings to resume it, or choose another out=")
    return state



def records(state: dict, arm: str) -> dict[int, RunRecord]:
    """The arm's finished runs, by seed."""
    return {r["seed"]: RunRecord(**{k: v for k, v in r.items() if k != "arm"})
            for r in state["runs"] if r["arm"] == arm}


def pairs(state: dict) -> list[tuple[int, RunRecord, RunRecord]]:
    """(seed, baseline run, candidate run) of every seed both arms finished, in seed order."""
    base, cand = records(state, "baseline"), records(state, "candidate")
    return [(seed, base[seed], cand[seed]) for seed in sorted(set(base) & set(cand))]


def differences(state: dict) -> list[float]:
    metric = state["spec"]["metric"]
    return [getattr(c, metric) - getattr(b, metric) for _, b, c in pairs(state)]


def verdict_of(state: dict, max_pairs: int) -> Verdict | None:
    """The verdict on the pairs so far (None before the first pair)."""
    spec, diffs = state["spec"], differences(state)
    if not diffs:
        return None
    return decide(diffs, spec["min_effect"], max_pairs, spec["alpha"], spec["prior_scale"])


# ------------------------------------------------------------------------------------------- the loop


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the pairs are trained (free to change when a comparison is resumed)."""

    max_pairs: int = 12
    pairs_per_look: int = 1
    side_by_side: bool = True  # the two arms at once; else one after the other, alternating which goes first
    threads: int = 1  # intra-op threads of each run
    train_args: tuple[str, ...] = ()  # more overrides for every run, e.g. hydra/launcher=slurm

    def __post_init__(self) -> None:
        for key in ("max_pairs", "pairs_per_look", "threads"):
            if getattr(self, key) < 1:
                raise UserError(f"{key}={getattr(self, key)} must be at least 1")


def run_comparison(spec: Spec, schedule: Schedule, out: Path, name: str, score) -> dict:
    """Train and score pairs into `<out>/compare.json` until the verdict (see the module docstring).
    `score(run_folder) -> RunRecord` measures a finished run. Returns the final state."""
    path = out / RESULTS
    state = load_state(path, spec, name)
    group = 0
    while True:
        verdict = verdict_of(state, schedule.max_pairs)
        if verdict is not None and (verdict.decided or verdict.sequence.n >= schedule.max_pairs):
            break
        if verdict is not None:
            log.info("after %s", verdict.text())
        todo = next_seeds(state, spec.first_seed, schedule)
        failed = train_group(spec, schedule, out, todo, group)
        for arm in ARMS:  # every finished run is scored and saved at once, those of a failed group too
            for seed in todo[arm]:
                run = out / arm / f"seed{seed}"
                if all(run != f[1] for f in failed):
                    state["runs"].append({"arm": arm, **dataclasses.asdict(score(run))})
                    save_state(path, state)
        state["failed"] = [{"seed": s, "arm": run.parent.name, "reason": failure_line(run, lg)}
                           for s, run, lg in failed]
        save_state(path, state)
        if failed:
            raise UserError(f"{state['failed'][0]['reason']}; the runs so far are kept in {path}: run the "
                            "same command again to resume")
        group += 1
    state["verdict"] = {"kind": verdict.kind, "pairs": verdict.sequence.n, "text": verdict.text(),
                        **dataclasses.asdict(verdict.sequence), "max_pairs": schedule.max_pairs}
    save_state(path, state)
    return state


def next_seeds(state: dict, first_seed: int, schedule: Schedule) -> dict[str, list[int]]:
    """Per arm, the seeds of the next `pairs_per_look` pairs not yet complete that it has not finished."""
    complete = {seed for seed, _, _ in pairs(state)}
    seeds = [s for s in range(first_seed, first_seed + schedule.max_pairs) if s not in complete]
    seeds = seeds[:schedule.pairs_per_look]
    return {arm: [s for s in seeds if s not in records(state, arm)] for arm in ARMS}


def train_group(spec: Spec, schedule: Schedule, out: Path, todo: dict[str, list[int]],
                group: int) -> list[tuple[int, Path, Path]]:
    """Train the runs of `todo` not finished yet (one finished before a stop is only scored: resuming it
    would be refused): both arms at once, or one after the other (which one first alternates). Returns
    those that did not finish: (seed, run folder, log)."""
    todo = {arm: [s for s in seeds if not finished(out / arm / f"seed{s}")] for arm, seeds in todo.items()}
    multiruns = [Multirun(spec.arm(arm), tuple(todo[arm]), out / arm,
                          out / "logs" / f"{arm}-seed{todo[arm][0]}.log") for arm in ARMS if todo[arm]]
    batches = [multiruns] if schedule.side_by_side else [[m] for m in multiruns[:: -1 if group % 2 else 1]]
    args = list(schedule.train_args)
    return [f for batch in batches for f in run_together(batch, args, schedule.threads)]


BUDGET_LIMITS = ("max_steps", "max_time", "max_tokens", "max_flops", "max_tokens_per_param")


def check_budgets(baseline: dict, candidate: dict) -> None:
    """Both arms' resolved `trainer` configs must set one budget of work, the same (a time budget buys a
    busy machine fewer steps, so it is no measure of work): refused before anything is trained."""
    limits = [{k: t.get(k) for k in BUDGET_LIMITS if t.get(k) is not None} for t in (baseline, candidate)]
    if limits[0] != limits[1]:
        raise UserError(f"the arms have different budgets (baseline {limits[0]}, candidate {limits[1]}); "
                        "give both one with budget=[...], e.g. "
                        "budget=[trainer.max_steps=null,trainer.max_flops=8.16e12]")
    if "max_time" in limits[0]:
        raise UserError("trainer.max_time buys a busy machine fewer steps: compare at a budget of work, e.g. "
                        "budget=[trainer.max_time=null,trainer.max_flops=8.16e12]")
