"""The scaling ladder: val bits per byte against training FLOPs over a series of model sizes, as a power law.

`make scaling` trains the sizes of `configs/experiment/scaling/` (the default run's block at several widths,
head size 32) as one Hydra multirun, every size at the same ratio of training tokens to non-embedding
parameters (`trainer.max_tokens_per_param`), so a size's FLOPs grow as its parameter count squared. Then
`scripts/scaling.py sweep=<folder>` scores every run on the whole val split (as the speedrun does) and fits,
on every size but the largest,

    bpb = a * C^(-alpha)        C: training FLOPs (GPT.flops_per_token x tokens)

as a straight line through (log C, log bpb) by least squares. The largest size is held out: the fit predicts
its bpb before its run is looked at, with a 95% prediction interval for a new point,

    log bpb* = log a - alpha * log C*  ±  t(0.975, n - 2) * s * sqrt(1 + 1/n + (x* - mean x)^2 / Sxx)

(x = log C, s the residuals' standard deviation with n - 2 degrees of freedom, Sxx = sum (x - mean x)^2),
and the report says whether the measured bpb falls inside. A change to the model or the recipe can then be
judged by whether it moves the whole curve, not one point. Four sizes give two degrees of freedom, so the
interval is wide; a pure power law has no floor (the loss of a model that has learned everything), so the fit
holds for the range it was fitted on and a little beyond, not for far larger models.

The report: scaling.json (every point, the fit, the check), scaling.png (the points, the fit and its
interval on log-log axes) and the same figure and points in TensorBoard (`tb/`: scalars `scaling/val_bpb`
and `scaling/fit_bpb` against the FLOPs as the step, image `scaling/fit`). With several seeds per size the
points are the seeds' means.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from scipy import stats as scipy_stats

from minigpt.errors import UserError
from minigpt.inspect.plotting import figure_to_rgb, new_figure, save_png
from minigpt.lab.runs import RunRecord, machines, replace_block, sweep_jobs
from minigpt.lab.stats import CONFIDENCE

BEGIN, END = "<!-- scaling:begin -->", "<!-- scaling:end -->"
TAGS = {"measured": "scaling/val_bpb", "fit": "scaling/fit_bpb", "figure": "scaling/fit"}


@dataclasses.dataclass(frozen=True)
class PowerLaw:
    """bpb = a * C^(-alpha), fitted in log-log space on `n` points; `s` is the residuals' standard deviation
    (log space) and `x_mean`, `sxx` are what a prediction interval needs."""

    a: float
    alpha: float
    n: int
    s: float
    x_mean: float
    sxx: float
    r2: float

    def __call__(self, flops: float) -> float:
        return self.a * flops ** (-self.alpha)

    def interval(self, flops: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The `confidence` prediction interval of one new point's bpb at `flops` (see the module)."""
        x = math.log(flops)
        t = float(scipy_stats.t.ppf(0.5 + confidence / 2, df=self.n - 2))
        half = t * self.s * math.sqrt(1 + 1 / self.n + (x - self.x_mean) ** 2 / self.sxx)
        centre = math.log(self(flops))
        return math.exp(centre - half), math.exp(centre + half)


def fit_power_law(flops: list[float], bpb: list[float]) -> PowerLaw:
    """Least squares of log bpb on log C (scipy's linregress); at least 3 points (1 degree of freedom)."""
    if len(flops) < 3:
        raise UserError(f"a power-law fit with an interval needs at least 3 sizes besides the held-out one "
                        f"(found {len(flops)}); add sizes to the ladder")
    x, y = np.log(flops), np.log(bpb)
    line = scipy_stats.linregress(x, y)
    residuals = y - (line.intercept + line.slope * x)
    s = float(np.sqrt((residuals ** 2).sum() / (len(x) - 2)))
    x_mean = float(x.mean())
    return PowerLaw(a=math.exp(line.intercept), alpha=-float(line.slope), n=len(x), s=s, x_mean=x_mean,
                    sxx=float(((x - x_mean) ** 2).sum()), r2=float(line.rvalue ** 2))


