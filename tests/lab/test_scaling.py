"""The scaling ladder: the fit of L(N, D) against laws written here and their gradient against finite
differences, the compute-optimal split against a numerical minimisation, the bootstrap and the prediction
interval against percentiles taken here, the ladder's order (the prediction is saved before the held-out
runs train) with the training replaced, its report and TensorBoard logs, the checked-in doc, and a real
tiny ladder through the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_script
from conftest import CONFIG_DIR, ROOT, compose_train, fast_overrides
from scipy import optimize
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minigpt.cli import to_object
from minigpt.errors import UserError
from minigpt.lab import scaling, scaling_fit, scaling_report
from minigpt.lab.runs import RunRecord
from minigpt.training.config import TrainConfig

TRUE = scaling_fit.LossLaw(E=1.8, A=400.0, alpha=0.4, B=600.0, beta=0.35)
SIZES = {"w016": 79_000, "w032": 177_000, "w048": 295_000, "w064": 439_000, "w096": 775_000}
PROFILES = [(6e11, ["w016", "w032", "w048", "w064"]), (1.5e12, ["w016", "w032", "w048", "w064", "w096"]),
            (4e12, ["w032", "w048", "w064", "w096"])]
HELD_OUT = (1.2e13, ["w048", "w064"])


def law_value(n: float, d: float) -> float:
    return 1.8 + 400.0 / n ** 0.4 + 600.0 / d ** 0.35


def ladder_data(noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    n, d = [], []
    for flops, sizes in PROFILES:
        for size in sizes:
            for _ in range(2):
                n.append(SIZES[size])
                d.append(flops / (6.9 * SIZES[size]))
    n, d = np.array(n, dtype=float), np.array(d)
    exact = np.array([law_value(a, b) for a, b in zip(n, d, strict=True)])
    loss = exact * np.exp(rng.normal(0, noise, len(n)))
    return n, d, loss


def test_an_exact_law_is_recovered():
    n, d, loss = ladder_data(noise=0.0)
    law = scaling_fit.fit_law(n, d, loss)
    got = law(n, d)
    assert np.max(np.abs(got / loss - 1)) < 2e-4
    assert (law.alpha, law.beta) == (pytest.approx(0.4, abs=0.02), pytest.approx(0.35, abs=0.02))


def test_the_gradient_is_the_objectives_slope():
    n, d, loss = ladder_data(noise=0.01)
    x = np.array([6.0, 6.4, 0.6, 0.4, 0.35])
    value, grad = scaling_fit._loss(x, np.log(n), np.log(d), np.log(loss))
    step = 1e-6
    numeric = [(scaling_fit._loss(x + step * e, np.log(n), np.log(d), np.log(loss))[0] -
                scaling_fit._loss(x - step * e, np.log(n), np.log(d), np.log(loss))[0]) / (2 * step)
               for e in np.eye(5)]
    assert grad == pytest.approx(numeric, rel=1e-4, abs=1e-9)
    r = np.log(TRUE(n, d)) - np.log(loss)  # at the true law, the Huber loss by its definition
    huber = np.where(np.abs(r) <= 1e-3, 0.5 * r * r, 1e-3 * (np.abs(r) - 0.5e-3)).sum()
    true_x = np.array([math.log(400), math.log(600), math.log(1.8), 0.4, 0.35])
    assert scaling_fit._loss(true_x, np.log(n), np.log(d), np.log(loss))[0] == pytest.approx(huber)


def test_the_compute_optimal_split_minimises_the_loss_at_fixed_compute():
    for flops in (1e12, 1e14):
        def at_fixed_compute(log_n: float, c: float = flops) -> float:
            return TRUE(math.exp(log_n), c / (6 * math.exp(log_n)))

        best = optimize.minimize_scalar(at_fixed_compute, bounds=(math.log(1e3), math.log(1e10)),
                                        method="bounded", options={"xatol": 1e-10})
        n_opt, d_opt = TRUE.optimum(flops)
        assert n_opt == pytest.approx(math.exp(best.x), rel=1e-4)
        assert 6 * n_opt * d_opt == pytest.approx(flops)
        assert TRUE.tokens_per_param(flops) == pytest.approx(d_opt / n_opt)


def test_a_law_without_a_size_or_data_term_puts_all_compute_on_the_other_side():
    flops = 1e12
    no_size = scaling_fit.LossLaw(E=1.8, A=400.0, alpha=0.0, B=600.0, beta=0.35)  # alpha A = 0
    no_data = scaling_fit.LossLaw(E=1.8, A=400.0, alpha=0.4, B=600.0, beta=0.0)
    sizes = np.geomspace(1e3, 1e10, 50)
    assert np.all(np.diff(no_size(sizes, flops / (6 * sizes))) > 0)  # fewer parameters, lower loss
    assert np.all(np.diff(no_data(sizes, flops / (6 * sizes))) < 0)  # more parameters, lower loss
    assert no_size.optimum(flops) == (0.0, math.inf) and no_size.tokens_per_param(flops) == math.inf
    assert no_data.optimum(flops) == (math.inf, 0.0) and no_data.tokens_per_param(flops) == 0.0
    neither = scaling_fit.LossLaw(E=1.8, A=400.0, alpha=0.0, B=600.0, beta=0.0)
    assert math.isnan(neither.tokens_per_param(flops))
    steep = scaling_fit.LossLaw(E=1.8, A=1e200, alpha=0.01, B=1e-200, beta=0.01)  # G beyond a float
    assert steep.optimum(flops) == (math.inf, 0.0)


def test_an_interval_reaching_an_unbounded_refit_is_unbounded_on_that_side():
    values = np.random.default_rng(3).lognormal(size=20)
    assert scaling_fit.interval(values) == pytest.approx(tuple(np.percentile(values, [2.5, 97.5])))
    low, high = scaling_fit.interval([*values, math.inf])  # numpy's interpolation: nan at the top
    assert high == math.inf and low == pytest.approx(np.percentile([*values, 1e300], 2.5))
    assert scaling_fit.interval([math.inf] * 3) == (math.inf, math.inf)


def test_the_bootstrap_resamples_runs_and_its_intervals_are_percentiles():
    n, d, loss = ladder_data(noise=0.003)
    law = scaling_fit.fit_law(n, d, loss)
    fits = scaling_fit.bootstrap(n, d, loss, law, 12, np.random.default_rng(5))
    again = scaling_fit.bootstrap(n, d, loss, law, 12, np.random.default_rng(5))
    assert [f.to_dict() for f, _ in fits] == [f.to_dict() for f, _ in again]  # seeded
    picks = np.random.default_rng(5).integers(0, len(n), size=len(n))  # the first refit's draw
    first, residuals = fits[0]
    assert residuals == pytest.approx(np.log(loss[picks]) - np.log(first(n[picks], d[picks])))
    alphas = [f.alpha for f, _ in fits]
    assert scaling_fit.interval(alphas) == pytest.approx(tuple(np.percentile(alphas, [2.5, 97.5])))
    prediction = scaling.predict(law, fits, 4e5, 4e6, 2, np.random.default_rng(1))
    centre = [f(4e5, 4e6) for f, _ in fits]
    assert prediction["law_interval"] == pytest.approx(list(np.percentile(centre, [2.5, 97.5])))
    rng = np.random.default_rng(1)
    noisy = [c * math.exp(rng.choice(r, size=2).mean()) for c, (_, r) in zip(centre, fits, strict=True)]
    assert prediction["interval"] == pytest.approx(list(np.percentile(noisy, [2.5, 97.5])))


def test_a_ladder_needs_three_profiles_and_a_larger_held_out_budget():
    points = scaling.ladder_points(PROFILES, HELD_OUT)
    assert len(points) == 15 and [p.size for p in points if p.held_out] == ["w048", "w064"]
    with pytest.raises(UserError, match="at least 3 budgets"):
        scaling.ladder_points(PROFILES[:2], HELD_OUT)
    with pytest.raises(UserError, match="above the profiles' largest"):
        scaling.ladder_points(PROFILES, (4e12, ["w048"]))


def _record(size: str, flops: float, seed: int, rng: np.random.Generator) -> RunRecord:
    params, per_step = SIZES[size], 1024
    per_token = 6.9 * params
    steps = math.ceil(flops / (per_token * per_step))
    tokens = steps * per_step
    loss = law_value(params, tokens) * math.exp(rng.normal(0, 0.004))
    return RunRecord(config=f"experiment=scaling/{size}", seed=seed, budget=f"trainer.max_flops={flops:.4g}",
                     machine={"cpu": "cpu A", "cores": 2, "dtype": "bfloat16", "torch": "2.13"}, steps=steps,
                     params=params, tokens=tokens, flops=tokens * per_token, train_seconds=1.0,
                     tokens_per_s=1.0, val_loss=loss, bits_per_byte=loss / 2.5, command="", date="2026-01-01")


class FakeTraining:
    """Stands in for the training processes and the scoring: runs get losses from the law of this file; when
    the held-out points are trained, the ladder file must already hold their prediction."""

    def __init__(self, monkeypatch, out: Path):
        self.out, self.rng, self.trained, self.flops = out, np.random.default_rng(0), [], {}
        monkeypatch.setattr(scaling, "run_pool", self.run_pool)

    def run_pool(self, multiruns, train_args, threads, jobs, on_finished):
        for i, m in enumerate(multiruns):
            flops = float(m.overrides[1].split("=")[1])
            if flops == HELD_OUT[0]:
                assert json.loads((self.out / scaling.STATE).read_text())["prediction"] is not None
            self.trained.append((m.overrides[0].split("/")[1], flops, m.seeds))
            for seed in m.seeds:
                self.flops[m.run_dir(seed)] = flops
            on_finished(i)
        return []

    def score(self, run: Path) -> RunRecord:
        size, seed = run.name.split("_seed")
        return _record(size, self.flops[run], int(seed), self.rng)


def test_the_ladder_fits_predicts_then_trains_the_held_out_points(tmp_path: Path, monkeypatch):
    fake = FakeTraining(monkeypatch, tmp_path)
    points = scaling.ladder_points(PROFILES, HELD_OUT)
    ladder = scaling.run_ladder(points, [1337, 1338], tmp_path, fake.score, repeats=20)
    assert fake.trained[:2] == [("w016", 6e11, (1337, 1338)), ("w032", 6e11, (1337, 1338))]
    assert fake.trained[-2:] == [("w048", 1.2e13, (1337, 1338)), ("w064", 1.2e13, (1337, 1338))]
    prediction = ladder.state["prediction"]["w064"]
    planned = _record("w064", 1.2e13, 0, np.random.default_rng(0))
    assert (prediction["params"], prediction["tokens"]) == (planned.params, planned.tokens)
    report = scaling_report.build_report(ladder, {"params": 787_296, "tokens": 2_252_800})
    assert all(c["inside"] for c in report["check"])  # the runs follow the law the fit recovers
    assert [p["seeds"] for p in report["points"]] == [2] * 15
    again = scaling.run_ladder(points, [1337, 1338], tmp_path, fake.score, repeats=20)
    assert len(fake.trained) == 15 and again.state["prediction"] == ladder.state["prediction"]  # nothing new
    block = scaling_report.render_block(report, "scaling.png")
    assert "| 1.2e+13 (held out) | w064 | 439,000 |" in block and "inside the interval" in block
    scaling_report.write_tensorboard(report, scaling_report.scaling_figure(report), tmp_path / "tb")
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    measured = [(e.step, e.value) for e in events.Scalars(f"{scaling_report.TAGS['loss']}/6e+11")]
    profile = [p for p in report["points"] if p["flops"] == 6e11]
    assert measured == [(p["params"], pytest.approx(p["val_loss"], rel=1e-6)) for p in profile]
    assert events.Tags()["images"] == [scaling_report.TAGS["figure"]]


def test_a_refit_that_drops_the_size_term_leaves_the_optimum_unbounded_in_the_report(tmp_path: Path,
                                                                                      monkeypatch):
    fake = FakeTraining(monkeypatch, tmp_path)
    ladder = scaling.run_ladder(scaling.ladder_points(PROFILES, HELD_OUT), [1337, 1338], tmp_path, fake.score,
                                repeats=20)
    flat = scaling_fit.LossLaw(E=2.0, A=3.0, alpha=0.0, B=600.0, beta=0.35)  # a resample can fit this
    ladder.fits.append((flat, np.zeros(4)))
    report = scaling_report.build_report(ladder, {"params": 787_296, "tokens": 2_252_800})
    optimal = report["optimal"]
    assert all(o["interval"][1] == math.inf and math.isfinite(o["tokens_per_param"]) for o in optimal)
    assert json.loads(json.dumps(report))["optimal"][0]["interval"][1] == math.inf
    block = scaling_report.render_block(report, "scaling.png")
    assert "to inf) |" in block
    scaling_report.scaling_figure(report)  # the band's unbounded top is drawn, not a crash
    ladder.law = flat  # the fit itself without a size term: its optimum unbounded too, in words
    report = scaling_report.build_report(ladder, {"params": 787_296, "tokens": 2_252_800})
    assert report["optimal"][0]["tokens_per_param"] == math.inf and report["optimal"][0]["params"] == 0
    assert "| 0 | inf | inf (" in scaling_report.render_block(report, "scaling.png")


def test_without_training_runs_trained_by_hand_are_scored_the_held_out_ones_after_the_prediction(
        tmp_path: Path, monkeypatch):
    fake = FakeTraining(monkeypatch, tmp_path)
    points = scaling.ladder_points(PROFILES, HELD_OUT)
    for p in points:  # every run trained outside the ladder, none scored yet
        for seed in (1337, 1338):
            fake.flops[p.run_dir(tmp_path, seed)] = p.flops
    monkeypatch.setattr(scaling, "finished", lambda run: run in fake.flops)
    missing = points[0].run_dir(tmp_path, 1338)
    del fake.flops[missing]
    first = scaling.run_ladder(points, [1337, 1338], tmp_path, fake.score, train=False, repeats=20)
    assert first.state["prediction"] is None and len(first.state["runs"]) == 25  # no held-out row unpredicted
    fake.flops[missing] = points[0].flops
    second = scaling.run_ladder(points, [1337, 1338], tmp_path, fake.score, train=False, repeats=20)
    assert second.state["prediction"] is not None and len(second.state["runs"]) == 30
    assert fake.trained == []


def test_the_doc_block_is_what_the_script_renders_from_the_documented_ladder():
    report = json.loads((ROOT / "docs" / "scaling.json").read_text())
    text = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    block = text[text.index(scaling_report.BEGIN): text.index(scaling_report.END) + len(scaling_report.END)]
    assert block == scaling_report.render_block(report, "scaling.png"), "docs/scaling.md is stale"
    assert len({p["flops"] for p in report["points"] if not p["held_out"]}) >= 3
    assert all(p["seeds"] >= 2 for p in report["points"]) and report["check"]


def test_every_size_of_the_ladder_is_the_llama_style_block_at_one_width():
    sizes = sorted(p.stem for p in (CONFIG_DIR / "experiment" / "scaling").glob("w*.yaml"))
    default = to_object(compose_train(["model=demo"]), TrainConfig).model
    for name in sizes:
        cfg = to_object(compose_train([f"experiment=scaling/{name}", "trainer.max_flops=1e12"]), TrainConfig)
        assert cfg.run_name == name and cfg.trainer.max_steps is None
        assert cfg.model.n_embd == int(name[1:]) and cfg.model.head_dim == 16
        changed = {k for k, v in vars(cfg.model).items() if getattr(default, k) != v}
        assert changed <= {"n_embd", "n_head"}, name  # model=demo otherwise


@pytest.mark.slow
def test_a_real_ladder_is_trained_fitted_checked_and_logged(tmp_path: Path, corpus_dir: Path, capsys):
    """Two widths of the ladder's block on the byte tokenizer, three tiny budgets and a held-out one."""
    train_args = [o for o in fast_overrides(tmp_path, corpus_dir) if o.startswith("data")]
    train_args += ["tokenizer=byte", "model.block_size=32", "trainer.batch_size=2"]
    profiles = ",".join(f"{{flops:{f},sizes:[w016,w032]}}" for f in ("2e8", "4e8", "8e8"))
    args = [f"out={tmp_path / 'ladder'}", "bootstrap=5", "jobs=2", f"profiles=[{profiles}]",
            f"train_args=[{','.join(repr(o) for o in train_args)}]", "held_out={flops:1.6e9,sizes:[w016]}"]
    doc = tmp_path / "scaling.md"
    doc.write_text(f"before\n{scaling_report.BEGIN}\n{scaling_report.END}\nafter\n")
    run = run_script("scaling", [*args, "docs=true", f"doc={doc}"], capsys)
    assert run.code == 0, run.err
    report = json.loads((tmp_path / "scaling.json").read_text())
    for row in report["runs"]:  # each run stopped at the first step at or past its budget
        budget = float(row["budget"].split("=")[1])
        assert budget <= row["flops"] < budget + row["flops"] / row["steps"]
    assert [(p["size"], p["flops"], p["seeds"]) for p in report["points"]][-1] == ("w016", 1.6e9, 2)
    assert report["check"][0]["measured"] == report["points"][-1]["val_loss"]
    assert any((tmp_path / "ladder" / "tb").glob("events.out.tfevents.*"))
    assert doc.read_text() == f"before\n{scaling_report.render_block(report, 'scaling.png')}\nafter\n"
