"""The CPU speedrun: which config learns the most in a fixed budget of training time.

`scripts/speedrun.py` runs a Hydra multirun of `scripts/train.py` over candidate configs, every job with the
same `trainer.max_time` and no step limit, scores each finished run on the whole validation split, adds the
rows to a results JSON (docs/speedrun.json) and renders them as the table between two markers in
docs/speedrun.md. The table is never typed: a test checks that docs/speedrun.md shows what the JSON
renders to.

Scoring is exactly `scripts/evaluate.py stride=<block_size>`: every val token once, in disjoint windows of
the model's context, with its loss and bits per byte (`inspect/perplexity.py`: nats / ln 2 per UTF-8 byte of
the scored text), which compares tokenizers fairly (a bigger vocabulary makes fewer, harder tokens).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import resolve_checkpoint
from minigpt.data.encode import cpu_count
from minigpt.device.config import InferenceDeviceConfig
from minigpt.device.probe import cpu_model
from minigpt.errors import UserError
from minigpt.inspect.config import EvaluateConfig
from minigpt.inspect.perplexity import evaluate

BEGIN, END = "<!-- speedrun:begin -->", "<!-- speedrun:end -->"
NO_STEP_LIMIT = "trainer.max_steps=null"  # the budget alone ends each run


@dataclasses.dataclass
class Row:
    """One finished run of the sweep, scored."""

    config: str  # the job's own overrides, without the budget's ("default": none)
    budget: str  # trainer.max_time
    val_loss: float  # nats per token, whole val split, stride = block
    bits_per_byte: float
    steps: int
    tokens: int  # training tokens seen
    tokens_per_s: float  # over the training time alone
    train_seconds: float
    command: str  # the training command that reproduces the run
    machine: str
    date: str


def sweep_command(overrides: list[str], budget: str, sweep_dir: Path) -> list[str]:
    """`python scripts/train.py -m <overrides> trainer.max_time=<budget> trainer.max_steps=null ...`."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "train.py"
    return [sys.executable, str(script), "-m", *overrides, f"trainer.max_time={budget}", NO_STEP_LIMIT,
            f"hydra.sweep.dir={sweep_dir}"]


def run_sweep(overrides: list[str], budget: str, sweep_dir: Path) -> list[Path]:
    """Run the multirun (its output goes to this terminal) and return its job folders in job order."""
    command = sweep_command(overrides, budget, sweep_dir)
    print("$ " + " ".join(map(shlex.quote, command[1:])), file=sys.stderr, flush=True)
    code = subprocess.run(command).returncode
    if code != 0:
        raise UserError(f"the sweep stopped with exit code {code} (its message is above); nothing was scored")
    jobs = sorted((p for p in sweep_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    if not jobs:
        raise UserError(f"the sweep wrote no job folders under {sweep_dir}")
    return jobs


def score_run(run: Path, budget: str) -> Row:
    """Evaluate a finished run on its whole val split and describe it as a table row."""
    meta = ckpt.read_meta(resolve_checkpoint(run))
    block = meta["model_config"]["block_size"]
    cfg = EvaluateConfig(checkpoint=str(run), stride=block, device=InferenceDeviceConfig("cpu"))
    result, _ = evaluate(cfg)
    overrides = _job_overrides(run)
    own = [o for o in overrides if not o.startswith("trainer.max_time=") and o != NO_STEP_LIMIT]
    seconds = meta.get("train_seconds") or 0.0
    return Row(
        config=" ".join(own) or "default", budget=budget, val_loss=result.loss,
        bits_per_byte=result.bpb,
        steps=meta["step"], tokens=meta["tokens_seen"], tokens_per_s=meta["tokens_seen"] / max(seconds, 1e-9),
        train_seconds=seconds, command=" ".join(["python scripts/train.py", *map(shlex.quote, overrides)]),
        machine=machine_name(), date=datetime.date.today().isoformat(),
    )  # fmt: skip


def _job_overrides(run: Path) -> list[str]:
    """The overrides Hydra recorded for this job (`.hydra/overrides.yaml`, a YAML list of strings)."""
    from omegaconf import OmegaConf

    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        raise UserError(f"{run} has no .hydra/overrides.yaml: is it a run folder of scripts/train.py?")
    return [str(o) for o in OmegaConf.load(path)]


def machine_name() -> str:
    """`AMD EPYC 7763 64-Core Processor, 2 cores, torch 2.13.0`: what the throughput numbers depend on."""
    import torch

    return f"{cpu_model()}, {cpu_count()} cores, torch {torch.__version__}"


# ---------------------------------------------------------------------------------------------- results


def load_results(path: Path) -> dict:
    """The results JSON, or an empty one if it does not exist yet."""
    if not path.exists():
        return {"rows": []}
    try:
        results = json.loads(path.read_text())
        [Row(**r) for r in results["rows"]]  # every row has exactly the fields of Row
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a speedrun results file ({e}); fix it or pass --fresh") from None
    return results


def merge(results: dict, rows: list[Row]) -> dict:
    """`results` with `rows` added; a row with the same command replaces the old one. Best loss first."""
    by_command = {r["command"]: r for r in results["rows"]}
    by_command.update({r.command: dataclasses.asdict(r) for r in rows})
    return {"rows": sorted(by_command.values(), key=lambda r: (r["val_loss"], r["command"]))}


def render_table(results: dict) -> str:
    """The docs/speedrun.md block, markers included: one line per run, best first, and how it was measured."""
    rows = [Row(**r) for r in results["rows"]]
    lines = [BEGIN, "<!-- written by scripts/speedrun.py from docs/speedrun.json; do not edit by hand -->",
             "", "| config | budget | val loss (nats/token) | bits per byte | steps | tokens/s | command |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"`{r.config}`", r.budget, f"{r.val_loss:.3f}", f"{r.bits_per_byte:.3f}", f"{r.steps:,}",
                 f"{r.tokens_per_s:,.0f}", f"`{r.command}`"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    where = "; ".join(dict.fromkeys(f"{r.machine} ({r.date})" for r in rows)) or "no runs yet"
    lines += ["", f"Measured on: {where}. Val loss: the whole val split, every token once in disjoint "
              "windows of the model's context "
              "(`python scripts/evaluate.py checkpoint=<run> stride=<block_size>`); "
              "bits per byte: the same nats / ln 2 per UTF-8 byte of that text.", END]
    return "\n".join(lines)


def update_readme(text: str, table: str, name: str = "docs/speedrun.md") -> str:
    """`text` with the block between the markers replaced by `table`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise UserError(f"{name} has no {BEGIN} ... {END} block; put the two markers where the table goes")
    return text[:start] + table + text[end + len(END):]
