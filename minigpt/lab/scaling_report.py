"""The ladder's report: scaling.json (every number), scaling.png, TensorBoard logs, docs/scaling.md's block.

The block between docs/scaling.md's `scaling` markers is `render_block(docs/scaling.json)` exactly (a test
checks it), so the documented numbers are never typed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minigpt.errors import UserError
from minigpt.inspect.plotting import figure_to_rgb, new_figure, save_png
from minigpt.lab.runs import RunRecord, machines, replace_block
from minigpt.lab.scaling import CONFIDENCE, Ladder, records
from minigpt.lab.scaling_fit import LossLaw, interval

BEGIN, END = "<!-- scaling:begin -->", "<!-- scaling:end -->"
TAGS = {"loss": "scaling/val_loss", "fit": "scaling/fit_loss", "optimal": "scaling/optimal_tokens_per_param",
        "figure": "scaling/fit"}
CHINCHILLA = 20.0  # tokens per parameter, Hoffmann et al. 2022
SMALL_MODELS = (8.0, 12.0)  # what recent small-model work reports


def point_rows(rows: list[tuple[str, RunRecord]], held_out: bool) -> list[dict]:
    """One line per (budget, size): the means over its seeds, the seeds' range of the loss."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for size, r in rows:
        groups.setdefault((r.budget, size), []).append(r)
    out = []
    for (budget, size), runs in groups.items():
        losses = [r.val_loss for r in runs]
        out.append({"size": size, "flops": float(budget.split("=")[1]), "held_out": held_out,
                    "params": runs[0].params, "tokens": float(np.mean([r.tokens for r in runs])),
                    "tokens_per_param": float(np.mean([r.tokens for r in runs])) / runs[0].params,
                    "seeds": len(runs), "val_loss": float(np.mean(losses)), "low": min(losses),
                    "high": max(losses), "bits_per_byte": float(np.mean([r.bits_per_byte for r in runs]))})
    return sorted(out, key=lambda p: (p["flops"], p["params"]))


def optimum(law: LossLaw, fits, flops: float) -> dict:
    n, d = law.optimum(flops)
    return {"flops": flops, "params": n, "tokens": d, "tokens_per_param": law.tokens_per_param(flops),
            "interval": interval([f.tokens_per_param(flops) for f, _ in fits], CONFIDENCE)}


def build_report(ladder: Ladder, default_run: dict) -> dict:
    """Everything the report shows, as plain data (scaling.json). `default_run`: the Llama-style run's
    (TrainConfig's defaults) `params` and `tokens`."""
    state, law, fits = ladder.state, ladder.law, ladder.fits
    fitted, held = records(state, held_out=False), records(state, held_out=True)
    names = ("E", "A", "alpha", "B", "beta")
    budgets = sorted({p.flops for p in ladder.points})
    default_flops = 6 * default_run["params"] * default_run["tokens"]
    check = []
    for point in point_rows(held, held_out=True):
        predicted = (state["prediction"] or {}).get(point["size"])
        if predicted is not None:
            low, high = predicted["interval"]
            check.append({"size": point["size"], "measured": point["val_loss"], **predicted,
                          "inside": low <= point["val_loss"] <= high})
    return {
        "seeds": ladder.seeds, "runs_fitted": len(fitted), "bootstrap": len(fits),
        "points": [*point_rows(fitted, held_out=False), *point_rows(held, held_out=True)],
        "fit": {**law.to_dict(), "intervals": {k: interval([getattr(f, k) for f, _ in fits], CONFIDENCE)
                                               for k in names}},
        "optimal": [optimum(law, fits, c) for c in budgets],
        "default_run": {**default_run, "tokens_per_param": default_run["tokens"] / default_run["params"],
                        "optimal": optimum(law, fits, default_flops)},
        "prediction": state["prediction"], "check": check, "failed": state["failed"],
        "refits": [f.to_dict() for f, _ in fits],
        "runs": [{"size": size, **dataclasses.asdict(r)} for size, r in [*fitted, *held]],
    }


def _law(report: dict) -> LossLaw:
    return LossLaw(**{k: v for k, v in report["fit"].items() if k != "intervals"})