@dataclasses.dataclass
class Point:
    """One size of the ladder: the means over its seeds' runs."""

    name: str
    params: int
    flops: float
    tokens: float
    bpb: float
    seeds: int


def points(rows: list[RunRecord], names: list[str]) -> list[Point]:
    """One point per size (`names[i]` is row i's size), smallest model first."""
    groups: dict[str, list[RunRecord]] = {}
    for name, row in zip(names, rows, strict=True):
        groups.setdefault(name, []).append(row)
    out = [Point(name, runs[0].params, _mean([r.flops for r in runs]), _mean([r.tokens for r in runs]),
                 _mean([r.bits_per_byte for r in runs]), len(runs)) for name, runs in groups.items()]
    return sorted(out, key=lambda p: p.params)


def ladder_report(rows: list[RunRecord], names: list[str], sweep: str) -> dict:
    """Fit every size but the largest, predict the largest: the report as plain data (scaling.json)."""
    ladder = points(rows, names)
    if len(ladder) < 2:
        raise UserError(f"{sweep} holds {len(ladder)} size(s); a ladder needs the sizes it fits and one more "
                        "to hold out")
    fitted, held = ladder[:-1], ladder[-1]
    law = fit_power_law([p.flops for p in fitted], [p.bpb for p in fitted])
    low, high = law.interval(held.flops)
    check = {"name": held.name, "flops": held.flops, "predicted": law(held.flops), "low": low, "high": high,
             "measured": held.bpb, "inside": low <= held.bpb <= high}
    ratio = _mean([p.tokens / p.params for p in ladder])
    return {"sweep": sweep, "tokens_per_param": ratio, "points": [dataclasses.asdict(p) for p in ladder],
            "fit": dataclasses.asdict(law), "check": check, "runs": [dataclasses.asdict(r) for r in rows]}


def scaling_figure(report: dict) -> Figure:
    """Log-log: the fitted sizes, the fit and its 95% prediction band, the held-out size and its
    prediction."""
    law, check = PowerLaw(**report["fit"]), report["check"]
    ladder = [Point(**p) for p in report["points"]]
    fig = new_figure(8, 5.5)
    ax = fig.subplots()
    grid = np.geomspace(ladder[0].flops / 1.5, check["flops"] * 1.5, 100)
    bands = np.array([law.interval(c) for c in grid])
    ax.fill_between(grid, bands[:, 0], bands[:, 1], color="C0", alpha=0.15, label="95% prediction interval")
    ax.plot(grid, [law(c) for c in grid], color="C0",
            label=f"fit: bpb = {law.a:.3g} · C^-{law.alpha:.3f} (R² {law.r2:.3f})")
    fitted = ladder[:-1]
    ax.plot([p.flops for p in fitted], [p.bpb for p in fitted], "o", color="black", label="fitted sizes")
    ax.errorbar([check["flops"]], [check["predicted"]], fmt="s", mfc="none", color="C0", capsize=4,
                yerr=[[check["predicted"] - check["low"]], [check["high"] - check["predicted"]]],
                label=f"predicted {check['name']}: {check['predicted']:.3f}")
    ax.plot([check["flops"]], [check["measured"]], "*", ms=13, color="C3",
            label=f"measured {check['name']}: {check['measured']:.3f}")
    for p in ladder:
        ax.annotate(f"{p.name} ({p.params / 1e6:.2f}M)", (p.flops, p.bpb), textcoords="offset points",
                    xytext=(6, 6), fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="training FLOPs (GPT.flops_per_token x tokens)",
           ylabel="val bits per byte (whole split)",
           title=f"scaling ladder at {_tokens(report['tokens_per_param'])} per parameter")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


def write_tensorboard(report: dict, fig: Figure, log_dir: Path) -> None:
    """The points and the fit as scalars against the FLOPs (the step), and the figure as an image."""
    from torch.utils.tensorboard import SummaryWriter  # imported lazily: it pulls in tensorboard

    law = PowerLaw(**report["fit"])
    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for p in report["points"]:
            step = round(p["flops"])
            writer.add_scalar(TAGS["measured"], p["bpb"], step)
            writer.add_scalar(TAGS["fit"], law(p["flops"]), step)
        writer.add_image(TAGS["figure"], figure_to_rgb(fig), 0, dataformats="HWC")


