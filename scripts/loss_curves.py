"""Plot loss curves from TensorBoard logs: `python scripts/loss_curves.py [RUN_OR_SWEEP ...] [--out X.png]`.

Examples:
    python scripts/loss_curves.py                                         # the newest run under outputs/train
    python scripts/loss_curves.py outputs/train/multirun/<date>/<time>    # a -m sweep: one line per run
    python scripts/loss_curves.py outputs/train/<date>/<t1> outputs/train/<date>/<t2> --out cmp.png

Train loss (solid), val loss (dashed) and the learning rate against the optimizer step; the legend shows
each run's command-line overrides (minigpt/lab/loss_curves.py). A pure file tool, so plain arguments
rather than Hydra; bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minigpt.errors import UserError, exit_with_error


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", type=Path, help="run folders, their tb/ folders, or sweep folders")
    p.add_argument("--out", type=Path, default=Path("outputs/inspect/loss_curves.png"))
    p.add_argument("--title", default="", help="figure title (default: the overrides all runs share)")
    args = p.parse_args(argv)
    from minigpt.checkpoint.load import find_latest_checkpoint
    from minigpt.inspect.plotting import save_png
    from minigpt.lab.loss_curves import load_runs, plot_loss_curves

    try:
        # the newest checkpoint's run folder: <run>/checkpoints/last -> <run>
        paths = args.runs or [find_latest_checkpoint(Path("outputs")).parent.parent]
        runs, shared = load_runs(paths)
        title = args.title or (" ".join(shared) if shared else "")
        print(f"loss curves of {len(runs)} run(s): {save_png(plot_loss_curves(runs, title), args.out)}")
    except UserError as e:
        exit_with_error(str(e))


if __name__ == "__main__":
    main()
