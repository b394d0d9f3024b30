"""Report on an ablation-lab sweep: `python scripts/ablation_report.py [sweep=<folder>] [docs=true]`.

Examples:
    make ablation SEEDS=3                                        # trains the lab's runs, then calls this
    python scripts/ablation_report.py sweep=outputs/ablation/<date>/<time>
    python scripts/ablation_report.py sweep=outputs/ablation/<date>/<time> docs=true   # the documented run

Measures each run's final checkpoint (val loss, bits per byte, per-layer gradient norms and attention
entropy, greedy and sampled continuations), puts the seeds of each lab file together (mean ± 95% interval,
the paired comparison with the baseline and its p-value) and writes ablation.json, ablation.md and
ablation.png into the sweep folder (minigpt/lab/ablation_report.py). docs=true also copies the JSON and the
figure beside `doc` (docs/ablation.md) and regenerates its block between the ablation markers. Without
sweep=: the newest under outputs/ablation. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import AblationReportConfig

register_configs()
SWEEPS = Path("outputs/ablation")


@hydra.main(version_base="1.3", config_path="../configs", config_name="ablation_report")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    c = to_object(cfg, AblationReportConfig)
    # the checkpoints' own ablation warnings are the point of the lab, not news: keep the console short
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    from minigpt.lab.ablation_report import write_report
    from minigpt.lab.runs import newest_sweep

    doc = Path(c.doc) if c.docs else None
    sweep = Path(c.sweep) if c.sweep else newest_sweep(SWEEPS, "make ablation")
    for path in write_report(sweep, doc=doc):
        print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(main)
