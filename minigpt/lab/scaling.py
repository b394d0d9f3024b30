"""The scaling ladder: IsoFLOP profiles, a fit of L(N, D), a prediction at a larger budget, then its run.

`make scaling` (scripts/scaling.py) trains the Llama-style block (`configs/experiment/scaling/w*.yaml`: the
demo model at several widths, heads of 16) at a few budgets of model FLOPs (`trainer.max_flops`), several
widths at each, every point with `seeds` seeds: an IsoFLOP profile per budget, the loss against the model
size at equal compute, whose minimum is the compute-optimal size for that budget. Every run is scored on the
whole val split (as the speedrun scores) and becomes a row of `<out>/ladder.json` as soon as it is, so a
stopped ladder resumes where it stopped. Then, in this order:

1. fit L(N, D) = E + A/N^alpha + B/D^beta to every run of the profiles (scaling_fit.py), with bootstrap
   intervals;
2. predict the held-out points, sizes trained at a budget larger than any profile's, and write the
   predictions into ladder.json *before* those runs are trained;
3. train the held-out points, and say whether each measured loss (the mean over its seeds) lies inside its
   95% prediction interval: the bootstrap's spread of the fitted law at that (N, D), widened by the spread
   of a mean of that many runs around the law (the refit's own residuals, drawn at random).

A ladder is one kind of budget: every run must have trained exactly its profile's FLOPs and nothing else
limits it (`check_budgets`): a run stopped by another limit, or a mix of budgets, is refused, naming each run
and the tokens per parameter it really trained. The report (scaling_report.py) is scaling.json, scaling.png,
scaling.md and TensorBoard logs in `<out>`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from minigpt.errors import UserError
from minigpt.lab.compare_runs import Multirun, failure_line, run_pool
from minigpt.lab.runs import RunRecord, budget_label, finished, save_state
from minigpt.lab.scaling_fit import LossLaw, bootstrap, fit_law, interval

STATE = "ladder.json"
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Point:
    """One size at one budget."""

    size: str  # the file of configs/experiment/scaling/
    flops: float  # trainer.max_flops
    held_out: bool = False

    @property
    def budget(self) -> str:
        return budget_label({"max_flops": self.flops})

    def folder(self, out: Path) -> Path:
        return out / f"flops{self.flops:.3g}"

    def run_dir(self, out: Path, seed: int) -> Path:
        return self.folder(out) / f"{self.size}_seed{seed}"


def ladder_points(profiles: list[tuple[float, list[str]]], held_out: tuple[float, list[str]]) -> list[Point]:
    """Every point of the ladder: the profiles', then the held-out ones. At least 3 profiles of 2 sizes."""
    if len(profiles) < 3 or any(len(sizes) < 2 for _, sizes in profiles):
        raise UserError(f"a ladder needs at least 3 budgets (profiles) of at least 2 sizes each; got "
                        f"{[(f'{f:g}', len(s)) for f, s in profiles]}")
    largest = max(f for f, _ in profiles)
    if not held_out[1] or held_out[0] <= largest:
        raise UserError(f"held_out must name sizes at a budget above the profiles' largest ({largest:g} "
                        "FLOPs)")
    return [*(Point(s, f) for f, sizes in profiles for s in sizes), *(Point(s, held_out[0], True)
                                                                      for s in held_out[1])]


def load_state(path: Path) -> dict:
    if not path.exists():
        return {"runs": [], "failed": [], "prediction": None}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        [RunRecord(**_record_fields(r)) for r in state["runs"]]
        state.setdefault("failed", [])
        state.setdefault("prediction", None)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a ladder's results file ({type(e).__name__}: {e}); move it away to "
                        "start again") from None
    return state



def _record_fields(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("size", "held_out")}


def records(state: dict, held_out: bool) -> list[tuple[str, RunRecord]]:
    return [(r["size"], RunRecord(**_record_fields(r))) for r in state["runs"] if r["held_out"] == held_out]


