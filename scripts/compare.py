"""Compare a candidate with a baseline: `make compare CANDIDATE="..." ARGS="key=value ..."`.

    mode=quality    paired seeds, the two arms side by side, until the sequential test decides: better,
                    worse, equivalent within ±min_effect, or undecided at max_pairs (minigpt/lab/compare.py);
                    run the same command again to resume a stopped comparison
    mode=speed      for a change that claims the same math, faster: the same losses over `steps` steps
                    (bit for bit, or within `tolerance`), and only then the speed (lab/compare_speed.py)
    mode=simulate   the sequential test's error rate and power on simulated paired differences

    make compare CANDIDATE="experiment=speedrun/six_layers"                # against the speedrun's baseline
    python scripts/compare.py 'candidate=["experiment=speedrun/six_layers"]'   # the same (Hydra wants the
                                                                           # quotes: the overrides hold =)
    make compare BASELINE="experiment=ablation/baseline" CANDIDATE="experiment=ablation/qk_norm"
    make compare CANDIDATE="experiment=speedrun/modern" ARGS="docs=true"   # + docs/comparisons.md

Both arms are composed here first (a misspelled key is refused before anything trains) and must share one
budget of work. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import hydra
from omegaconf import DictConfig

from minigpt.cli import reports_user_errors, run_cli, to_object
from minigpt.config import register_configs
from minigpt.errors import UserError
from minigpt.lab.config import CompareConfig

register_configs()


def trainer_of(arm: str, overrides: list[str]) -> dict:
    """The arm's resolved `trainer` config, composed as scripts/train.py would compose it."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from minigpt.training.config import TrainConfig

    try:
        cfg = hydra.compose(config_name="train", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise UserError(f"{arm}: {str(e).strip().splitlines()[0]}") from None
    return dataclasses.asdict(to_object(cfg, TrainConfig).trainer)


@hydra.main(version_base="1.3", config_path="../configs", config_name="compare")
@reports_user_errors
def main(cfg: DictConfig) -> None:
    from minigpt.lab import compare, compare_report, compare_speed  # after composition: `--help` stays fast
    from minigpt.lab.speedrun import score_run

    c = to_object(cfg, CompareConfig)
    doc, results_path = Path(c.doc), Path(c.results)
    if c.mode == "simulate":
        table = compare_report.simulation_table(c.alpha, c.prior_scale)
        print(table)
        if c.docs:
            compare_report.write_doc(doc, compare_report.SIM_BEGIN, compare_report.SIM_END, table)
        return
    if c.render:
        return print(compare_report.render_into(doc, results_path))
    if c.docs:  # refused now rather than after hours of training
        compare_report.write_doc(doc, compare_report.BEGIN, compare_report.END, None)
    if not c.candidate:
        raise UserError("candidate=[...] is empty: give the overrides of the config to compare, e.g. "
                        "'candidate=[\"experiment=speedrun/six_layers\"]' (or make compare CANDIDATE=...)")
    name = c.name or " ".join(c.candidate)
    out = Path(c.out or Path("outputs/compare") / re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_"))
    trainers = [trainer_of(arm, [*overrides, *c.budget]) for arm, overrides in
                (("baseline", c.baseline), ("candidate", c.candidate))]
    compare.check_budgets(*trainers)
    if c.mode == "speed":
        verdict = compare_speed.run_gate(tuple(c.baseline), tuple(c.candidate), c.steps, c.repeats,
                                         c.first_seed, out, c.threads, c.train_args, c.tolerance)
        return print(verdict["text"])
    spec = compare.Spec(tuple(c.baseline), tuple(c.candidate), tuple(c.budget), c.metric, c.min_effect,
                        c.alpha, c.prior_scale, c.first_seed)
    schedule = compare.Schedule(c.max_pairs, c.pairs_per_look, c.side_by_side, c.threads, tuple(c.train_args))
    state = compare.run_comparison(spec, schedule, out, name, score_run)
    print(compare_report.report(state, schedule.max_pairs))
    print(f"wrote {out / compare.RESULTS}")
    if c.docs:
        print(compare_report.document(state, doc, results_path))


if __name__ == "__main__":
    run_cli(main)
