"""The technique screen's tables: each arm against its control, paired over seeds, one table per round.

An arm is a folder of runs `<arm>/s<seed>/` trained by `scripts/train.py` with the same common overrides
(budget, seed, evaluation) and its own changes; its control is the arm with the same budget and no change.
`collect(root)` reads each run's final checkpoint (meta.json: the val loss on the whole val split when the
run was trained with trainer.eval_tokens=all, bits per byte, training seconds) into a JSON-able dict, one
round of the screen; docs/tricks.json holds every round by name (`{"rounds": {name: round}}`), measured
against the default of its day, and `render_block(round)` writes a round's table between that round's two
markers in docs/tricks.md, so its numbers are never typed (a test checks the page against the JSON).

The comparison is paired (lab/stats.py): seed s of an arm and seed s of its control share the order of the
batches and, where the switch adds no parameters, the initial weights, so the per-seed differences carry
less noise than the two means do; the table gives the mean difference with its 95% Student-t interval and
the two-sided paired t-test's p. Nats per token compare arms with one vocabulary; where an arm or its
control changes `tokenizer.vocab_size` the difference is taken in bits per byte, which do not depend on it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from minigpt.errors import UserError
from minigpt.lab.stats import Paired, paired_comparison

VOCAB_KEY = "tokenizer.vocab_size"  # an arm that changes it is compared in bits per byte
# overrides every run of a screen shares; what is left of a run's overrides is its arm's change
COMMON = ("trainer.seed=", "trainer.max_steps=", "trainer.eval_every=", "trainer.eval_tokens=",
          "trainer.ckpt_every=", "logging.", "device.type=")


def read_json(file: Path, what: str) -> dict:
    """The JSON object in `file`; UserError naming the file when it is missing, damaged or not `what`."""
    try:
        doc = json.loads(Path(file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{file} does not exist ({what} expected there)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{file} cannot be read as {what}: {e}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{file} holds no JSON object; it is not {what}")
    return doc


def _read_run(run: Path) -> tuple[list[str], dict]:
    file = run / "checkpoints" / "last" / "meta.json"
    meta = read_json(file, "a finished run's meta.json")
    try:
        result = {"val_loss": meta["val_loss"], "bits_per_byte": meta["val_bpb"], "step": meta["step"],
                  "train_seconds": meta["train_seconds"], "eval_tokens": meta["eval"]["eval_tokens"]}
    except (KeyError, TypeError) as e:
        raise UserError(f"{file} lacks {e}: not the meta.json of a run of scripts/train.py") from None
    overrides = run / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        raise UserError(f"{run} has no .hydra/overrides.yaml (not a run folder of scripts/train.py)")
    lines = [line.removeprefix("- ").strip() for line in overrides.read_text().splitlines()
             if line.startswith("- ")]
    return [o for o in lines if not o.startswith(COMMON)], result


def collect(root: Path, controls: dict[str, str] | None = None) -> dict:
    """Every finished run under `root/<arm>/s<seed>/` by arm, each arm with its change and control: the arm
    of the same steps without a change, or the one `controls` names (an equal-time arm, trained for fewer
    steps than its control because each of its steps costs more)."""
    controls = controls or {}
    arms: dict[str, dict] = {}
    for run in sorted(Path(root).glob("*/s[0-9]*/checkpoints/last/meta.json")):
        run_dir = run.parents[2]
        change, result = _read_run(run_dir)
        arm = arms.setdefault(run_dir.parent.name, {"change": change, "runs": {}})
        if change != arm["change"]:
            raise UserError(f"{run_dir} changes {change}, unlike the other runs of its arm ({arm['change']})")
        arm["runs"][run_dir.name.removeprefix("s")] = result
    if not arms:
        raise UserError(f"no finished runs under {root} (expected <arm>/s<seed>/checkpoints/last/meta.json)")
    for arm in arms.values():
        arm["steps"] = max(r["step"] for r in arm["runs"].values())
    unknown = sorted(({*controls, *controls.values()}) - set(arms))
    if unknown:
        raise UserError(f"no finished runs of arm {unknown[0]!r} under {root} (named as an arm or a control)")
    for name, arm in arms.items():
        same = [c for c, a in arms.items() if not a["change"] and a["steps"] == arm["steps"]]
        arm["control"] = controls.get(name) or (same[0] if arm["change"] and same else None)
    order = sorted(arms, key=lambda a: (arms[a]["steps"], bool(arms[a]["change"]), a))  # controls first
    return {"arms": {a: arms[a] for a in order}, "step_ratios": {}}


def markers(round_name: str) -> tuple[str, str]:
    """The two lines a round's table sits between in the page."""
    return f"<!-- tricks:{round_name}:begin -->", f"<!-- tricks:{round_name}:end -->"


def metric(doc: dict, name: str) -> str:
    """`val_loss`, or `bits_per_byte` where the arm or its control changes the vocabulary."""
    arm = doc["arms"][name]
    changes = [*arm["change"], *(doc["arms"][arm["control"]]["change"] if arm["control"] else [])]
    return "bits_per_byte" if any(c.startswith(VOCAB_KEY + "=") for c in changes) else "val_loss"