def render_block(report: dict, figure: str) -> str:
    """The doc's block, markers included: the figure, the points, the fit and the held-out check."""
    law, check = PowerLaw(**report["fit"]), report["check"]
    lines = [BEGIN, "<!-- written by scripts/scaling.py from docs/scaling.json; do not edit by hand -->", "",
             f"![val bits per byte against training FLOPs, with the power-law fit]({figure})", "",
             "| size | non-embedding parameters | seeds | tokens | FLOPs | val bits per byte | fit |",
             "|---|---|---|---|---|---|---|"]
    for p in (Point(**p) for p in report["points"]):
        role = "held out" if p.name == check["name"] else f"{law(p.flops):.3f}"
        cells = [p.name, f"{p.params:,}", str(p.seeds), f"{p.tokens:,.0f}", f"{p.flops:.3g}", f"{p.bpb:.3f}",
                 role]
        lines.append("| " + " | ".join(cells) + " |")
    verdict = "inside" if check["inside"] else "outside"
    error = 100 * (check["measured"] / check["predicted"] - 1)
    lines += ["", f"Fit on the {law.n} smaller sizes: bpb = {law.a:.3g} · C^-{law.alpha:.4f} (R² "
              f"{law.r2:.4f}, residual s = {law.s:.2g} in log bpb). Predicted for {check['name']} at "
              f"{check['flops']:.3g} FLOPs: {check['predicted']:.3f} bits/byte (95% prediction interval "
              f"{check['low']:.3f} to {check['high']:.3f}); its run measured {check['measured']:.3f} "
              f"({error:+.1f}%), {verdict} the interval. Every size trains "
              f"{_tokens(report['tokens_per_param'])} per non-embedding parameter. Measured on: "
              f"{machines([RunRecord(**r) for r in report['runs']])}.", END]
    return "\n".join(lines)


def update_doc(text: str, block: str, name: str) -> str:
    """`text` with the block between the markers replaced by `block`."""
    return replace_block(text, BEGIN, END, block, name)


def _tokens(ratio: float) -> str:
    return f"{ratio:.3g} token" + ("" if f"{ratio:.3g}" == "1" else "s")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def write_report(sweep: Path, doc: Path | None) -> tuple[list[Path], str]:
    """Score the ladder's runs, fit and check, and write scaling.json, scaling.png, scaling.md and tb/ into
    `sweep`; with `doc`, also copy the JSON and the figure beside it and rewrite its block. Returns the paths
    written and the block. A missing doc or markers are refused before anything is scored."""
    from minigpt.checkpoint.format import read_meta
    from minigpt.lab.speedrun import score_run

    if doc is not None:
        if not doc.is_file():
            raise UserError(f"doc={doc} does not exist (the file that holds the scaling ladder)")
        update_doc(doc.read_text(encoding="utf-8"), "", doc.name)
    jobs = sweep_jobs(sweep, "make scaling")
    names = [read_meta(job / "checkpoints" / "last")["config"]["run_name"] or job.name for job in jobs]
    report = ladder_report([score_run(job) for job in jobs], names, str(sweep))
    fig = scaling_figure(report)
    json_path, png, md = sweep / "scaling.json", save_png(fig, sweep / "scaling.png"), sweep / "scaling.md"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md.write_text(f"# Scaling ladder: {sweep}\n\n{render_block(report, png.name)}\n")
    write_tensorboard(report, fig, sweep / "tb")
    written = [json_path, png, md, sweep / "tb"]
    if doc is not None:
        written += [Path(shutil.copy(json_path, doc.parent / "scaling.json")),
                    Path(shutil.copy(png, doc.parent / "scaling.png")), doc]
        text = doc.read_text(encoding="utf-8")
        doc.write_text(update_doc(text, render_block(report, "scaling.png"), doc.name), encoding="utf-8")
    return written, render_block(report, png.name)
