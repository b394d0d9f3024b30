"""The ablation lab's report: a table, one paragraph per row, and a figure, from measured runs.

`write_report(sweep_dir)` measures every run of a lab sweep (ablation.py: each file of the lab x each seed)
and writes, into the sweep folder, `ablation.json` (every number of every run), `ablation.md` (the table and
the paragraphs) and `ablation.png` (loss curves, per-layer gradient norms, per-layer attention entropy). With
`doc=` (docs/ablation.md) it also copies the JSON and the figure beside that file and rewrites its block
between the two `ablation` markers, which is `render_block(docs/ablation.json)` exactly (a test checks it), so
the documented numbers are never typed.

A row is one file of the lab over its seeds: the mean ± 95% interval of the val loss, and the paired
comparison with the baseline run of the same seed (same data order, same initial weights where the shapes
agree) with its p-value; a row within noise of the baseline says so (`stats.py`). Each row's paragraph says
what the design claims for the piece the run removes (`ROWS`, written once) and what the runs measured
(generated from the numbers, against the baseline).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

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
from minigpt.lab.runs import budget_unit, failed_jobs, failed_note, machines, per_seed, replace_block
from minigpt.lab.stats import ALPHA, Interval, Paired, mean_interval, paired_comparison

BEGIN, END = "<!-- ablation:begin -->", "<!-- ablation:end -->"
UNTESTED = "; *1 seed: no test*: one difference has no spread to judge it by"  # said where a row has one
BASELINE = "baseline"
CONTINUATION_CHARS = 40  # continuations are cut to this many characters in the table
SPREAD_RATIO = 4.0  # a row whose interval is this many times the baseline's says its seeds disagree


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
        "nearly one-hot rows, its Jacobian diag(p) - p pᵀ (every entry, not only the diagonal p(1 - p)) "
        "vanishes and W_Q, W_K stop learning.",
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
        "Post-norm", "the original Transformer's norm placement, Norm(x + Sublayer(x)), normalises the skip "
        "path after every sublayer, so the stream's magnitude is reset each time, and a normalised x on the "
        "skip path loses the absolute strength of its features. Pre-norm leaves x untouched.", ("grads",),
        "At the lab's learning rate (3e-3 after 30 warmup steps) the post-norm stack falls into the unigram "
        "solution early and its first blocks then get almost no gradient; rerun with optim.lr=1e-3 "
        "optim.warmup_steps=100 it does learn, more slowly than the baseline. Post-norm needs the gentle "
        "start that pre-norm makes unnecessary (Xiong et al., 2020)."),
    "batchnorm": Row(
        "BatchNorm", "normalising each channel over the batch's tokens instead of each token over its "
        "channels ties every token to the rest of its batch: in training its output depends on the other "
        "sequences and on its own future (through the batch mean), and in eval running averages of the "
        "training batches stand in for the statistics it was trained with.", ("train",),
        "With 1,024 tokens per batch the statistics barely move from batch to batch, and every validation "
        "window has the training length, so neither failure shows at this scale; "
        "tests/model/test_why_norm.py shows both (another sequence moves a token's output, and 4x longer "
        "windows move the eval logits)."),
    "one_head": Row(
        "One head", "one head of size 128 instead of two of 64 (the same parameters): one softmax per query "
        "instead of two, so a position attends to one mixture of the earlier tokens where two heads attend "
        "to two, each free to look elsewhere.", ("entropy",),
        "Next-token prediction at this size seldom needs two things at once from one layer; "
        "tests/model/test_why_heads.py builds a target that needs three, which three heads learn and one "
        "does not."),
    "dropout": Row(
        "Dropout", "dropout (0.1 here, GPT-2's rate) makes the model spread what it knows over its units, "
        "which keeps it from memorising a small training set; a run that sees each token about once has "
        "nothing to memorise, so here it can only slow learning.", ("train",)),
    # what helps: the techniques of record-setting small-GPT runs (docs/tricks.md: on the default run)
    "qk_norm": Row(
        "QK-norm", "(record-setting small-GPT runs) normalising queries and keys bounds every score, so "
        "attention cannot saturate however large the weights grow, and a high learning rate stays stable.",
        ("entropy",)),
    "relu2": Row(
        "ReLU²", "(record-setting small-GPT runs) relu(x)² keeps ReLU's sparsity with a smooth start and "
        "learns faster than GELU in small GPTs (Primer, So et al., 2021).", ()),
    "zero_init_proj": Row(
        "Zero-initialised projections", "(record-setting small-GPT runs) with W_O and the FFN down "
        "projection at zero every block starts as the identity, so the untrained blocks add no noise to the "
        "residual stream.", ("grads",)),
    "value_embeds": Row(
        "Value embeddings", "(record-setting small-GPT runs) a per-layer table of token vectors added to the "
        "values gives every layer the token's identity directly, for a few lookups and no matmul.", ()),
    "smear": Row(
        "Smear", "(record-setting small-GPT runs) mixing the previous token's embedding into each token's "
        "gives the first layer the bigram context that attention would otherwise have to learn to fetch.",
        ()),
    "bigram_embed": Row(
        "Hashed bigram embedding", "(record-setting small-GPT runs) a table indexed by a hash of (previous, "
        "current) token learns bigram statistics directly, which a short run rewards.", ()),
    "logit_softcap": Row(
        "Logit soft-cap", "(record-setting small-GPT runs) 15 tanh(z / 15) bounds the logits, which keeps "
        "the output layer from growing overconfident early.", ()),
    "muon": Row(
        "Muon for the matrices", "(record-setting small-GPT runs) Muon orthogonalises the momentum of each "
        "matrix, giving every direction of an update the same step size, and learns more per step than AdamW "
        "(AdamW stays on the embeddings, the head and the norms).", ("grads",)),
    "embed_lr": Row(
        "Embedding lr", "(record-setting small-GPT runs) a token's row moves only when the token occurs, and "
        "Adam's step is about lr whatever the gradient, so the tables learn faster at a far higher lr than "
        "the matrices every token trains.", ()),
    "batch_warmup": Row(
        "Batch-size warmup", "(record-setting GPT runs) the first steps need few sequences to find a good "
        "direction, so growing the batch from a quarter buys more updates for the same FLOPs.", ("train",)),
    "seq_len_warmup": Row(
        "Sequence-length warmup", "(record-setting GPT runs) a young model cannot use a long context yet; "
        "short windows early put more of its targets where there is little to attend to, on the same "
        "tokens per step.", ("train",)),
}


def write_report(sweep_dir: Path, doc: Path | None = None) -> list[Path]:
    """Measure the sweep's runs and write the report files; returns the paths written."""
    sweep_dir = Path(sweep_dir)
    if doc is not None:  # refuse before measuring or writing
        if not doc.is_file():
            raise UserError(f"doc={doc} does not exist (the file that holds the ablation report)")
        with_block(doc.read_text(), "", str(doc))
    runs = find_lab_runs(sweep_dir)
    failed = failed_jobs(sweep_dir)
    if run_name(runs[0]) != BASELINE:
        raise UserError(f"{sweep_dir} has no baseline run first (found {run_name(runs[0])!r}); run the lab "
                        "with `make ablation`, which trains experiment=ablation/baseline first")
    results = [measure_run(run) for run in runs]
    report = {"sweep": str(sweep_dir), "references": reference_losses(runs[0]),
              "runs": [r.to_dict() for r in results], "failed": failed}
    json_path = sweep_dir / "ablation.json"
    json_path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    png = save_png(lab_figure(lab_rows(results)), sweep_dir / "ablation.png")
    md = sweep_dir / "ablation.md"
    md.write_text(render_block(report, figure=png.name) + "\n")
    written = [json_path, png, md]
    if doc is not None:
        folder = doc.parent
        written += [Path(shutil.copy(json_path, folder / "ablation.json")),
                    Path(shutil.copy(png, folder / "ablation.png"))]
        doc.write_text(with_block(doc.read_text(), render_block(report, figure="ablation.png"), str(doc)))
        written.append(doc)
    return written


