"""A diverging run stops before it writes anything diverged, and its one line names a checkpoint that is good.

The rule (training/step.py): a loss has diverged when it is not finite or above max(ratio x best, ln V). It is
checked against an explicit computation here; the probe before each checkpoint is a training-mode loss, so
weights blown up by the last update are caught while a model whose eval mode differs by design (the ablation
lab's no_causal_mask row, through the real command) trains to its end. Through the real command line, a
healthy run resumed with a huge lr stops with `last` still the healthy checkpoint (loadable, finite,
evaluating to a finite loss), and a run that keeps training through an explosion
(trainer.divergence_ratio=null) logs readable perplexities.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run_script
from conftest import fast_overrides
from safetensors.torch import load_file

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model
from minigpt.cluster.dist_env import DistEnv
from minigpt.device.config import DeviceConfig
from minigpt.device.runtime import resolve_runtime
from minigpt.inspect.perplexity import format_perplexity
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
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


def _tiny_model(**keys) -> torch.nn.Module:
    config = ModelConfig(n_layer=1, n_head=2, n_kv_head=None, n_embd=16, block_size=8, vocab_size=64, **keys)
    return build_model(config)


def _cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The mean loss of (x, y), from the model's full logits: an independent route to the probe's number."""
    with torch.no_grad():
        logits, _ = model(x)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()


def test_weights_blown_up_before_a_checkpoint_are_caught_by_their_training_loss():
    """The last update before a checkpoint multiplied the head by 1000 (finite, but an explosion): the probe
    stops the run. It scores the weights as a step does, in training mode: this model is trained without the
    causal mask, so its two modes give different losses; with the limit set between them it still stops."""
    model, runtime = _tiny_model(causal=False), resolve_runtime(DeviceConfig(type="cpu", dtype="float32"))
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))

    def guard_with_best(best: float) -> DivergenceGuard:
        guard = DivergenceGuard("stop", 10.0, vocab_size=64, device=torch.device("cpu"))
        guard.should_skip(torch.tensor(best), 1, DistEnv())  # the best training loss so far
        return guard

    guard = guard_with_best(2.0)
    guard.check_weights(model, (x, y), runtime, 1, DistEnv(), lambda: "")  # healthy: about ln 64
    with torch.no_grad():
        model.lm_head.weight.mul_(1000.0)
    with pytest.raises(DivergenceError, match=r"the training loss exploded at step 2 \("):
        guard.check_weights(model, (x, y), runtime, 1, DistEnv(), lambda: "nothing on disk")
    train_loss, eval_loss = _cross_entropy(model.train(), x, y), _cross_entropy(model.eval(), x, y)
    assert train_loss > 1.001 * eval_loss  # apart by far more than two routes to one loss ever are
    midway = guard_with_best((train_loss + eval_loss) / 2 / 10)  # 10 x best: between the two
    model.eval()  # as after a validation
    with pytest.raises(DivergenceError, match="exploded at step 2"):
        midway.check_weights(model, (x, y), runtime, 1, DistEnv(), lambda: "")
    assert not model.training  # the mode it was called in is the mode it leaves


def test_the_probe_leaves_the_runs_random_streams_untouched():
    """Scoring in training mode draws dropout masks; they come from copies of the streams, so the next step
    draws what it would have drawn without the probe."""
    model = _tiny_model(dropout=0.5).train()
    runtime = resolve_runtime(DeviceConfig(type="cpu", dtype="float32"))
    batch = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    guard = DivergenceGuard("stop", 10.0, vocab_size=64, device=torch.device("cpu"))
    before = torch.get_rng_state()
    guard.check_weights(model, batch, runtime, 1, DistEnv(), lambda: "")
    assert torch.equal(torch.get_rng_state(), before) and model.training


def test_a_huge_perplexity_is_printed_short():
    assert format_perplexity(262.14423) == "262.1"
    assert format_perplexity(math.exp(700)) == "1.01e+304"


@pytest.mark.slow
def test_a_resumed_run_that_diverges_leaves_the_healthy_checkpoint_and_names_it(tmp_path, corpus_dir, capsys):
    run = tmp_path / "run"
    common = [*fast_overrides(tmp_path, corpus_dir), "logging.sample_tokens=0", f"hydra.run.dir={run}"]
    assert run_script("train", [*common, "trainer.max_steps=8"], capsys).code == 0
    healthy = (run / "checkpoints" / "last" / ckpt.WEIGHTS).read_bytes()
    # every group's lr far too high (the AdamW groups' and Muon's), and a tight ratio: the soft-capped logits
    # bound the loss below 10x the best, so the first steps after the resume diverge by passing twice the best
    result = run_script("train", [*common, "trainer.resume=auto", "optim.lr=1e3", "optim.muon_lr=1e3",
                                  "trainer.divergence_ratio=2", "trainer.max_steps=40",
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
    # the Llama-style block: the default soft-caps its logits, so its loss cannot reach the thousands
    args = [*fast_overrides(tmp_path, corpus_dir), "model=demo", "optim=muon", "optim.lr=30",
            "optim.warmup_steps=0", "trainer.max_steps=8", "trainer.divergence_ratio=null",
            "logging.sample_tokens=0", f"hydra.run.dir={run}"]
    result = run_script("train", args, capsys)
    assert result.code == 0, result.err
    losses = [float(v) for v in re.findall(r"val loss ([\d.]+) \(ppl", result.out)]
    assert max(losses) > 100  # it did explode
    assert max(len(line) for line in result.out.splitlines()) < 200
    evaluated = run_script("evaluate", [f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'eval'}"], capsys)
    assert evaluated.code == 0 and max(len(line) for line in evaluated.out.splitlines()) < 200


def _random_words(folder: Path) -> Path:
    """Text that cannot be predicted past a word's first letters, but can be copied: the no-causal-mask
    model learns to copy it within a hundred steps (its training loss near 0, its causal loss above ln V)."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
             for _ in range(300)]
    folder.mkdir()
    for i in range(6):
        (folder / f"part{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(800)))
    return folder


@pytest.mark.slow
def test_the_no_causal_mask_row_trains_to_its_checkpoint(tmp_path, capsys):
    """`python scripts/train.py experiment=ablation/no_causal_mask` on a corpus it learns to copy within 100
    steps: its eval-mode loss ends far above ten times its training loss and above ln V, which no longer reads
    as a diverged run (a probe in eval mode against the best training loss stopped it at its checkpoint)."""
    run, corpus = tmp_path / "run", _random_words(tmp_path / "corpus")
    result = run_script("train", [
        "experiment=ablation/no_causal_mask", "tokenizer=char", "data=text", f"data.paths=[{corpus}]",
        f"data.cache_dir={tmp_path / 'data'}", "trainer.max_flops=null", "trainer.max_steps=100",
        "trainer.ckpt_every=100", f"hydra.run.dir={run}"], capsys)
    assert result.code == 0 and not result.err_lines, result.err
    assert ckpt.read_meta(run / "checkpoints" / "last")["step"] == 100
    # What the old probe saw, computed here: the two modes of the final weights on the same text.
    model, tokenizer, _ = load_model(run / "checkpoints" / "last", device="cpu")
    ids = torch.tensor(tokenizer.encode((corpus / "part0.txt").read_text()[:8 * 65])).view(8, 65)
    x, y = ids[:, :-1], ids[:, 1:]  # (8, 64) each
    train_loss, eval_loss = _cross_entropy(model.train(), x, y), _cross_entropy(model.eval(), x, y)
    assert eval_loss > max(10 * train_loss, math.log(tokenizer.vocab_size)), (train_loss, eval_loss)
