"""The other gate, for a change that claims the same math, faster: first the same losses, then the speed.

`scripts/compare.py mode=speed` trains each arm for `steps` optimizer steps with one seed, `repeats` times,
one run at a time, baseline and candidate alternately (B C B C ...: a drift of the machine's speed hits
both). Every run logs its training loss at every step. The gate:

1. **Same losses.** Every run's loss at every step must equal the first baseline run's: bit for bit (the
   float32 value TensorBoard keeps) with `tolerance=0`, or within `tolerance` for a kernel that adds in
   another order (then say why in the command). A candidate that fails computes something else, and its
   speed is not compared: it needs the quality comparison (mode=quality) instead. A baseline that fails
   against itself is not deterministic on this machine, which the report says too.
2. **Speed**, only then: tokens per second of the training steps (evaluation and checkpoints excluded,
   `train_seconds` of each run's checkpoint), the median over the repeats of each arm, and their ratio with
   the range of the per-repeat ratios.

Timings are only worth something on a machine that does nothing else: before each run `CpuLoad`
(device/cpu_load.py) measures how many cores other processes keep busy, and the report warns when any
measurement was above the bench's threshold.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

from minigpt.checkpoint.format import read_meta
from minigpt.device.cpu_load import CpuLoad
from minigpt.errors import UserError
from minigpt.lab.bench.suite import BUSY_SECONDS, BUSY_WARNING
from minigpt.lab.compare_runs import Multirun, failure_line, run_together
from minigpt.lab.loss_curves import read_scalars

# Only the step count limits a speed run, and nothing but the training steps is timed or logged often.
STEP_BUDGET = ("trainer.max_flops=null", "trainer.max_tokens=null", "trainer.max_tokens_per_param=null",
               "trainer.max_time=null")
QUIET_RUN = ("logging.log_every=1", "trainer.eval_every=1000000", "trainer.ckpt_every=1000000",
             "logging.sample_tokens=0")


@dataclasses.dataclass
class SpeedRun:
    arm: str
    repeat: int
    losses: list[float]  # train/loss at steps 1..steps
    tokens_per_s: float
    busy_cores: float | None  # measured just before the run


def speed_runs(baseline: tuple[str, ...], candidate: tuple[str, ...], steps: int, repeats: int, seed: int,
               out: Path, threads: int | None, train_args: list[str]) -> list[SpeedRun]:
    """Train and read back `repeats` runs of each arm, alternately, one at a time."""
    if steps < 2 or repeats < 1:
        raise UserError(f"steps={steps} and repeats={repeats} must be at least 2 and 1")
    runs = []
    for repeat in range(repeats):
        for arm, overrides in (("baseline", baseline), ("candidate", candidate)):
            m = Multirun((*overrides, *STEP_BUDGET, f"trainer.max_steps={steps}", *QUIET_RUN), (seed,),
                         out / arm, out / "logs" / f"{arm}-r{repeat}.log", prefix=f"r{repeat}_")
            busy = CpuLoad().measure(BUSY_SECONDS)
            failed = run_together([m], train_args, threads)
            if failed:
                raise UserError(failure_line(failed[0][1], failed[0][2]))
            runs.append(read_speed_run(m.run_dir(seed), arm, repeat, busy))
    return runs


def read_speed_run(run: Path, arm: str, repeat: int, busy: float | None) -> SpeedRun:
    meta = read_meta(run / "checkpoints" / "last")
    _, losses = read_scalars(run / "tb")["train/loss"]
    return SpeedRun(arm, repeat, losses, meta["tokens_seen"] / max(meta["train_seconds"], 1e-9), busy)


def first_difference(a: list[float], b: list[float], tolerance: float) -> int | None:
    """The first step (1-based) at which the two loss curves differ by more than `tolerance`, or None."""
    if len(a) != len(b):
        return min(len(a), len(b)) + 1
    for step, (x, y) in enumerate(zip(a, b, strict=True), start=1):
        if not (x == y if tolerance == 0 else abs(x - y) <= tolerance) or math.isnan(x) != math.isnan(y):
            return step
    return None


def speed_verdict(runs: list[SpeedRun], tolerance: float) -> dict:
    """The gate's verdict as plain data: `kind` is not_the_same (candidate), not_deterministic (baseline),
    or same_losses with the speed ratio; `text` says it in one paragraph."""
    base = [r for r in runs if r.arm == "baseline"]
    cand = [r for r in runs if r.arm == "candidate"]
    same = "bit for bit" if tolerance == 0 else f"within {tolerance:g}"
    steps = len(base[0].losses)
    for r in base[1:]:
        step = first_difference(base[0].losses, r.losses, tolerance)
        if step is not None:
            return {"kind": "not_deterministic", "text": f"the baseline does not repeat its own losses "
                    f"{same} (repeat {r.repeat}, step {step}): nothing can be compared with it bit for bit "
                    "here; give a tolerance or compare quality (mode=quality)"}
    for r in cand:
        step = first_difference(base[0].losses, r.losses, tolerance)
        if step is not None:
            a, b = (x[step - 1] if step <= len(x) else math.nan for x in (base[0].losses, r.losses))
            return {"kind": "not_the_same", "text": f"not the same math: the losses differ at step {step} "
                    f"(baseline {a!r}, candidate {b!r}); its speed is not compared: compare its quality "
                    "with mode=quality"}
    b_rate = statistics.median(r.tokens_per_s for r in base)
    c_rate = statistics.median(r.tokens_per_s for r in cand)
    ratios = [c.tokens_per_s / b.tokens_per_s for b, c in zip(base, cand, strict=True)]
    busy = [r.busy_cores for r in runs if r.busy_cores is not None]
    text = (f"same losses {same} over {steps} steps; candidate {c_rate / b_rate:.3f}x the baseline's "
            f"tokens/s ({c_rate:,.0f} against {b_rate:,.0f}, medians of {len(base)} runs each; per-repeat "
            f"ratios {min(ratios):.3f} to {max(ratios):.3f})")
    if busy and max(busy) > BUSY_WARNING:
        text += (f". The machine was busy (up to {max(busy):.2f} cores taken by other processes before a "
                 "run): these timings are not to be trusted; measure again on a quiet machine")
    return {"kind": "same_losses", "text": text, "speedup": c_rate / b_rate, "ratios": ratios,
            "baseline_tokens_per_s": b_rate, "candidate_tokens_per_s": c_rate,
            "max_busy_cores": max(busy or [0])}


def run_gate(baseline: tuple[str, ...], candidate: tuple[str, ...], steps: int, repeats: int, seed: int,
             out: Path, threads: int | None, train_args: list[str], tolerance: float) -> dict:
    """Train the runs into a new `<out>/speed-<n>/` (timings are never reused), decide, and write the
    verdict with every run's losses and rate into its speed.json."""
    n = 0
    while (out / f"speed-{n}").exists():
        n += 1
    folder = out / f"speed-{n}"
    runs = speed_runs(baseline, candidate, steps, repeats, seed, folder, threads, train_args)
    verdict = speed_verdict(runs, tolerance)
    record = {"baseline": list(baseline), "candidate": list(candidate), "steps": steps, "seed": seed,
              "tolerance": tolerance, "verdict": verdict, "runs": [dataclasses.asdict(r) for r in runs]}
    (folder / "speed.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return verdict
