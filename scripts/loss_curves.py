"""Plot loss curves from TensorBoard logs: `python scripts/loss_curves.py ['runs=[RUN_OR_SWEEP, ...]']`.

Examples:
    python scripts/loss_curves.py                                             # the newest run
    python scripts/loss_curves.py 'runs=[outputs/train/multirun/<date>/<time>]'   # a sweep: a line per run
    python scripts/loss_curves.py 'runs=[outputs/train/<date>/<t1>,outputs/train/<date>/<t2>]' out=cmp.png

Train loss (solid), val loss (dashed) and the learning rate against the optimizer step; the legend shows
each run's command-line overrides (minigpt/lab/loss_curves.py). Bad input ends with one line on stderr and
exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import LossCurvesConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="loss_curves")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.checkpoint.load import find_latest_checkpoint
    from minigpt.inspect.plotting import save_png
    from minigpt.lab.loss_curves import load_runs, plot_loss_curves

    c = to_object(cfg, LossCurvesConfig)
    # the newest checkpoint's run folder: <run>/checkpoints/last -> <run>
    paths = [Path(r) for r in c.runs] or [find_latest_checkpoint(Path("outputs")).parent.parent]
    runs, shared = load_runs(paths)
    title = c.title or (" ".join(shared) if shared else "")
    print(f"loss curves of {len(runs)} run(s): {save_png(plot_loss_curves(runs, title), Path(c.out))}")


if __name__ == "__main__":
    run_cli(main)