def compare(doc: dict, name: str) -> Paired | None:
    """The paired comparison of arm `name` with its control over the seeds both have (in `metric`)."""
    arm = doc["arms"][name]
    if arm["control"] is None:
        return None
    key = metric(doc, name)
    values = {a: {int(seed): r[key] for seed, r in doc["arms"][a]["runs"].items()}
              for a in (name, arm["control"])}
    return paired_comparison(values[name], values[arm["control"]])


def shown_change(doc: dict, name: str) -> list[str]:
    """The overrides the table shows for arm `name`: those beyond its control's, marked `+ ...`, where the arm
    keeps every key its control overrides; else all of them."""
    arm = doc["arms"][name]
    base = doc["arms"][arm["control"]]["change"] if arm["control"] else []
    kept = {o.split("=", 1)[0] for o in arm["change"]}
    if not base or any(o.split("=", 1)[0] not in kept for o in base):
        return arm["change"]
    return [f"+ {o}" for o in arm["change"] if o not in base]


def render_block(doc: dict) -> str:
    """A round's table: one row per arm in the JSON's order, its mean, its paired difference from its
    control (nats per token, or bits per byte across vocabularies)."""
    lines = ["| arm | change | steps | seeds | val loss (mean) | bits/byte | vs control: Δ ± 95% interval | "
             "paired p | step time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, arm in doc["arms"].items():
        runs = list(arm["runs"].values())
        loss = sum(r["val_loss"] for r in runs) / len(runs)
        bpb = sum(r["bits_per_byte"] for r in runs) / len(runs)
        c = compare(doc, name)
        if c is None:
            delta, p = "(control)" if not arm["change"] else "-", "-"
        else:
            unit = " bits/byte" if metric(doc, name) == "bits_per_byte" else ""
            delta = f"{c.difference.text(signed=True)}{unit} vs {arm['control']}"
            p = "-" if math.isnan(c.p_value) else f"{c.p_value:.3f}"
        ratio = doc["step_ratios"].get(name)
        change = " ".join(f"`{o}`" for o in shown_change(doc, name)) or "none (a control)"
        time = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"| {name} | {change} | {arm['steps']:,} | {len(runs)} | {loss:.3f} | {bpb:.3f} "
                     f"| {delta} | {p} | {time} |")
    return "\n".join(lines)


def replace_block(text: str, round_name: str, block: str) -> str:
    """`text` with the part between round `round_name`'s markers replaced by `block`."""
    begin, end = markers(round_name)
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise UserError(f"no {begin} ... {end} markers in the page to update")
    return pattern.sub(lambda _: f"{begin}\n{block}\n{end}", text)


def page_block(text: str, round_name: str) -> str:
    """The text between round `round_name`'s markers (what `replace_block` wrote)."""
    begin, end = markers(round_name)
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def step_ratios(bench_json: Path | None, arms: dict) -> dict[str, float]:
    """Each arm's step time relative to the default's, from the bench's techniques section (`python
    scripts/bench.py 'only=[techniques]' json_out=...`), for the arms named `<prefix>_<technique>`."""
    if bench_json is None:
        return {}
    bench = read_json(bench_json, "a bench JSON")
    try:
        rows = bench["sections"]["techniques"]["rows"]
    except (KeyError, TypeError):
        raise UserError(f"{bench_json} has no techniques section (python scripts/bench.py "
                        "'only=[techniques]' json_out=...)") from None
    found = {}
    for arm in arms:
        technique = arm.split("_", 1)[-1]
        if technique in rows:  # the CPU-time ratio where the bench has it (steady on a shared machine)
            found[arm] = rows[technique].get("cpu_ratio", rows[technique]["ratio"])
    return found


def write_round(name: str, doc: dict, results: Path, page: Path) -> list[Path]:
    """Round `name` of the screen (`collect`'s dict, its step ratios filled in) into `results` (the other
    rounds there kept) and its table into `page`, between its markers; returns what was written. Everything
    is read and checked before anything is written."""
    text = _page_with_markers(page, [name])
    saved = read_json(results, "the screen's JSON") if results.is_file() else {"rounds": {}}
    saved.setdefault("rounds", {})[name] = doc
    text = replace_block(text, name, render_block(doc))
    results.write_text(json.dumps(saved, indent=1) + "\n")
    page.write_text(text)
    return [results, page]


def render_rounds(results: Path, page: Path) -> list[Path]:
    """Every round of `results` rewritten as its table in `page` (nothing else read); returns the page."""
    rounds = read_json(results, "the screen's JSON").get("rounds")
    if not isinstance(rounds, dict) or not rounds:
        raise UserError(f"{results} holds no rounds to render ({{\"rounds\": {{name: round}}}})")
    text = _page_with_markers(page, list(rounds))
    for name, doc in rounds.items():
        try:
            block = render_block(doc)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # a hand-edited or damaged JSON
            raise UserError(f"{results}: round {name!r} is not what a report writes ({e!r})") from None
        text = replace_block(text, name, block)
    page.write_text(text)
    return [page]


def _page_with_markers(page: Path, names: list[str]) -> str:
    """The text of `page`; UserError unless it holds the markers of every round in `names`."""
    text = page.read_text() if page.is_file() else ""
    for name in names:
        begin, end = markers(name)
        if begin not in text or end not in text:
            raise UserError(f"{page} has no {begin} ... {end} markers to write the table between")
    return text