@dataclass
class LabRow:
    """One file of the lab over its seeds, measured against the baseline's runs of the same seeds."""

    name: str
    runs: list[RunMeasures]  # in job order: the first seed first
    loss: Interval  # val loss, nats/token
    bpb: Interval
    versus: Paired | None  # val loss against the baseline; None for the baseline itself

    def mean_of(self, field: str) -> float | None:
        values = [getattr(r, field) for r in self.runs if getattr(r, field) is not None]
        return sum(values) / len(values) if values else None

    def layer_means(self, field: str) -> list[float]:
        """Per layer, the mean over the seeds of `field`: arithmetic for attn_entropy, geometric for
        grad_norms, which span orders of magnitude from seed to seed where a path is cut (1e-8 and 1e-2
        average to 5e-3, a value no seed had; their geometric mean 5e-6 is the typical size)."""
        layers = zip(*(getattr(r, field) for r in self.runs), strict=True)
        if field == "grad_norms":
            return [statistics.geometric_mean(max(v, 1e-300) for v in values) for values in layers]
        return [sum(values) / len(values) for values in layers]


def lab_rows(runs: list[RunMeasures]) -> list[LabRow]:
    """The runs grouped by their lab file, in the order the sweep trained them (the baseline first)."""
    groups: dict[str, list[RunMeasures]] = {}
    for r in runs:
        groups.setdefault(r.name, []).append(r)
    records = {name: [r.run for r in group] for name, group in groups.items()}
    base = per_seed(records[BASELINE], "val_loss")
    rows = []
    for name, group in groups.items():
        losses = per_seed(records[name], "val_loss")
        versus = None if name == BASELINE else paired_comparison(losses, base)
        rows.append(LabRow(name, group, mean_interval(list(losses.values())),
                           mean_interval(list(per_seed(records[name], "bits_per_byte").values())), versus))
    return rows


