"""The CPU speedrun: which config learns the most for the same compute, and is the difference real?

`make speedrun SEEDS=3` trains every config of `configs/experiment/speedrun/` (`default`, the Llama-style
run, first: the baseline) with seeds 1337, 1338, ... as one Hydra multirun of `scripts/train.py`, every job
with the same budget of model FLOPs (`trainer.max_flops`, set in `speedrun/default.yaml`). FLOPs are counted,
not timed, so a busy machine changes how long the sweep takes, not what it measures.
`scripts/speedrun.py sweep=<folder>` then scores every job on the whole val split and writes one row per run
(`runs.RunRecord`) into the sweep's speedrun.json and speedrun.md; with `docs=true` it also merges the rows
into docs/speedrun.json and rewrites the table in docs/speedrun.md between two markers. The table is never
typed: a test checks that the doc shows what the JSON renders to.

Each line of the table is one config over its seeds: the mean ± a 95% interval of val loss and bits per byte,
and the paired comparison with the baseline config (same seeds: the same batches in the same order) with
its p-value; lines within noise of the baseline say so (`stats.py`).

Scoring is exactly `scripts/evaluate.py stride=<block_size>`: every val token once, in disjoint windows of
the model's context, with its loss and bits per byte (`inspect/perplexity.py`: nats / ln 2 per UTF-8 byte of
the scored text). The comparison is in bits per byte, which is fair across tokenizers (a bigger vocabulary
makes fewer, harder tokens) and, for one tokenizer, the loss scaled by a constant.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import resolve_checkpoint
from minigpt.device.config import InferenceDeviceConfig
from minigpt.errors import UserError
from minigpt.inspect.config import EvaluateConfig
from minigpt.inspect.perplexity import evaluate
from minigpt.lab.runs import (
    ConfigSummary,
    RunRecord,
    budget_unit,
    failed_jobs,
    failed_note,
    machines,
    read_record,
    replace_block,
    summarize,
    sweep_jobs,
)
from minigpt.lab.stats import ALPHA

BEGIN, END = "<!-- speedrun:begin -->", "<!-- speedrun:end -->"
METRIC = "bits_per_byte"  # what the lines are compared on


def score_run(run: Path) -> RunRecord:
    """Evaluate a finished run on its whole val split and describe it as a row."""
    meta = ckpt.read_meta(resolve_checkpoint(run))
    block = meta["model_config"]["block_size"]
    cfg = EvaluateConfig(checkpoint=str(run), stride=block, device=InferenceDeviceConfig("cpu"))
    result, _ = evaluate(cfg)
    return read_record(run, result.loss, result.bpb)


# ---------------------------------------------------------------------------------------------- results


def new_results(rows: list[RunRecord], failed: list[dict] | None = None) -> dict:
    """A results file for one sweep: its rows, compared with the config of its first job, and the jobs that
    did not finish (`runs.failed_jobs`)."""
    if not rows:
        raise UserError("no runs to tabulate")
    return {"baseline": rows[0].config, "rows": [dataclasses.asdict(r) for r in rows], "failed": failed or []}


def load_results(path: Path) -> dict:
    """The results JSON (`{"baseline": config, "rows": [...], "failed": [...]}`), or an empty one if it does
    not exist yet."""
    if not path.exists():
        return {"baseline": None, "rows": [], "failed": []}
    try:
        results = json.loads(path.read_text())
        [RunRecord(**r) for r in results["rows"]]  # every row has exactly the fields of RunRecord
        results.setdefault("baseline", None)
        results.setdefault("failed", [])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a speedrun results file ({e}); fix it, or move it away to start "
                        "a new one") from None
    return results


def merge(results: dict, new: dict) -> dict:
    """`results` with the rows of `new` added: a rerun (same config, budget, seed and machine) replaces the
    old row. The baseline stays the one `results` had, if any; the failed jobs are the new sweep's."""
    rows = {RunRecord(**r).key: r for r in results["rows"]}
    rows.update({RunRecord(**r).key: r for r in new["rows"]})
    return {"baseline": results.get("baseline") or new["baseline"], "rows": list(rows.values()),
            "failed": new.get("failed", [])}


def ordered(summaries: list[ConfigSummary], baseline: str) -> list[ConfigSummary]:
    """Budget by budget (as first seen), the baseline first, then best mean first."""
    budgets = list(dict.fromkeys(s.budget for s in summaries))
    return sorted(summaries, key=lambda s: (budgets.index(s.budget), s.config != baseline, s.mean(METRIC)))


