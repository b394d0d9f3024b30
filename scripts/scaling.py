"""The scaling ladder's fit: `python scripts/scaling.py [sweep=<folder>] [docs=true]`.

`make scaling` trains the sizes of configs/experiment/scaling/ at one tokens-per-parameter ratio as one Hydra
multirun of scripts/train.py, then calls this on its folder, which scores every run on the whole val split,
fits a power law of val bits per byte against training FLOPs on every size but the largest, predicts the
largest and checks the prediction against its run (minigpt/lab/scaling.py). It writes scaling.json,
scaling.png, scaling.md and TensorBoard logs (tb/) into the sweep folder; docs=true also copies the JSON and
the figure beside `doc` (docs/scaling.md) and rewrites its block between the scaling markers.

    python scripts/scaling.py                                      # the newest ladder under outputs/scaling
    python scripts/scaling.py sweep=outputs/scaling/<date>/<time> docs=true

Bad input ends with one line on stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import ScalingConfig

register_configs()
SWEEPS = Path("outputs/scaling")


@hydra.main(version_base="1.3", config_path="../configs", config_name="scaling")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab.runs import newest_sweep
    from minigpt.lab.scaling import write_report  # after composition: `--help` answers without torch

    c = to_object(cfg, ScalingConfig)
    sweep = Path(c.sweep) if c.sweep else newest_sweep(SWEEPS, "make scaling")
    written, block = write_report(sweep, Path(c.doc) if c.docs else None)
    print(block)
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(main)
