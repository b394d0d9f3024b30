"""compile=auto: the decode step eager or compiled, whichever is expected to finish the tokens asked for
sooner, judged from what the decode-step cache (minigpt/fast/kept.py) knows of this machine.

Compiling pays where the steps decoded save more than the compiled step costs to get:

    steps x (eager step s - compiled step s)  >  seconds to start compiled

Where the cache holds this model's compiled step (warm), both step times are the ones measured when it was
chosen, and the start is its warm start (reading the cache, compiling from it, the numbers gate) once a run
has measured one; a warm cache whose start is not measured yet is used, and that run measures it. Where it
does not (cold), the start is choosing and compiling from nothing, and both it and the speedup are estimated
from the newest compiled step kept on this machine, for any model, with the eager step timed now; with
nothing kept here, the step is eager. The summary line says which and why.
"""

from __future__ import annotations

from collections.abc import Callable

from minigpt.fast.kept import Kept


def choose_compile(steps: int, kept: Kept | None, latest: Kept | None,
                   eager_step_s: Callable[[], float]) -> tuple[bool, str]:
    """Whether to compile a step that will decode `steps` tokens per row, and why, from `kept` (this model's
    compiled step's record, or None), `latest` (the newest compiled step's record on this machine, or None)
    and `eager_step_s` (times the eager step, called only where it is needed)."""
    if kept is not None:
        if not kept.plan.compiled:
            return False, "eager: every compiled step was refused by the numbers gate here (kept)"
        eager, compiled = kept.times.get("eager"), kept.times.get("compiled")
        if kept.warm_s is None or eager is None or compiled is None:
            return True, f"compiled: the cache is warm (chosen and compiled once, in {kept.choose_s:.0f} s)"
        return _weigh(steps, eager - compiled, kept.warm_s, "its warm start", "kept")
    if latest is None:
        return False, "eager: nothing compiled on this machine yet to say what compiling costs (compile=true)"
    eager = eager_step_s()
    ratio = latest.times["compiled"] / latest.times["eager"]
    return _weigh(steps, eager * (1 - ratio), latest.choose_s, "choosing and compiling",
                  "estimated from the newest compiled step kept here")


def _weigh(steps: int, saving_s: float, cost_s: float, cost: str, source: str) -> tuple[bool, str]:
    saved = f"{steps} steps x {saving_s * 1e3:.2f} ms saved = {steps * saving_s:.1f} s"
    if steps * saving_s > cost_s:
        return True, f"compiled: {saved} > {cost} of {cost_s:.1f} s ({source})"
    return False, f"eager: {saved} < {cost} of {cost_s:.1f} s ({source})"
