"""The ablation lab's report: a table, one paragraph per row, and a figure, from measured runs.

`write_report(sweep_dir)` measures every run of a lab sweep (ablation.py) and writes, into the sweep
folder, `ablation.json` (every number), `ablation.md` (the table and the paragraphs) and `ablation.png`
(loss curves, per-layer gradient norms, per-layer attention entropy). With `readme=` (docs/ablation.md)
it also copies the JSON and the figure to docs/ and rewrites that file's block between the two `ablation`
markers, which is `render_block(docs/ablation.json)` exactly (a test checks it), so its numbers are never
typed.

Each row's paragraph says what the design claims for the piece the run removes (`ROWS`, written once) and
what this run measured (generated from the numbers, against the baseline).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure

from minigpt.data.encode import cpu_count
from minigpt.errors import UserError
from minigpt.inspect.plotting import new_figure, save_png
from minigpt.lab.ablation import (
    PROMPT_TOKENS,
    RunMeasures,
    changed_fields,
    find_lab_runs,
    measure_run,
    reference_losses,
    run_name,
)

BEGIN, END = "<!-- ablation:begin -->", "<!-- ablation:end -->"
BASELINE = "baseline"
CONTINUATION_CHARS = 40  # continuations are cut to this many characters in the table


@dataclass(frozen=True)
class Row:
    """What the design claims about one ablation, and which measurements show it (`focus`)."""

    title: str
    predicts: str
    focus: tuple[str, ...] = ()  # among: train, entropy, grads, greedy
    explains: str = ""  # what the architecture adds to the claim


ROWS = {
    BASELINE: Row("Baseline", "every piece the design defends: the causal mask, scores divided by √D = 8, "
                  "positions (rotary), residual paths around pre-norm sublayers and a final LayerNorm.",
                  ("train", "entropy", "grads", "greedy")),
    "no_causal_mask": Row(
        "No causal mask", "in training every position sees the next token, so the loss collapses towards 0 "
        "and the weights learn to copy rather than to predict; used causally, as a decoder must be, the "
        "model then fails.", ("train", "greedy")),
    "no_attn_scale": Row(
        "No 1/√D", "with head size 64 the raw scores spread 8 times wider, the softmax saturates to "
        "nearly one-hot rows, its derivative p(1 - p) vanishes and W_Q, W_K stop learning.",
        ("entropy", "grads"),
        "The entropy shows the saturation; the loss pays less, because the rows whose two best scores "
        "nearly tie keep their gradient (tests/model/test_ablation_predictions.py: with unit-variance q "
        "and k the typical row's gradient is an order of magnitude smaller, the average only a few times)."),
    "integer_positions": Row(
        "Integer positions", "the index 0..63 added to every channel dwarfs the embeddings; a weight that "
        "reads it gets a gradient proportional to the position, and large inputs saturate.", (),
        "LayerNorm subtracts each token's mean over its channels before any weight reads the stream, and a "
        "value added to every channel is exactly such a mean: in a pre-norm LayerNorm model integer "
        "positions vanish before the first layer (up to rounding), so this row lands beside the next one, "
        "no positions. The predicted gradient growth is real for a layer that reads the raw sum (a "
        "post-norm first block): tests/model/test_ablation_predictions.py measures it."),
    "no_positions": Row(
        "No positional encoding", "attention alone is a weighted average that ignores order: the same "
        "tokens in another order look the same.", ("entropy",),
        "The causal mask still leaks position (query t averages over t + 1 keys), so a decoder loses less "
        "than an order-blind encoder; tests/model/test_ablation_predictions.py shows exact order "
        "blindness once the mask is gone too."),
    "no_residual": Row(
        "No residual path", "without x + Δ nothing carries x past a sublayer unchanged: every layer must "
        "rebuild the whole signal, and the gradient reaches early layers only through all later ones.",
        ("grads",)),
    "no_final_norm": Row(
        "No final norm", "the head reads the raw residual stream, whose scale is whatever the blocks "
        "made it, instead of a normalised one.", ()),
    "post_norm": Row(
        "Post-norm", "the original Transformer's data flow, Norm(x + Sublayer(x)), normalises the skip path "
        "after every sublayer, so the stream's magnitude is reset each time, and a normalised x on the skip "
        "path loses the absolute strength of its features. Pre-norm leaves x untouched.", ("grads",),
        "At the lab's learning rate (3e-3 after 30 warmup steps) the post-norm stack falls into the unigram "
        "solution early and its first blocks then get almost no gradient; rerun with optim.lr=1e-3 "
        "optim.warmup_steps=100 it does learn, more slowly than the baseline. Post-norm needs the gentle "
        "start that pre-norm makes unnecessary (Xiong et al., 2020)."),
}


def write_report(sweep_dir: Path, readme: Path | None = None, docs_dir: Path = Path("docs")) -> list[Path]:
    """Measure the sweep's runs and write the report files; returns the paths written. `readme`: the
    Markdown file whose block to rewrite (docs/ablation.md)."""
    sweep_dir = Path(sweep_dir)
    if readme is not None:
        replace_block(readme.read_text(), "")  # markers missing: refuse before measuring or writing
    runs = find_lab_runs(sweep_dir)
    if run_name(runs[0]) != BASELINE:
        raise UserError(f"{sweep_dir} has no baseline run first (found {run_name(runs[0])!r}); run the lab "
                        "with `make ablation`, which trains experiment=ablation/baseline as job 0")
    results = [measure_run(run) for run in runs]
    doc = {"machine": f"{cpu_count()} CPU cores, torch {torch.__version__}", "sweep": str(sweep_dir),
           "references": reference_losses(runs[0]),
           "runs": [r.to_dict() for r in results]}
    json_path = sweep_dir / "ablation.json"
    json_path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    png = save_png(lab_figure(results), sweep_dir / "ablation.png")
    md = sweep_dir / "ablation.md"
    md.write_text(render_block(doc, figure=png.name) + "\n")
    written = [json_path, png, md]
    if readme is not None:
        docs_dir.mkdir(parents=True, exist_ok=True)
        written += [Path(shutil.copy(json_path, docs_dir / "ablation.json")),
                    Path(shutil.copy(png, docs_dir / "ablation.png"))]
        # the figure's path as the Markdown file sees it: `ablation.png` from docs/ablation.md
        figure = Path(os.path.relpath(docs_dir / "ablation.png", readme.parent)).as_posix()
        readme.write_text(replace_block(readme.read_text(), render_block(doc, figure=figure)))
        written.append(readme)
    return written


def render_block(doc: dict, figure: str) -> str:
    """The Markdown of the report: provenance, figure, table, one paragraph per row."""
    runs = [RunMeasures.from_dict(r) for r in doc["runs"]]
    base = runs[0]
    seconds = sum(r.train_seconds or 0.0 for r in runs)
    steps = int(max(base.curves.get("val/loss", [[0]])[0]))
    ref = doc["references"]
    lines = [
        f"{len(runs)} runs of {steps} steps each on the same data, seed and budget, measured on "
        f"{doc['machine']}; training took {seconds / 60:.1f} min in all. Numbers: the final checkpoint of "
        f"each run on the same {base.scored_tokens:,} validation tokens ({base.scored_bytes:,} bytes), in "
        f"eval mode (causal). On them a uniform guess scores ln V = {ref['uniform']:.2f} nats/token and the "
        f"train split's unigram frequencies, which ignore the input, {ref['unigram']:.2f}. Continuations "
        f"start from the first {PROMPT_TOKENS} validation tokens, {_md_text(base.prompt, limit=200)}.",
        "", f"![the ablation lab: loss curves, gradient norms and attention entropy per layer]({figure})", "",
        *render_table(runs), "",
    ]
    for run in runs:
        lines += [render_paragraph(run, base, ref), ""]
    return "\n".join(lines).rstrip()


def render_table(runs: list[RunMeasures]) -> list[str]:
    base = runs[0]
    head = ["run", "change", "val loss", "bits/byte", "last train loss", "grad norm per layer",
            "attention entropy per layer", "greedy continuation", "sampled (T=0.8)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        change = ", ".join(f"`{k}={_yaml(v)}`" for k, v in changed_fields(r.model, base.model).items()) or "-"
        cells = [r.name, change, f"{r.val_loss:.3f}", f"{r.bits_per_byte:.3f}", _num(r.train_loss),
                 " / ".join(f"{g:.3g}" for g in r.grad_norms), " / ".join(f"{h:.2f}" for h in r.attn_entropy),
                 _md_text(r.greedy), _md_text(r.sample)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_paragraph(run: RunMeasures, base: RunMeasures, ref: dict[str, float]) -> str:
    row = ROWS.get(run.name, Row(run.name, "(no prediction recorded for this run)"))
    text = f"**{row.title}.** "
    text += f"The claim: {row.predicts} " if run.name != BASELINE else f"Has {row.predicts} "
    if run.name == BASELINE:
        return text + f"It reaches {run.val_loss:.2f} nats/token ({run.bits_per_byte:.2f} bits/byte)."
    d = run.val_loss - base.val_loss
    side = "above" if d >= 0 else "below"
    text += (f"The run: val loss {run.val_loss:.2f} nats/token, {abs(d):.2f} {side} the baseline's "
             f"{base.val_loss:.2f} ({run.bits_per_byte:.2f} vs {base.bits_per_byte:.2f} bits/byte)")
    if run.val_loss > ref["uniform"] - 0.05:
        text += ", no better than a uniform guess"
    elif abs(run.val_loss - ref["unigram"]) < 0.1:
        text += ", the unigram frequencies' loss: the model ignores its input"
    if "train" in row.focus and run.train_loss is not None and base.train_loss is not None:
        text += f"; last training loss {run.train_loss:.2f} (baseline {base.train_loss:.2f})"
    if "entropy" in row.focus:
        text += (f"; attention entropy {_mean(run.attn_entropy):.2f} nats "
                 f"(baseline {_mean(base.attn_entropy):.2f})")
    if "grads" in row.focus:
        text += (f"; gradient norm of the first / last layer {run.grad_norms[0]:.3g} / "
                 f"{run.grad_norms[-1]:.3g} (baseline {base.grad_norms[0]:.3g} / {base.grad_norms[-1]:.3g})")
    if "greedy" in row.focus:
        text += f"; greedy continuation: {_md_text(run.greedy)}"
    text += "."
    return text + (f" {row.explains}" if row.explains else "")


def lab_figure(runs: list[RunMeasures]) -> Figure:
    """2 x 2: training loss and validation loss against the step; gradient norm and attention entropy
    against the layer. The baseline is drawn in black, thicker."""
    fig = new_figure(13, 8.5)
    (ax_train, ax_val), (ax_grad, ax_ent) = fig.subplots(2, 2)
    for i, r in enumerate(runs):
        style = {"color": "black", "lw": 2.4} if r.name == BASELINE else {"color": f"C{i % 10}", "lw": 1.4}
        if "train/loss" in r.curves:
            ax_train.plot(*r.curves["train/loss"], label=r.name, **style)
        if "val/loss" in r.curves:
            ax_val.plot(*r.curves["val/loss"], marker="o", ms=3, **style)
        layers = range(len(r.grad_norms))
        ax_grad.semilogy(layers, r.grad_norms, marker="o", **style)
        ax_ent.plot(layers, r.attn_entropy, marker="o", **style)
    ax_train.set(title="training loss (training mode: no_causal_mask sees the next token)",
                 xlabel="optimizer step", ylabel="nats/token")
    ax_val.set(title="validation loss (eval mode, causal)", xlabel="optimizer step", ylabel="nats/token")
    ax_grad.set(title="gradient norm of the val loss, per block (log scale)", xlabel="layer",
                ylabel="L2 norm")
    ax_ent.set(title="attention entropy per block (mean over heads and queries)", xlabel="layer",
               ylabel="nats")
    for ax in (ax_grad, ax_ent):
        ax.set_xticks(range(len(runs[0].grad_norms)))
    for ax in (ax_train, ax_val, ax_grad, ax_ent):
        ax.grid(alpha=0.3)
    ax_train.legend(fontsize=8, ncols=2)
    return fig


def replace_block(text: str, block: str) -> str:
    """`text` with everything between the BEGIN and END markers replaced by `block`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise UserError(f"the report's Markdown file needs exactly one {BEGIN} ... {END} pair to put the "
                        "ablation report in")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def readme_block(text: str) -> str:
    """The text between the markers (what `replace_block` wrote)."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def _md_text(s: str, limit: int = CONTINUATION_CHARS) -> str:
    """A continuation as table-safe Markdown: cut; newlines, tabs and runs of spaces (which Markdown would
    collapse) shown as symbols; markup escaped."""
    s = s[:limit] + ("…" if len(s) > limit else "")
    s = re.sub(" {2,}", lambda m: "␣" * len(m.group()), s.replace("\n", "↵").replace("\t", "→"))
    for ch in "\\`*_[]<>|#":
        s = s.replace(ch, "\\" + ch)
    return s or "(nothing)"


def _yaml(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")
