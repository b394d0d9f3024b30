"""Loss curves: read a run's TensorBoard event files and plot train/val loss and the learning rate.

A *run* is a folder written by `scripts/train.py` (`outputs/train/<date>/<time>/`): its scalars live in
`tb/events.out.tfevents.*` and the command-line overrides that made it in `.hydra/overrides.yaml`.
Several runs (a `-m` sweep) go on one figure; the legend shows each run's overrides, minus those that
all runs share (those go in the title), so a sweep over `optim.lr` reads as a legend of learning rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure
from omegaconf import OmegaConf

from minigpt.errors import UserError
from minigpt.inspect.plotting import new_figure

EVENT_GLOB = "events.out.tfevents.*"
LOSS_TAGS = ("train/loss", "val/loss")
LR_TAG = "optim/lr"


@dataclass
class RunCurves:
    """One run's scalars: tag -> (steps, values), steps increasing."""

    run_dir: Path
    label: str
    scalars: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)


def read_scalars(event_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """Every scalar tag in the event files directly inside `event_dir`, as (steps, values).

    A resumed run appends a second event file that may repeat steps logged after the last checkpoint;
    for a repeated step the value written last (by wall time) wins, as TensorBoard itself shows it.
    """
    # imported here: tensorboard's event reader pulls in protobuf and friends, slow to import and only
    # needed by this tool
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not any(Path(event_dir).glob(EVENT_GLOB)):
        raise UserError(f"no TensorBoard event files in {event_dir}; pass a training run folder")
    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})  # 0: keep every point, no sampling
    acc.Reload()
    out: dict[str, tuple[list[int], list[float]]] = {}
    for tag in acc.Tags()["scalars"]:
        by_step: dict[int, float] = {}
        for ev in sorted(acc.Scalars(tag), key=lambda e: e.wall_time):
            by_step[ev.step] = ev.value
        steps = sorted(by_step)
        out[tag] = (steps, [by_step[s] for s in steps])
    return out


def find_runs(paths: list[Path]) -> list[Path]:
    """The folders holding event files under `paths` (a run folder, its tb/, or a sweep folder), sorted."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise UserError(f"{p} is not a folder; pass a run folder such as outputs/train/<date>/<time>")
        if any(p.glob(EVENT_GLOB)):
            found.add(p)
        else:
            found.update(f.parent for f in p.rglob(EVENT_GLOB))
    if not found:
        raise UserError(f"no TensorBoard event files under {', '.join(map(str, paths))}; train a model first")
    return sorted(found)


def _run_folder(event_dir: Path) -> Path:
    """The run folder of an event folder: the parent of `tb/`, else the folder itself."""
    return event_dir.parent if event_dir.name == "tb" else event_dir


def _overrides(run_dir: Path) -> list[str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    return [str(o) for o in OmegaConf.load(path)]


def load_runs(paths: list[Path]) -> tuple[list[RunCurves], list[str]]:
    """Every run under `paths`, labelled by its own overrides, and the overrides all runs share."""
    event_dirs = find_runs(paths)
    run_dirs = [_run_folder(d) for d in event_dirs]
    overrides = [_overrides(r) for r in run_dirs]
    shared = [o for o in overrides[0] if all(o in other for other in overrides[1:])]
    if len(overrides) == 1:
        shared = []  # a single run keeps its overrides as its label
    runs = []
    for event_dir, run_dir, ovr in zip(event_dirs, run_dirs, overrides, strict=True):
        own = [o for o in ovr if o not in shared]
        label = " ".join(own) if own else run_dir.name
        runs.append(RunCurves(run_dir=run_dir, label=label, scalars=read_scalars(event_dir)))
    return runs, shared


def plot_loss_curves(runs: list[RunCurves], title: str = "") -> Figure:
    """Loss (train solid, val dashed with markers) and learning rate against optimizer steps."""
    fig = new_figure(10, 6)
    ax_loss, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for run, color in zip(runs, colors, strict=True):
        if "train/loss" in run.scalars:
            ax_loss.plot(*run.scalars["train/loss"], color=color, lw=1.2, label=f"{run.label} train")
        if "val/loss" in run.scalars:
            ax_loss.plot(*run.scalars["val/loss"], color=color, ls="--", marker="o", ms=3,
                         label=f"{run.label} val")
        if LR_TAG in run.scalars:
            ax_lr.plot(*run.scalars[LR_TAG], color=color, lw=1.2)
    if not any(tag in run.scalars for run in runs for tag in LOSS_TAGS):
        raise UserError("the runs logged no train/loss or val/loss scalars; is this a minigpt training run?")
    ax_loss.set_ylabel("cross-entropy loss (nats/token)")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    ax_loss.set_title(title or "loss curves")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimizer step")
    ax_lr.grid(alpha=0.3)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    return fig
