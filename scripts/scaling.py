"""The scaling ladder: `python scripts/scaling.py [out=<folder>] [docs=true]` (`make scaling`).

Trains the IsoFLOP profiles of configs/scaling.yaml (sizes of configs/experiment/scaling/ at budgets of
trainer.max_flops, `seeds` seeds each, `jobs` runs at a time), fits L(N, D) = E + A/N^alpha + B/D^beta with
bootstrap intervals, predicts the held-out sizes at a larger budget, writes the prediction down, then trains
them and checks it (minigpt/lab/scaling.py). Writes scaling.json, scaling.png, scaling.md and TensorBoard
logs (tb/) into `out`; docs=true also copies the JSON and the figure beside `doc` (docs/scaling.md) and
rewrites its block between the scaling markers.

    python scripts/scaling.py                                  # train what is missing, fit, report
    python scripts/scaling.py out=outputs/scaling/ladder docs=true
    python scripts/scaling.py train=false                      # score what finished, refit

Every finished run is a row of `<out>/ladder.json` at once, so the same command resumes a stopped ladder.
Bad input ends with one line on stderr and exit code 2, before anything is trained.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import ScalingConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="scaling")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab import scaling, scaling_report  # after composition: `--help` answers without torch
    from minigpt.lab.speedrun import score_run

    c = to_object(cfg, ScalingConfig)
    doc = Path(c.doc) if c.docs else None
    if doc is not None:
        scaling_report.check_doc(doc)  # refused now rather than after an hour of training
    profiles = [(p.flops, p.sizes) for p in c.profiles]
    points = scaling.ladder_points(profiles, (c.held_out.flops, c.held_out.sizes))
    seeds = list(range(c.first_seed, c.first_seed + c.seeds))
    out = Path(c.out)
    ladder = scaling.run_ladder(points, seeds, out, score_run, train=c.train, train_args=tuple(c.train_args),
                                threads=c.threads, jobs=c.jobs, repeats=c.bootstrap)
    default_run = scaling.default_run_shape(points[0].run_dir(out, seeds[0]))
    written = scaling_report.write_report(ladder, default_run, out, doc)
    print((out / "scaling.md").read_text())
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(main)
