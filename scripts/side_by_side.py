"""The reference recipe and minigpt side by side: `python scripts/side_by_side.py reference_path=<checkout>`.

Examples:
    python scripts/side_by_side.py reference_path=/path/to/nanochat                  # 3 seeds, both arms
    python scripts/side_by_side.py reference_path=... 'seeds=[1337]' arms=[reference] hydra.run.dir=<out>
    python scripts/side_by_side.py reference_path=... minigpt.model.value_embeds=true  # another minigpt arm
    python scripts/side_by_side.py reference_path=... reference.steps=1850           # the reference for less
    python scripts/side_by_side.py reference_path=... throughput=true 'threads=[1,2]'   # tokens/s of each
    python scripts/side_by_side.py reference_path=... parity_steps=3 minigpt.optim.weight_decay=0.28  # same?

Both arms train on minigpt's prepared bins and batches, seed for seed, for minigpt.trainer.max_steps steps,
and are scored on the whole val split as `scripts/evaluate.py stride=<block_size>` scores
(minigpt/lab/side_by_side.py). Runs go to `<run folder>/<arm>/s<seed>/`; a finished one is not trained again,
and the table covers every finished run of the folder (two commands may train into one folder). doc=<page>
also writes the table between the page's side_by_side:<name> markers and its numbers into
side_by_side.json beside it. Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.lab.config import SideBySideConfig

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="side_by_side")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab import side_by_side as sbs  # after composition: `--help` answers without torch
    from minigpt.lab.reference_parity import parity_report as sbs_parity
    from minigpt.lab.reference_parity import render_parity
    from minigpt.lab.side_by_side_throughput import render_throughput, throughput

    c = to_object(cfg, SideBySideConfig)
    out = Path(HydraConfig.get().runtime.output_dir)
    if c.doc:
        sbs.check_doc(Path(c.doc), c.name)
    if c.parity_steps:
        doc = sbs_parity(c)
        table, name = render_parity(doc), "parity.json"
    elif c.throughput:
        doc = throughput(c)
        table, name = render_throughput(doc), "throughput.json"
    else:
        sbs.train_arms(c, out)
        doc = sbs.compare(sbs.collect(out))
        table, name = sbs.render_table(doc), "side_by_side.json"
    (out / name).write_text(json.dumps(doc, indent=1) + "\n")
    print(table)
    for path in [out / name, *(sbs.write_doc(Path(c.doc), c.name, doc, table) if c.doc else [])]:
        print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(main)
