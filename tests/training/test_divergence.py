"""A diverging run stops before it writes anything diverged, and its one line names a checkpoint that is good.

The rule (training/step.py): a loss has diverged when it is not finite or above max(ratio x best, ln V). It is
checked against an explicit computation here; through the real command line, a healthy run resumed with a
huge lr stops with `last` still the healthy checkpoint (loadable, finite, evaluating to a finite loss), and a
run that keeps training through an explosion (trainer.divergence_ratio=null) logs readable perplexities.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from cli_helpers import run_script
from conftest import fast_overrides
from safetensors.torch import load_file

from minigpt.checkpoint import format as ckpt
from minigpt.cluster.dist_env import DistEnv
from minigpt.inspect.perplexity import format_perplexity
from minigpt.training.step import DivergenceError, DivergenceGuard


@pytest.mark.parametrize("loss, best, want", [
    (3.0, 2.0, False),  # worse, but nowhere near 10x
    (25.0, 2.0, True),  # over 10x the best, and over ln 257 = 5.55
    (5.0, 0.1, False),  # 50x a near-zero best, but better than a uniform guess: a copying model's spike
    (6.0, 0.1, True),  # ... and once worse than a uniform guess
    (math.nan, 2.0, True),
    (math.inf, 2.0, True),
    (60.0, math.inf, False),  # no best yet: only a non-finite loss counts
])
def test_the_rule_is_max_of_ratio_times_best_and_ln_v(loss, best, want):
    guard = DivergenceGuard("stop", 10.0, vocab_size=257, device=torch.device("cpu"))
    explicit = not math.isfinite(loss) or loss > max(10.0 * best, math.log(257))
    assert explicit == want
    assert bool(guard.diverged(torch.tensor(loss), best)) == want


def test_the_first_diverged_step_is_named_with_its_loss_and_the_best_before_it():
    guard = DivergenceGuard("stop", 10.0, vocab_size=257, device=torch.device("cpu"))
    for step, loss in enumerate([5.6, 3.1, 2.4, 2.9, 31.0, math.nan], start=1):
        guard.should_skip(torch.tensor(loss), step, DistEnv())
    with pytest.raises(DivergenceError, match=r"exploded at step 5 \(31: over 10x the run's best, 2.4,"):
        guard.check(DistEnv(), lambda: "nothing on disk")


def test_skip_skips_a_nan_step_but_an_explosion_still_stops():
    guard = DivergenceGuard("skip", 10.0, vocab_size=257, device=torch.device("cpu"))
    assert guard.should_skip(torch.tensor(math.nan), 1, DistEnv()) and guard.skipped == 1
    guard.check(DistEnv(), lambda: "")  # a skipped NaN is not fatal
    assert not guard.should_skip(torch.tensor(2.0), 2, DistEnv())
    assert not guard.should_skip(torch.tensor(80.0), 3, DistEnv())  # updated, then stopped at the check
    with pytest.raises(DivergenceError, match="exploded at step 3"):
        guard.check(DistEnv(), lambda: "")


def test_a_huge_perplexity_is_printed_short():
    assert format_perplexity(262.14423) == "262.1"
    assert format_perplexity(math.exp(700)) == "1.01e+304"


@pytest.mark.slow
def test_a_resumed_run_that_diverges_leaves_the_healthy_checkpoint_and_names_it(tmp_path, corpus_dir, capsys):
    run = tmp_path / "run"
    common = [*fast_overrides(tmp_path, corpus_dir), "logging.sample_tokens=0", f"hydra.run.dir={run}"]
    assert run_script("train", [*common, "trainer.max_steps=8"], capsys).code == 0
    healthy = (run / "checkpoints" / "last" / ckpt.WEIGHTS).read_bytes()
    result = run_script("train", [*common, "trainer.resume=auto", "optim.lr=1e3", "trainer.max_steps=40",
                                  "trainer.ckpt_every=2", "logging.log_every=4"], capsys)
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert re.search(r"the training loss (exploded|became non-finite \(NaN or inf\)) at step \d+", line), line
    assert f"the last good checkpoint is {run}/checkpoints/last (step 8)" in line
    assert "trainer.resume=auto optim.lr=100" in line
    assert "Traceback" not in result.out + result.err
    assert "resuming with a changed course: optim.lr=1000.0" in result.out  # said before the first step
    # What the line names is true: `last` is the healthy step-8 checkpoint, byte for byte, finite, and it
    # evaluates to a finite loss.
    assert (run / "checkpoints" / "last" / ckpt.WEIGHTS).read_bytes() == healthy
    assert ckpt.read_meta(run / "checkpoints" / "last")["step"] == 8
    last = load_file(str(run / "checkpoints" / "last" / ckpt.WEIGHTS))
    assert all(torch.isfinite(w).all() for w in last.values())
    evaluated = run_script("evaluate", [f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'eval'}"], capsys)
    assert evaluated.code == 0 and "loss nan" not in evaluated.out, evaluated.out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "last"]  # no temporary


@pytest.mark.slow
def test_a_run_told_to_train_through_an_explosion_logs_readable_numbers(tmp_path, corpus_dir, capsys):
    """trainer.divergence_ratio=null: the guard lets finite losses through; the perplexity of a loss in the
    thousands is a short number, on the console and from evaluate.py."""
    run = tmp_path / "run"
    args = [*fast_overrides(tmp_path, corpus_dir), "optim.lr=30", "optim.warmup_steps=0",
            "trainer.max_steps=8", "trainer.divergence_ratio=null", "logging.sample_tokens=0",
            f"hydra.run.dir={run}"]
    result = run_script("train", args, capsys)
    assert result.code == 0, result.err
    losses = [float(v) for v in re.findall(r"val loss ([\d.]+) \(ppl", result.out)]
    assert max(losses) > 100  # it did explode
    assert max(len(line) for line in result.out.splitlines()) < 200
    evaluated = run_script("evaluate", [f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'eval'}"], capsys)
    assert evaluated.code == 0 and max(len(line) for line in evaluated.out.splitlines()) < 200