def score_finished(points: list[Point], seeds: list[int], out: Path, state: dict, score) -> set:
    """Score every finished run of `points` not in `state` yet (trained before the ladder was stopped, or by
    hand: a resumed finished run would refuse); returns the (size, budget, seed) of every scored run."""
    done = {(r["size"], r["budget"], r["seed"]) for r in state["runs"]}
    for p in points:
        for seed in seeds:
            if (p.size, p.budget, seed) not in done and finished(p.run_dir(out, seed)):
                state["runs"].append({"size": p.size, "held_out": p.held_out,
                                      **dataclasses.asdict(score(p.run_dir(out, seed)))})
                done.add((p.size, p.budget, seed))
                save_state(out / STATE, state)
    return done


def train_points(points: list[Point], seeds: list[int], out: Path, state: dict, score, train_args: list[str],
                 threads: int | None, jobs: int) -> None:
    """Train and score every (point, seed) not in `state` yet: one multirun per point (its seeds one after
    the other), `jobs` points at a time; each run's row saved as soon as its point is done. Failed runs are
    named in `state` and in the error."""
    done = score_finished(points, seeds, out, state, score)
    todo = [(p, tuple(s for s in seeds if (p.size, p.budget, s) not in done)) for p in points]
    todo = [(p, missing) for p, missing in todo if missing]
    multiruns = [Multirun((f"experiment=scaling/{p.size}", f"trainer.max_flops={p.flops:g}"), missing,
                          p.folder(out), out / "logs" / f"{p.size}-flops{p.flops:.3g}.log",
                          prefix=f"{p.size}_") for p, missing in todo]

    def trained(i: int) -> None:
        point, missing = todo[i]
        for seed in missing:
            row = dataclasses.asdict(score(multiruns[i].run_dir(seed)))
            state["runs"].append({"size": point.size, "held_out": point.held_out, **row})
        save_state(out / STATE, state)

    failed = run_pool(multiruns, train_args, threads, jobs, on_finished=trained)
    state["failed"] = [{"run": str(run), "reason": failure_line(run, log)} for _, run, log in failed]
    save_state(out / STATE, state)
    if failed:
        raise UserError(f"{state['failed'][0]['reason']} ({len(failed)} run(s) failed, all named in "
                        f"{out / STATE}); run the same command again to train what is missing")


def check_budgets(rows: list[tuple[str, RunRecord]], points: list[Point]) -> None:
    """Every run trained its own point's FLOPs budget and no other (see the module docstring)."""
    budgets = {p.budget for p in points}
    wrong = [(size, r) for size, r in rows if r.budget not in budgets]
    if wrong:
        shown = "; ".join(f"{size} seed {r.seed}: {r.budget or 'no budget'}, {r.tokens / r.params:.3g} "
                          "tokens per parameter" for size, r in wrong)
        raise UserError(f"a ladder compares runs at equal FLOPs, but these trained another budget: {shown}; "
                        f"retrain them at trainer.max_flops alone")


