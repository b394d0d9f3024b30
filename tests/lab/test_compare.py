"""The compare command: its loop (which seeds it trains, when it stops, what it saves, how it resumes) with
the training replaced by a stand-in that records what it was asked and scores runs from a table written here;
the speed gate's decision on runs made here; the documented blocks of docs/comparisons.md; and one real
comparison and one real speed gate of tiny models through the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_helpers import run_script
from conftest import ROOT, fast_overrides

from minigpt.errors import UserError
from minigpt.lab import compare, compare_report, compare_speed
from minigpt.lab.compare_sequential import decide
from minigpt.lab.runs import RunRecord

SPEC = compare.Spec(("experiment=a",), ("experiment=b",), ("trainer.max_flops=1e12",))


def record(seed: int, bpb: float, budget: str = "trainer.max_flops=1e+12") -> RunRecord:
    return RunRecord(config="x", seed=seed, budget=budget, machine={"cpu": "cpu A", "cores": 2,
                     "dtype": "float32", "torch": "2.13"}, steps=10, params=100, tokens=1000, flops=1e12,
                     train_seconds=1.0, tokens_per_s=1000.0, val_loss=bpb * 2, bits_per_byte=bpb,
                     command="python scripts/train.py x", date="2026-01-01")


class FakeTraining:
    """Stands in for the training processes: notes each batch of multiruns it is given (arm, seeds), and
    scores a run folder `<out>/<arm>/seed<seed>` from `values[arm][seed]`."""

    def __init__(self, monkeypatch, values: dict[str, dict[int, float]], fail: tuple[str, int] | None = None):
        self.values, self.fail, self.batches = values, fail, []
        monkeypatch.setattr(compare, "run_together", self.run_together)

    def run_together(self, multiruns, train_args, threads):
        self.batches.append([(m.sweep_dir.name, list(m.seeds)) for m in multiruns])
        return [(s, m.run_dir(s), m.log) for m in multiruns for s in m.seeds
                if (m.sweep_dir.name, s) == self.fail]

    def score(self, run: Path) -> RunRecord:
        seed = int(run.name.removeprefix("seed"))
        return record(seed, self.values[run.parent.name][seed])


def values_with(diffs: list[float]) -> dict[str, dict[int, float]]:
    base = {1337 + i: 2.0 + 0.05 * math.sin(i) for i in range(len(diffs))}
    return {"baseline": base, "candidate": {s: b + d for (s, b), d in zip(base.items(), diffs, strict=True)}}


WORSE = [0.09, 0.12, 0.05, 0.11, 0.08, 0.10, 0.1, 0.1]  # decided "worse" at the 5th pair (by hand below)


def test_it_trains_pairs_side_by_side_until_the_verdict_and_saves_every_run(tmp_path: Path, monkeypatch):
    assert [decide(WORSE[:n], 0.01, 12).kind for n in range(1, 7)] == ["running"] * 4 + ["worse", "worse"]
    fake = FakeTraining(monkeypatch, values_with(WORSE))
    state = compare.run_comparison(SPEC, compare.Schedule(max_pairs=12), tmp_path, "b", fake.score)
    assert fake.batches == [[("baseline", [s]), ("candidate", [s])] for s in range(1337, 1342)]
    assert state["verdict"]["kind"] == "worse" and state["verdict"]["pairs"] == 5
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved == state and [(r["arm"], r["seed"]) for r in saved["runs"]][:4] == [
        ("baseline", 1337), ("candidate", 1337), ("baseline", 1338), ("candidate", 1338)]
    assert compare.differences(saved) == pytest.approx(WORSE[:5])


def test_groups_alternation_and_the_cap(tmp_path: Path, monkeypatch):
    mixed = [0.05, -0.04, 0.06, -0.05, 0.03, -0.02, 0.04]
    fake = FakeTraining(monkeypatch, values_with(mixed))
    schedule = compare.Schedule(max_pairs=7, pairs_per_look=3, side_by_side=False)
    state = compare.run_comparison(SPEC, schedule, tmp_path, "b", fake.score)
    # one arm at a time, which one first alternating by group; the last group cut at the cap
    assert fake.batches == [[("baseline", [1337, 1338, 1339])], [("candidate", [1337, 1338, 1339])],
                            [("candidate", [1340, 1341, 1342])], [("baseline", [1340, 1341, 1342])],
                            [("baseline", [1343])], [("candidate", [1343])]]
    assert state["verdict"]["kind"] == "undecided" and state["verdict"]["pairs"] == 7


def test_a_stopped_comparison_resumes_where_it_stopped(tmp_path: Path, monkeypatch):
    fake = FakeTraining(monkeypatch, values_with(WORSE), fail=("candidate", 1340))
    with pytest.raises(UserError, match=r"candidate/seed1340 did not finish .*run the same command again"):
        compare.run_comparison(SPEC, compare.Schedule(), tmp_path, "b", fake.score)
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert len(compare.pairs(saved)) == 3 and [(r["arm"], r["seed"]) for r in saved["runs"]][-1] == \
        ("baseline", 1340)  # the finished half of the failed pair is kept
    assert saved["failed"] == [{"seed": 1340, "arm": "candidate", "reason": saved["failed"][0]["reason"]}]
    fake.fail, fake.batches = None, []
    state = compare.run_comparison(SPEC, compare.Schedule(), tmp_path, "b", fake.score)
    assert fake.batches[0] == [("candidate", [1340])]  # only what was missing
    assert state["verdict"]["pairs"] == 5 and state["failed"] == []
    fake.batches = []
    compare.run_comparison(SPEC, compare.Schedule(), tmp_path, "b", fake.score)
    assert fake.batches == []  # decided: nothing more to train
    other = compare.Spec(SPEC.baseline, SPEC.candidate, SPEC.budget, min_effect=0.02)
    with pytest.raises(UserError, match=r"other settings \(min_effect: 0.01 there, 0.02 now\)"):
        compare.run_comparison(other, compare.Schedule(), tmp_path, "b", fake.score)


def test_settings_and_budgets_are_checked_before_anything_trains():
    with pytest.raises(UserError, match="same overrides"):
        compare.Spec(("a=1",), ("a=1",), ())
    with pytest.raises(UserError, match="is a sweep"):
        compare.Spec(("a=1",), ("a=2,3",), ())
    with pytest.raises(UserError, match="min_effect=0"):
        compare.Spec(("a=1",), ("a=2",), (), min_effect=0)
    flops = {"max_steps": None, "max_flops": 1e12, "max_time": None}
    compare.check_budgets(flops, dict(flops))
    with pytest.raises(UserError, match="different budgets"):
        compare.check_budgets(flops, {**flops, "max_flops": 2e12})
    with pytest.raises(UserError, match="max_time buys a busy machine fewer steps"):
        compare.check_budgets({"max_time": "3min"}, {"max_time": "3min"})


def _speed_run(arm: str, repeat: int, losses: list[float], rate: float, busy: float = 0.0):
    return compare_speed.SpeedRun(arm, repeat, losses, rate, busy)


def test_the_speed_gate_compares_speed_only_after_equal_losses():
    losses = [5.0, 4.5, 4.25]
    runs = [_speed_run("baseline", 0, losses, 1000.0), _speed_run("candidate", 0, losses, 1300.0),
            _speed_run("baseline", 1, losses, 1100.0), _speed_run("candidate", 1, losses, 1320.0)]
    verdict = compare_speed.speed_verdict(runs, 0.0)
    # medians: candidate (1300 + 1320) / 2 = 1310, baseline 1050; per-repeat ratios 1.3 and 1.2
    assert verdict["kind"] == "same_losses" and verdict["speedup"] == pytest.approx(1310 / 1050)
    assert verdict["ratios"] == pytest.approx([1.3, 1.2]) and "busy" not in verdict["text"]
    off = [*runs[:3], _speed_run("candidate", 1, [5.0, 4.5, 4.250001], 2000.0)]
    verdict = compare_speed.speed_verdict(off, 0.0)
    assert verdict["kind"] == "not_the_same" and "step 3" in verdict["text"] and "speedup" not in verdict
    assert compare_speed.speed_verdict(off, 1e-5)["kind"] == "same_losses"
    restless = [*runs[:2], _speed_run("baseline", 1, [5.0, 4.6, 4.25], 1.0), runs[3]]
    assert compare_speed.speed_verdict(restless, 0.0)["kind"] == "not_deterministic"
    busy = [*runs[:3], _speed_run("candidate", 1, losses, 1320.0, busy=1.2)]
    assert "busy (up to 1.20 cores" in compare_speed.speed_verdict(busy, 0.0)["text"]


def test_the_report_and_the_documented_blocks(tmp_path: Path, monkeypatch):
    fake = FakeTraining(monkeypatch, values_with(WORSE))
    state = compare.run_comparison(SPEC, compare.Schedule(), tmp_path, "b", fake.score)
    text = compare_report.report(state, 12)
    assert "| 1337 | 2.0000 | 2.0900 | +0.0900 | +0.090 (no interval yet) |" in text
    assert text.endswith("verdict: " + decide(WORSE[:5], 0.01, 12).text("bits/byte"))
    block = compare_report.render_block(compare_report.merge({"comparisons": []}, state))
    assert "| `b` | 1e+12 FLOPs | bits/byte | 0.01 | **worse** | 5 (1337-1341) |" in block


def test_the_docs_show_what_their_json_and_the_simulation_render_to():
    text = (ROOT / "docs" / "comparisons.md").read_text(encoding="utf-8")
    results = compare_report.load_results(ROOT / "docs" / "comparisons.json")
    names = [c["name"] for c in results["comparisons"]]
    assert "no_attn_scale" in names  # a decided comparison is documented
    stale = "docs/comparisons.md is stale: run `python scripts/compare.py render=true`"
    assert compare_report.render_block(results) in text, stale
    assert compare_report.simulation_table(0.05, 2.0) in text, "stale: compare.py mode=simulate docs=true"


def test_rendering_from_a_missing_or_empty_results_file_is_refused(tmp_path: Path, capsys):
    doc = tmp_path / "comparisons.md"
    doc.write_text(f"a\n{compare_report.BEGIN}\nthe table\n{compare_report.END}\n")
    for results in (tmp_path / "nowhere.json", tmp_path / "empty.json"):
        (tmp_path / "empty.json").write_text('{"comparisons": []}')
        run = run_script("compare", ["render=true", f"doc={doc}", f"results={results}"], capsys)
        assert run.code == 2 and len(run.err_lines) == 1 and "nothing to render" in run.err_lines[0]
        assert doc.read_text() == f"a\n{compare_report.BEGIN}\nthe table\n{compare_report.END}\n"


@pytest.mark.slow
def test_a_real_comparison_resumes_and_a_real_speed_gate(tmp_path: Path, corpus_dir: Path, capsys):
    fast = fast_overrides(tmp_path, corpus_dir)
    arms = [f"baseline=[{','.join(repr(o) for o in fast)}]",
            f"candidate=[{','.join(repr(o) for o in [*fast, 'model.n_layer=1'])}]",
            "budget=['trainer.max_steps=3']", f"out={tmp_path / 'cmp'}"]
    run = run_script("compare", [*arms, "max_pairs=1"], capsys)
    assert run.code == 0, run.err
    first = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [(r["arm"], r["seed"], r["steps"]) for r in first["runs"]] == [("baseline", 1337, 3),
                                                                          ("candidate", 1337, 3)]
    assert first["verdict"]["kind"] == "undecided" and "verdict: undecided at the cap of 1 pair" in run.out
    meta = tmp_path / "cmp" / "baseline" / "seed1337" / "checkpoints" / "last" / "meta.json"
    stamp = meta.stat().st_mtime
    # The same command again: the settings read back from compare.json are the command line's, and the
    # finished pair is neither trained nor scored again (which seeds a raised cap trains next: FakeTraining).
    run = run_script("compare", [*arms, "max_pairs=1"], capsys)
    assert run.code == 0, run.err
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text()) == first
    assert meta.stat().st_mtime == stamp  # not trained again
    same = [arms[0], f"candidate=[{','.join(repr(o) for o in [*fast, 'logging.progress_bar=true'])}]",
            "mode=speed", "steps=3", "repeats=1", f"out={tmp_path / 'speed'}"]
    run = run_script("compare", same, capsys)
    assert run.code == 0, run.err
    assert "same losses bit for bit over 3 steps" in run.out
    record_ = json.loads((tmp_path / "speed" / "speed-0" / "speed.json").read_text())
    assert [len(r["losses"]) for r in record_["runs"]] == [3, 3]