def scaling_figure(report: dict) -> Figure:
    """Left: the IsoFLOP profiles (val loss against N, one colour per budget; the seeds' range as bars), the
    fit along each, the held-out points with their prediction intervals. Right: the compute-optimal tokens
    per parameter against compute, with its bootstrap interval, Chinchilla's 20 and the Llama-style run."""
    law = _law(report)
    fig = new_figure(13, 5.5)
    ax, ax_opt = fig.subplots(1, 2)
    budgets = sorted({p["flops"] for p in report["points"]})
    for i, flops in enumerate(budgets):
        pts = [p for p in report["points"] if p["flops"] == flops]
        n = np.array([p["params"] for p in pts], dtype=float)
        grid = np.geomspace(n.min() / 1.3, n.max() * 1.3, 60)
        per_n = np.mean([p["tokens"] * p["params"] for p in pts])  # D ~ C / (cost per token), cost ~ N
        held = pts[0]["held_out"]
        ax.plot(grid, law(grid, per_n / grid), color=f"C{i}", ls="--" if held else "-", lw=1.2)
        ax.errorbar(n, [p["val_loss"] for p in pts], fmt="s" if held else "o", color=f"C{i}", capsize=3,
                    yerr=[[p["val_loss"] - p["low"] for p in pts], [p["high"] - p["val_loss"] for p in pts]],
                    label=f"{flops:.3g} FLOPs" + (" (held out)" if held else ""))
    for c in report["check"]:
        low, high = c["interval"]
        ax.errorbar([c["params"]], [c["predicted"]], yerr=[[c["predicted"] - low], [high - c["predicted"]]],
                    fmt="_", ms=14, color="black", capsize=5, lw=1.5)
    ax.set(xscale="log", xlabel="non-embedding parameters N", ylabel="val loss (nats/token, whole split)",
           title="IsoFLOP profiles, the fit (lines) and the held-out prediction intervals (black)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    c = np.geomspace(min(budgets) / 3, max(report["default_run"]["optimal"]["flops"], max(budgets)) * 3, 50)
    ax_opt.plot(c, [law.tokens_per_param(x) for x in c], color="C0", label="fit")
    refits = [LossLaw(**r) for r in report["refits"]]
    band = np.array([interval([f.tokens_per_param(x) for f in refits], CONFIDENCE) for x in c])
    ax_opt.fill_between(c, band[:, 0], band[:, 1], color="C0", alpha=0.15, label="95% bootstrap")
    ax_opt.axhline(CHINCHILLA, color="gray", ls="--", label="Chinchilla: ~20")
    ax_opt.axhspan(*SMALL_MODELS, color="gray", alpha=0.1, label="recent small models: 8-12")
    d = report["default_run"]
    ax_opt.plot([d["optimal"]["flops"]], [d["tokens_per_param"]], "*", ms=13, color="C3",
                label=f"the Llama-style run: {d['tokens_per_param']:.2g} tokens per parameter")
    ax_opt.set(xscale="log", yscale="log", xlabel="compute C = 6 N D", ylabel="compute-optimal tokens per "
               "parameter", title="compute-optimal D / N")
    ax_opt.legend(fontsize=8)
    ax_opt.grid(alpha=0.3, which="both")
    return fig


def write_tensorboard(report: dict, fig: Figure, log_dir: Path) -> None:
    """Per budget, the measured and fitted loss against N (the step); the optimum; the figure."""
    from torch.utils.tensorboard import SummaryWriter  # imported lazily: it pulls in tensorboard

    law = _law(report)
    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for p in report["points"]:
            tag = f"{p['flops']:.3g}"
            writer.add_scalar(f"{TAGS['loss']}/{tag}", p["val_loss"], p["params"])
            writer.add_scalar(f"{TAGS['fit']}/{tag}", float(law(p["params"], p["tokens"])), p["params"])
        for o in report["optimal"]:
            writer.add_scalar(TAGS["optimal"], o["tokens_per_param"], round(o["flops"]))
        writer.add_image(TAGS["figure"], figure_to_rgb(fig), 0, dataformats="HWC")


def _interval(pair: list[float], digits: int = 3) -> str:
    return f"{pair[0]:.{digits}g} to {pair[1]:.{digits}g}"


def render_block(report: dict, figure: str) -> str:
    """The doc's block, markers included."""
    law, iv = _law(report), report["fit"]["intervals"]
    head = ["budget (FLOPs)", "size", "N", "tokens", "tokens per parameter", "seeds",
            "val loss (seeds' range)", "bits per byte", "fit"]
    lines = [BEGIN, "<!-- written by scripts/scaling.py from docs/scaling.json; do not edit by hand -->", "",
             f"![IsoFLOP profiles, the fit of L(N, D), the compute-optimal tokens per parameter]({figure})",
             "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in report["points"]:
        cells = [f"{p['flops']:.3g}" + (" (held out)" if p["held_out"] else ""), p["size"],
                 f"{p['params']:,}", f"{p['tokens']:,.0f}", f"{p['tokens_per_param']:.3g}", str(p["seeds"]),
                 f"{p['val_loss']:.3f} ({p['low']:.3f} to {p['high']:.3f})", f"{p['bits_per_byte']:.3f}",
                 f"{float(law(p['params'], p['tokens'])):.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    terms = ", ".join(f"{k} = {getattr(law, k):.3g} ({_interval(iv[k])})" for k in ("E", "A", "alpha", "B",
                                                                                   "beta"))
    lines += ["", f"Fit on the {report['runs_fitted']} runs of the profiles, 95% intervals from "
              f"{report['bootstrap']} bootstrap refits: L(N, D) = E + A / N^alpha + B / D^beta with {terms}.",
              "", "| compute C = 6ND | compute-optimal N | tokens | tokens per parameter (95%) |",
              "|---|---|---|---|"]
    d = report["default_run"]
    for o in [*report["optimal"], d["optimal"]]:
        name = " (the Llama-style run's)" if o is d["optimal"] else ""
        lines.append(f"| {o['flops']:.3g}{name} | {o['params']:,.0f} | {o['tokens']:,.0f} | "
                     f"{o['tokens_per_param']:.3g} ({_interval(o['interval'])}) |")
    opt, ratio = d["optimal"]["tokens_per_param"], d["tokens_per_param"]
    lines += ["", f"The Llama-style run (`model=demo optim=muon`) trains {d['tokens']:,.0f} tokens on "
              f"N = {d['params']:,}: {ratio:.2g} "
              f"tokens per parameter, {opt / ratio:.2g}x fewer than the fit's compute-optimal {opt:.3g} "
              f"({_interval(d['optimal']['interval'])}) at its compute (Chinchilla: ~{CHINCHILLA:g}; recent "
              f"small-model work: {SMALL_MODELS[0]:g}-{SMALL_MODELS[1]:g})."]
    for c in report["check"]:
        error = 100 * (c["measured"] / c["predicted"] - 1)
        lines += ["", f"Held out: {c['size']} at {c['flops']:.3g} FLOPs ({c['tokens']:,.0f} tokens), "
                  f"predicted before it ran: {c['predicted']:.3f} nats/token (the law's 95% interval "
                  f"{_interval(c['law_interval'], 4)}; for a mean of {len(report['seeds'])} runs "
                  f"{_interval(c['interval'], 4)}); measured {c['measured']:.3f} ({error:+.1f}%), "
                  f"{'inside' if c['inside'] else 'outside'} the interval."]
    if report["failed"]:
        lines += ["", "Failed runs (not in the fit): " + "; ".join(f["reason"] for f in report["failed"])]
    runs = [RunRecord(**{k: v for k, v in r.items() if k != "size"}) for r in report["runs"]]
    lines += ["", f"Seeds {', '.join(map(str, report['seeds']))}. Measured on: {machines(runs)}.", END]
    return "\n".join(lines)


def write_report(ladder: Ladder, default_run: dict, out: Path, doc: Path | None) -> list[Path]:
    """scaling.json, scaling.png, scaling.md and tb/ into `out`; with `doc`, the JSON and the figure beside
    it and its block rewritten (the doc and its markers were checked before anything trained)."""
    report = build_report(ladder, default_run)
    fig = scaling_figure(report)
    json_path, png, md = out / "scaling.json", save_png(fig, out / "scaling.png"), out / "scaling.md"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md.write_text(f"# Scaling ladder: {out}\n\n{render_block(report, png.name)}\n")
    write_tensorboard(report, fig, out / "tb")
    written = [json_path, png, md, out / "tb"]
    if doc is not None:
        text = check_doc(doc)
        written += [Path(shutil.copy(json_path, doc.parent / "scaling.json")),
                    Path(shutil.copy(png, doc.parent / "scaling.png")), doc]
        doc.write_text(replace_block(text, BEGIN, END, render_block(report, "scaling.png"), str(doc)))
    return written


def check_doc(doc: Path) -> str:
    """`doc`'s text, if it exists and has the markers (else one line, the file untouched)."""
    if not doc.is_file():
        raise UserError(f"doc={doc} does not exist (the file that holds the scaling ladder)")
    text = doc.read_text(encoding="utf-8")
    replace_block(text, BEGIN, END, "", str(doc))
    return text