def fit_points(rows: list[tuple[str, RunRecord]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, D, L) of every run: parameters, tokens, val loss."""
    columns = ([r.params for _, r in rows], [r.tokens for _, r in rows], [r.val_loss for _, r in rows])
    n, d, loss = (np.array(c, dtype=float) for c in columns)
    return n, d, loss


def predict(law: LossLaw, fits: list[tuple[LossLaw, np.ndarray]], n: float, d: float, seeds: int,
            rng: np.random.Generator) -> dict:
    """The fitted loss at (n, d) with the bootstrap interval of the law, and the prediction interval of a
    mean of `seeds` new runs (each refit's prediction times the exp of the mean of `seeds` of its
    residuals, drawn at random)."""
    centre = [float(f(n, d)) for f, _ in fits]
    noisy = [c * float(np.exp(rng.choice(res, size=seeds).mean()))
             for c, (_, res) in zip(centre, fits, strict=True)]
    return {"params": n, "tokens": d, "predicted": float(law(n, d)),
            "law_interval": list(interval(centre, CONFIDENCE)), "interval": list(interval(noisy, CONFIDENCE))}


def planned_shape(point: Point, rows: list[tuple[str, RunRecord]]) -> tuple[int, int]:
    """(N, D) a held-out point will train, before it runs: its size's parameters, and the tokens of the first
    step at or past its FLOPs (FLOPs per token and tokens per step read from the size's runs)."""
    runs = [r for size, r in rows if size == point.size]
    if not runs:
        raise UserError(f"held-out size {point.size} is in no profile: train it at a smaller budget too, so "
                        "that its parameters and cost per token are known before it is predicted")
    r = runs[0]
    per_step, per_token = r.tokens // r.steps, r.flops / r.tokens
    steps = int(np.ceil(point.flops / (per_token * per_step)))
    return r.params, steps * per_step


@dataclasses.dataclass
class Ladder:
    """A fitted ladder: the state (runs, prediction), the fit and its bootstrap refits."""

    state: dict
    law: LossLaw
    fits: list[tuple[LossLaw, np.ndarray]]
    points: list[Point]
    seeds: list[int]


def run_ladder(points: list[Point], seeds: list[int], out: Path, score, *, train: bool = True,
               train_args: tuple[str, ...] = (), threads: int = 1, jobs: int = 2, repeats: int = 200,
               rng_seed: int = 0) -> Ladder:
    """Train the profiles, fit, predict the held-out points (saved before they train), train them."""
    out.mkdir(parents=True, exist_ok=True)
    state = load_state(out / STATE)
    profile, held = [p for p in points if not p.held_out], [p for p in points if p.held_out]
    if train:
        train_points(profile, seeds, out, state, score, list(train_args), threads, jobs)
    else:
        score_finished(profile, seeds, out, state, score)
    rows = records(state, held_out=False)
    if not rows:
        raise UserError(f"no finished runs in {out / STATE}; train the ladder first (train=true)")
    check_budgets(rows, profile)
    n, d, loss = fit_points(rows)
    law = fit_law(n, d, loss)
    fits = bootstrap(n, d, loss, law, repeats, np.random.default_rng(rng_seed))
    have = {(size, r.budget, r.seed) for size, r in rows}
    complete = all((p.size, p.budget, s) in have for p in profile for s in seeds)
    if state["prediction"] is None and complete:  # a prediction is made once, from the whole profile set
        rng = np.random.default_rng(rng_seed + 1)
        state["prediction"] = {p.size: {"flops": p.flops, **predict(law, fits, *planned_shape(p, rows),
                                                                    len(seeds), rng)} for p in held}
        save_state(out / STATE, state)
    if train:
        train_points(held, seeds, out, state, score, list(train_args), threads, jobs)
    elif state["prediction"] is not None:  # held-out runs are scored only against a prediction made before
        score_finished(held, seeds, out, state, score)
    check_budgets(records(state, held_out=True), held)
    return Ladder(state, law, fits, points, seeds)


def default_run_shape(run: Path) -> dict:
    """The Llama-style run (TrainConfig's defaults: `model=demo optim=muon`, `make train`'s run before the
    recipe) with the tokenizer of the ladder's run `run`: its non-embedding parameters and training tokens."""
    import torch

    from minigpt.checkpoint.format import read_meta
    from minigpt.model.factory import build_model
    from minigpt.training.config import TrainConfig

    cfg = TrainConfig()
    if cfg.trainer.max_steps is None:
        raise UserError("TrainConfig's defaults have no step budget: no tokens per parameter to state")
    vocab = read_meta(run / "checkpoints" / "last")["model_config"]["vocab_size"]
    with torch.device("meta"):  # shapes only: no memory, no time
        model = build_model(cfg.model, vocab_size=vocab)
    return {"params": model.num_params(),
            "tokens": cfg.trainer.max_steps * cfg.trainer.batch_size * cfg.model.block_size}
