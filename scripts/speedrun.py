"""The CPU speedrun's table: `python scripts/speedrun.py [sweep=<folder>] [docs=true] [render=true]`.

`make speedrun SEEDS=3` trains the candidates of configs/experiment/speedrun/ x 3 seeds at equal FLOPs as one
Hydra multirun of scripts/train.py, then calls this on its folder, which scores every job on the whole val
split (stride = block) and writes speedrun.json (one row per run) and speedrun.md (the table: mean ± 95%
interval per config, the paired comparison with the baseline and its p-value) into the sweep folder
(minigpt/lab/speedrun.py).

    python scripts/speedrun.py                                      # the newest sweep in outputs/speedrun
    python scripts/speedrun.py sweep=outputs/speedrun/<date>/<time> docs=true   # + docs/speedrun.{json,md}
    python scripts/speedrun.py render=true                          # re-render docs/speedrun.md only

docs=true merges the rows into docs/speedrun.json (a rerun of a config, budget and seed on the same machine
replaces its row; rows of other machines stay) and rewrites the table between docs/speedrun.md's markers.
Bad input ends with one line on stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import SpeedrunConfig

register_configs()
SWEEPS = Path("outputs/speedrun")


@hydra.main(version_base="1.3", config_path="../configs", config_name="speedrun")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab.runs import newest_sweep
    from minigpt.lab.speedrun import write_report  # after composition: `--help` answers without torch

    c = to_object(cfg, SpeedrunConfig)
    doc = Path(c.doc) if c.docs or c.render else None
    sweep = None if c.render else Path(c.sweep) if c.sweep else newest_sweep(SWEEPS, "make speedrun")
    written, table = write_report(sweep, Path(c.results), doc)
    print(table)
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(main)