def render_block(report: dict, figure: str) -> str:
    """The Markdown of the report: provenance, figure, table, one paragraph per row."""
    runs = [RunMeasures.from_dict(r) for r in report["runs"]]
    rows = lab_rows(runs)
    base = rows[0].runs[0]
    seeds = sorted({r.run.seed for r in runs})
    seconds = sum(r.run.train_seconds for r in runs)
    ref = report["references"]
    lines = [
        f"{len(rows)} configs x {len(seeds)} seeds ({', '.join(map(str, seeds))}): {len(runs)} runs on the "
        f"same data, each with a budget of {budget_unit(base.run.budget)} ({base.run.steps} steps of "
        f"{base.run.tokens // max(base.run.steps, 1):,} tokens for the baseline), measured on "
        f"{machines([r.run for r in runs])}; the runs' training time adds up to {seconds / 60:.1f} min. "
        "Numbers: the final "
        f"checkpoint of each run on the same {base.scored_tokens:,} validation tokens "
        f"({base.scored_bytes:,} bytes), in eval mode (causal); mean ± 95% interval over the seeds (Student "
        "t); Δ: the mean difference of val loss from the baseline run of the same seed, ± its 95% interval, "
        f"with the two-sided p-value of the paired t-test (*noise*: p ≥ {ALPHA}, not distinguishable from "
        f"the baseline{UNTESTED if any(r.versus and not r.versus.tested for r in rows) else ''}); the other "
        "columns: means over the seeds (geometric for gradient norms). On these "
        "tokens a uniform guess scores "
        f"ln V = {ref['uniform']:.2f} nats/token and the train split's unigram frequencies, which ignore the "
        f"input, {ref['unigram']:.2f}. Continuations (of the first seed's run) start from the first "
        f"{PROMPT_TOKENS} validation tokens, {_md_text(base.prompt, limit=200)}.",
        "", f"![the ablation lab: loss curves, gradient norms and attention entropy per layer]({figure})", "",
        *render_table(rows), *failed_note(report.get("failed")), "",
    ]
    for row in rows:
        lines += [render_paragraph(row, rows[0], ref), ""]
    return "\n".join(lines).rstrip()


