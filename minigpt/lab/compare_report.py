"""What scripts/compare.py prints and documents: a comparison's pairs and verdict, the table of every
comparison in docs/comparisons.md, and the table of the sequential test's simulated error rate and power.

docs/comparisons.json holds every documented comparison (`{"comparisons": [<compare.json>, ...]}`, one per
name: a rerun replaces it) and the block between docs/comparisons.md's `compare` markers is rendered from it;
the block between its `compare-simulation` markers is `simulation_table` of the documented settings. Neither
is typed: tests/lab/test_compare.py checks both.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minigpt.errors import UserError
from minigpt.lab.compare import differences, pairs, verdict_of
from minigpt.lab.compare_sequential import confidence_sequence, simulate
from minigpt.lab.runs import RunRecord, budget_unit, machines, replace_block

BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
SIM_BEGIN, SIM_END = "<!-- compare-simulation:begin -->", "<!-- compare-simulation:end -->"
UNITS = {"bits_per_byte": "bits/byte", "val_loss": "nats/token"}
# The documented simulation: effects and min_effect in units of the paired differences' sd
SIM_EFFECTS = (0.0, 0.5, 1.0, 2.0)
SIM_MIN_EFFECT = 0.5
SIM_CAPS = (6, 12, 24)
SIM_REPEATS = 20_000
SIM_SEED = 0


def pairs_table(state: dict) -> str:
    """Markdown: one line per pair, with the confidence sequence after it."""
    metric = state["spec"]["metric"]
    unit = UNITS[metric]
    lines = [f"| seed | baseline ({unit}) | candidate ({unit}) | difference | mean difference (95% "
             "confidence sequence) after this pair |", "|---|---|---|---|---|"]
    diffs = differences(state)
    for k, (seed, b, c) in enumerate(pairs(state)):
        cs = confidence_sequence(diffs[: k + 1], state["spec"]["alpha"], state["spec"]["prior_scale"])
        lines.append(f"| {seed} | {getattr(b, metric):.4f} | {getattr(c, metric):.4f} | {diffs[k]:+.4f} | "
                     f"{cs.text()} |")
    return "\n".join(lines)


def report(state: dict, max_pairs: int) -> str:
    """What the command prints: the arms, the pairs, the verdict."""
    spec = state["spec"]
    verdict = verdict_of(state, max_pairs)
    budget = _budget(state)
    head = [f"# {state['name']}", "", f"baseline:  {' '.join(spec['baseline']) or '(the default run)'}",
            f"candidate: {' '.join(spec['candidate'])}", f"budget:    {budget}",
            f"metric:    {spec['metric']} ({UNITS[spec['metric']]}, lower is better), min_effect "
            f"{spec['min_effect']:g}, alpha {spec['alpha']:g}", ""]
    text = verdict.text(UNITS[spec["metric"]]) if verdict is not None else "no pairs yet"
    return "\n".join([*head, pairs_table(state), "", f"verdict: {text}"])


def _budget(state: dict) -> str:
    budgets = sorted({r["budget"] for r in state["runs"]})
    return " / ".join(budget_unit(b) for b in budgets) if budgets else "-"


# --------------------------------------------------------------------------------------- the documented table


def load_results(path: Path) -> dict:
    """docs/comparisons.json, or an empty one if it does not exist."""
    if not path.exists():
        return {"comparisons": []}
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        [c["name"] for c in results["comparisons"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a comparisons results file ({type(e).__name__}: {e}); fix it, or "
                        "move it away to start a new one") from None
    return results


def merge(results: dict, state: dict) -> dict:
    """`results` with `state` added, replacing the comparison of the same name."""
    others = [c for c in results["comparisons"] if c["name"] != state["name"]]
    return {"comparisons": [*others, state]}


def render_block(results: dict) -> str:
    """The doc's block, markers included: one line per comparison."""
    if not results["comparisons"]:
        raise UserError("no comparisons to tabulate")
    head = ["comparison", "budget", "metric", "min_effect", "verdict", "pairs (seeds)",
            "mean difference (95% confidence sequence)"]
    lines = [BEGIN, "<!-- written by scripts/compare.py from docs/comparisons.json; do not edit by hand -->",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for state in results["comparisons"]:
        spec, verdict = state["spec"], state["verdict"]
        if verdict is None:
            raise UserError(f"comparison {state['name']!r} has no verdict yet; finish it before documenting "
                            "it")
        seeds = [seed for seed, _, _ in pairs(state)]
        cs = confidence_sequence(differences(state), spec["alpha"], spec["prior_scale"])
        cells = [f"`{state['name']}`", _budget(state), UNITS[spec["metric"]], f"{spec['min_effect']:g}",
                 f"**{verdict['kind']}**", f"{len(seeds)} ({seeds[0]}-{seeds[-1]})",
                 f"{cs.text()}"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        rows += [RunRecord(**{k: v for k, v in r.items() if k != "arm"}) for r in state["runs"]]
    lines += ["", f"Measured on: {machines(rows)}.", END]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the simulation


def simulation_rows(alpha: float, prior_scale: float, repeats: int = SIM_REPEATS, seed: int = SIM_SEED):
    """`simulate` over the documented effects and caps (one generator, in this order: reproducible)."""
    rng = np.random.default_rng(seed)
    return [simulate(e, SIM_MIN_EFFECT, cap, repeats, rng, alpha=alpha, prior_scale=prior_scale)
            for cap in SIM_CAPS for e in SIM_EFFECTS]


def simulation_table(alpha: float, prior_scale: float, repeats: int = SIM_REPEATS) -> str:
    """The block of docs/comparisons.md, markers included: the shares of each verdict by true effect and cap.
    A 95% Monte Carlo margin of a share p is 1.96 sqrt(p (1 - p) / repeats)."""
    margin = 1.96 * (0.05 * 0.95 / repeats) ** 0.5
    head = ["true difference (sds)", "max pairs", "better", "worse", "equivalent", "undecided",
            "pairs used (mean)"]
    lines = [SIM_BEGIN, "<!-- written by `python scripts/compare.py mode=simulate docs=true`; do not edit "
             "by hand -->", "", f"{repeats:,} simulated comparisons per line: normal paired differences of "
             f"sd 1, min_effect = {SIM_MIN_EFFECT:g}, alpha = {alpha:g}, prior scale {prior_scale:g}, a look "
             f"after every pair. The Monte Carlo margin (95%) of a share near 0.05 is ±{margin:.4f}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in simulation_rows(alpha, prior_scale, repeats):
        cells = [f"{s.effect:+g}", str(s.max_pairs), *(f"{x:.4f}" for x in (s.better, s.worse, s.equivalent,
                 s.undecided)), f"{s.mean_pairs:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, SIM_END])


def write_doc(doc: Path, begin: str, end: str, block: str | None) -> None:
    """Replace the block between `begin` and `end` in `doc`; refused, the file untouched, without the file
    or the markers. `block` None: only check that it could be written."""
    if not doc.is_file():
        raise UserError(f"doc={doc} does not exist (the file that holds the comparisons)")
    text = doc.read_text(encoding="utf-8")
    new = replace_block(text, begin, end, block or "", str(doc))
    if block is not None:
        doc.write_text(new, encoding="utf-8")


def render_into(doc: Path, results_path: Path) -> str:
    """Rewrite `doc`'s block from `results_path` alone; a missing or empty results file is refused (the doc
    is left as it is: a mistyped path must not empty the documented table)."""
    if not results_path.is_file():
        raise UserError(f"results={results_path} does not exist; nothing to render (the doc is left as it "
                        "is)")
    results = load_results(results_path)
    if not results["comparisons"]:
        raise UserError(f"results={results_path} holds no comparisons; nothing to render (the doc is left as "
                        "it is)")
    block = render_block(results)
    write_doc(doc, BEGIN, END, block)
    return block


def document(state: dict, doc: Path, results_path: Path) -> str:
    """Merge the finished comparison `state` into `results_path` and rewrite `doc`'s block from it."""
    results = merge(load_results(results_path), state)
    block = render_block(results)
    write_doc(doc, BEGIN, END, None)
    results_path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    write_doc(doc, BEGIN, END, block)
    return block
