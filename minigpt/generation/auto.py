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

from minigpt.fast.kept import StepCache
from minigpt.fast.whole_steps import eager_step_s
from minigpt.model.gpt import GPT


def choose_compile(model: GPT, rows: int, steps: int, cache: StepCache | None,
                   time_eager: Callable[[GPT, int], float] = eager_step_s) -> tuple[bool, str]:
    """Whether to compile `model`'s step that will decode `steps` tokens for each of `rows` rows, and why,
    from what `cache` knows (None: nothing, so eager): this model's compiled step's record, else the newest
    compiled step's on this machine; `time_eager` times the eager step, called only where it is needed."""
    if cache is None:
        return False, "eager: no decode-step cache to judge compiling by"
    key = cache.key(model.eval(), rows, True)
    kept = cache.peek(key)
    if kept is not None:
        if not kept.plan.compiled:
            return False, "eager: every compiled step was refused by the numbers gate here (kept)"
        eager, compiled = kept.times.get("eager"), kept.times.get("compiled")
        if kept.warm_s is None or eager is None or compiled is None:
            return True, f"compiled: the cache is warm (chosen and compiled once, in {kept.choose_s:.0f} s)"
        saving_s, cost_s, cost = eager - compiled, kept.warm_s, "its warm start of {:.1f} s (kept)"
    else:
        latest = cache.latest_compiled(key)
        if latest is None:
            return False, ("eager: nothing compiled on this machine yet to say what compiling costs "
                           "(compile=true)")
        ratio = latest.times["compiled"] / latest.times["eager"]
        saving_s, cost_s = time_eager(model, rows) * (1 - ratio), latest.choose_s
        cost = "choosing and compiling of {:.1f} s (estimated from the newest compiled step kept here)"
    saved = f"{steps} steps x {saving_s * 1e3:.2f} ms saved = {steps * saving_s:.1f} s"
    if steps * saving_s > cost_s:
        return True, f"compiled: {saved} > {cost.format(cost_s)}"
    return False, f"eager: {saved} < {cost.format(cost_s)}"