def render_table(results: dict) -> str:
    """The doc's block, markers included: one line per config and budget, and how it was measured."""
    rows = [RunRecord(**r) for r in results["rows"]]
    baseline = results["baseline"]
    head = ["config", "budget", "seeds", "val loss (nats/token)", "bits per byte", "vs baseline (bits/byte)",
            "p", "steps", "tokens", "tokens/s"]
    lines = [BEGIN, "<!-- written by scripts/speedrun.py from docs/speedrun.json; do not edit by hand -->",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in ordered(summarize(rows, baseline, METRIC), baseline):
        name = f"`{s.config}`" + (" (baseline)" if s.config == baseline else "")
        cells = [name, budget_unit(s.budget), str(len(s.seeds)), s.interval("val_loss").text(),
                 s.interval(METRIC).text(), *versus_cells(s), f"{s.mean('steps'):,.0f}",
                 f"{s.mean('tokens'):,.0f}", f"{s.mean('tokens_per_s'):,.0f}"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    seeds = sorted({r.seed for r in rows})
    lines += ["", f"{footnote(seeds)} Measured on: {machines(rows)}.", *failed_note(results.get("failed")),
              END]
    return "\n".join(lines)


def versus_cells(s: ConfigSummary) -> list[str]:
    """The comparison with the baseline: `+0.012 ± 0.020 (noise)` and the p-value, or blanks."""
    if s.versus is None:
        return ["-", "-"]
    v = s.versus
    return [v.difference.text(signed=True) + v.label(), f"{v.p_value:.2g}" if v.tested else "-"]


def footnote(seeds: list[int]) -> str:
    return (f"Mean ± 95% interval over the seeds ({', '.join(map(str, seeds))}; Student t). vs baseline: the "
            "mean difference from the baseline run of the same seed ± its 95% interval, and the two-sided "
            f"p-value of the paired t-test; *noise*: p ≥ {ALPHA}, not distinguishable from the baseline by "
            "these seeds (a fixed number of seeds; `make compare` adds seeds until it can tell); *1 seed: no "
            "test*: one seed has no spread to judge its difference by. Val "
            "loss: the whole val split, every token once in disjoint windows of the model's context "
            "(`python scripts/evaluate.py checkpoint=<run> stride=<block_size>`); bits per byte: the same "
            "nats / ln 2 per UTF-8 byte of that text. Steps, tokens and tokens/s: means over the seeds; "
            "tokens/s is the training steps' wall-clock rate, which depends on the machine and its load.")


def update_doc(text: str, table: str, name: str) -> str:
    """`text` with the block between the markers replaced by `table`."""
    return replace_block(text, BEGIN, END, table, name)


def write_report(sweep: Path | None, results_path: Path, doc: Path | None) -> tuple[list[Path], str]:
    """Score `sweep`'s runs into its own speedrun.json and speedrun.md; with `doc`, also merge the rows into
    `results_path` and rewrite the table in `doc`. `sweep` None: score nothing, rewrite `doc` from
    `results_path`. Returns the paths written and the table. A missing doc or markers, a broken, missing or
    empty results file to render from, are refused before anything is scored or written."""
    if sweep is None and doc is None:
        raise ValueError("nothing to score and nothing to render")
    if doc is not None:
        if not doc.is_file():
            raise UserError(f"doc={doc} does not exist (the file that holds the speedrun table)")
        text = doc.read_text(encoding="utf-8")
        update_doc(text, "", doc.name)
        results = load_results(results_path)
        if not results["rows"] and (sweep is None or _has_rows(text)):
            what = "does not exist" if not results_path.exists() else "holds no rows"
            raise UserError(f"results={results_path} {what}: the table in {doc} would be rewritten without "
                            "the rows it shows; check the path (the doc is left as it is)")
    written: list[Path] = []
    if sweep is not None:
        new = new_results([score_run(job) for job in sweep_jobs(sweep, "make speedrun")], failed_jobs(sweep))
        (sweep / "speedrun.json").write_text(json.dumps(new, indent=2) + "\n")
        (sweep / "speedrun.md").write_text(f"# Speedrun: {sweep}\n\n{render_table(new)}\n")
        written += [sweep / "speedrun.json", sweep / "speedrun.md"]
        if doc is None:
            return written, render_table(new)
        results = merge(results, new)
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        written.append(results_path)
    table = render_table(results)
    doc.write_text(update_doc(text, table, doc.name), encoding="utf-8")
    return [*written, doc], table


def _has_rows(text: str) -> bool:
    """Whether the doc's table shows any config (a line of it starts with a backquoted config)."""
    block = text[text.find(BEGIN): text.find(END)]
    return any(line.startswith("| `") for line in block.splitlines())
