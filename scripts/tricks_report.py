"""The technique screen's tables: `python scripts/tricks_report.py runs=<folder> round=<name> [key=value]`.

Examples:
    python scripts/tricks_report.py runs=outputs/tricks round=muon bench=outputs/bench/techniques.json
    python scripts/tricks_report.py runs=outputs/tricks round=adamw +controls.s1260_muon01=base1500
    python scripts/tricks_report.py render=true       # re-render every round of docs/tricks.md only

`runs` holds one folder per arm, `<arm>/s<seed>/`, each a run of `scripts/train.py` (docs/tricks.md gives the
commands); an arm's control is the arm with the same steps and no change of its own, or the one
`+controls.<arm>=<control>` names. The arms are round `round` of the screen: written into `results`
(docs/tricks.json; the other rounds kept as they are) and as a table between the markers
`<!-- tricks:<round>:begin -->` and `<!-- tricks:<round>:end -->` of `doc` (minigpt/lab/tricks.py). `bench`:
`python scripts/bench.py 'only=[techniques]' json_out=...`, whose step-time ratios become the table's last
column for the arms named `<prefix>_<technique>`. Bad input ends with one line on stderr and exit code 2,
before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import TricksReportConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="tricks_report")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab.tricks import collect, render_rounds, step_ratios, write_round

    c = to_object(cfg, TricksReportConfig)
    if c.render:
        written = render_rounds(Path(c.results), Path(c.doc))
    else:
        runs, round_name = c.arms()
        doc = collect(Path(runs), dict(c.controls))
        doc["step_ratios"] = step_ratios(Path(c.bench) if c.bench else None, doc["arms"])
        written = write_round(round_name, doc, Path(c.results), Path(c.doc))
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(main)