def render_table(rows: list[LabRow]) -> list[str]:
    base = rows[0].runs[0]
    head = ["run", "change", "seeds", "val loss", "Δ vs baseline", "p", "bits/byte", "last train loss",
            "grad norm per layer", "attention entropy per layer", "greedy continuation", "sampled (T=0.8)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        first = row.runs[0]
        changed = changed_fields(first.model, base.model)
        change = ", ".join(f"`{k}={_yaml(v)}`" for k, v in changed.items()) or "-"
        cells = [row.name, change, str(len(row.runs)), row.loss.text(), *_versus_cells(row.versus),
                 row.bpb.text(), _num(row.mean_of("train_loss")),
                 " / ".join(f"{g:.3g}" for g in row.layer_means("grad_norms")),
                 " / ".join(f"{h:.2f}" for h in row.layer_means("attn_entropy")),
                 _md_text(first.greedy), _md_text(first.sample)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _versus_cells(versus: Paired | None) -> list[str]:
    if versus is None:
        return ["-", "-"]
    return [versus.difference.text(signed=True) + versus.label(),
            f"{versus.p_value:.2g}" if versus.tested else "-"]


def render_paragraph(row: LabRow, base: LabRow, ref: dict[str, float]) -> str:
    spec = ROWS.get(row.name, Row(row.name, "(no prediction recorded for this run)"))
    text = f"**{spec.title}.** "
    text += f"The claim: {spec.predicts} " if row.name != BASELINE else f"Has {spec.predicts} "
    if row.versus is None:
        seeds = f"{len(row.runs)} seed" + ("s" if len(row.runs) != 1 else "")
        return text + f"It reaches {row.loss.text(2)} nats/token ({row.bpb.text(2)} bits/byte) over {seeds}."
    d, p = row.versus.difference, row.versus.p_value
    side = "above" if d.mean >= 0 else "below"
    p_text = "1 seed: no test" if not row.versus.tested else f"p = {p:.2g}"
    if not row.versus.tested:
        text += (f"The run: val loss {row.loss.text(2)} nats/token, {d.mean:+.2f} from the baseline's "
                 f"{base.loss.mean:.2f} ({p_text}: one seed says nothing about noise)")
    elif row.versus.within_noise():
        text += (f"The runs: val loss {row.loss.text(2)} nats/token, within noise of the baseline's "
                 f"{base.loss.mean:.2f} (Δ {d.text(2, signed=True)}, {p_text})")
    else:
        text += (f"The runs: val loss {row.loss.text(2)} nats/token, {abs(d.mean):.2f} {side} the baseline's "
                 f"{base.loss.mean:.2f} (Δ {d.text(2, signed=True)}, {p_text})")
    text += f"; {row.bpb.mean:.2f} vs {base.bpb.mean:.2f} bits/byte"
    if row.loss.mean > ref["uniform"] - 0.05:
        text += ", no better than a uniform guess"
    elif abs(row.loss.mean - ref["unigram"]) < 0.1:
        text += ", the unigram frequencies' loss: the model ignores its input"
    if row.loss.half_width > SPREAD_RATIO * base.loss.half_width:
        text += (f"; its seeds disagree far more than the baseline's (± {row.loss.half_width:.2f} against "
                 f"± {base.loss.half_width:.2f}: {', '.join(f'{r.val_loss:.2f}' for r in row.runs)})")
    text += _focus(spec.focus, row, base)
    text += "."
    return text + (f" {spec.explains}" if spec.explains else "")


def _focus(focus: tuple[str, ...], row: LabRow, base: LabRow) -> str:
    """The measurements the row's prediction is about, beside the baseline's (means over the seeds)."""
    text = ""
    train, base_train = row.mean_of("train_loss"), base.mean_of("train_loss")
    if "train" in focus and train is not None and base_train is not None:
        text += f"; last training loss {train:.2f} (baseline {base_train:.2f})"
    if "entropy" in focus:
        text += (f"; attention entropy {_mean(row.layer_means('attn_entropy')):.2f} nats "
                 f"(baseline {_mean(base.layer_means('attn_entropy')):.2f})")
    if "grads" in focus:
        g, b = row.layer_means("grad_norms"), base.layer_means("grad_norms")
        text += (f"; gradient norm of the first / last layer {g[0]:.3g} / {g[-1]:.3g} (baseline "
                 f"{b[0]:.3g} / {b[-1]:.3g})")
    if "greedy" in focus:
        text += f"; greedy continuation: {_md_text(row.runs[0].greedy)}"
    return text


def lab_figure(rows: list[LabRow]) -> Figure:
    """2 x 2: training loss and validation loss against the step (every seed, one colour per row); gradient
    norm and attention entropy against the layer (`layer_means` over the seeds, bars from the lowest to the
    highest).
    The baseline is drawn in black, thicker."""
    fig = new_figure(13, 8.5)
    (ax_train, ax_val), (ax_grad, ax_ent) = fig.subplots(2, 2)
    for i, row in enumerate(rows):
        style = {"color": "black", "lw": 2.4} if row.name == BASELINE else {"color": f"C{i % 10}", "lw": 1.4}
        for k, r in enumerate(row.runs):
            label = row.name if k == 0 else None
            if "train/loss" in r.curves:
                ax_train.plot(*r.curves["train/loss"], label=label, alpha=0.8, **style)
            if "val/loss" in r.curves:
                ax_val.plot(*r.curves["val/loss"], marker="o", ms=3, alpha=0.8, **style)
        for ax, field in ((ax_grad, "grad_norms"), (ax_ent, "attn_entropy")):
            per_layer = list(zip(*(getattr(r, field) for r in row.runs), strict=True))
            means = row.layer_means(field)
            # clamped: one seed's geometric "mean" can differ from its only value in the last bit
            spread = [[max(m - min(v), 0.0) for m, v in zip(means, per_layer, strict=True)],
                      [max(max(v) - m, 0.0) for m, v in zip(means, per_layer, strict=True)]]
            ax.errorbar(range(len(means)), means, yerr=spread, marker="o", capsize=3, **style)
    ax_grad.set_yscale("log")
    ax_train.set(title="training loss (training mode: no_causal_mask sees the next token)",
                 xlabel="optimizer step", ylabel="nats/token")
    ax_val.set(title="validation loss (eval mode, causal)", xlabel="optimizer step", ylabel="nats/token")
    ax_grad.set(title="gradient norm of the val loss, per block (log scale)", xlabel="layer",
                ylabel="L2 norm")
    ax_ent.set(title="attention entropy per block (mean over heads and queries)", xlabel="layer",
               ylabel="nats")
    for ax in (ax_grad, ax_ent):
        ax.set_xticks(range(len(rows[0].runs[0].grad_norms)))
    for ax in (ax_train, ax_val, ax_grad, ax_ent):
        ax.grid(alpha=0.3)
    ax_train.legend(fontsize=8, ncols=2)
    return fig


def with_block(text: str, block: str, name: str) -> str:
    """`text` with everything between the BEGIN and END markers replaced by `block`; refused, naming the
    file `name`, when the markers are missing."""
    return replace_block(text, BEGIN, END, f"{BEGIN}\n{block}\n{END}", name)


def doc_block(text: str) -> str:
    """The text between the markers (what `with_block` wrote)."""
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
