"""Batch-size and sequence-length warmup: each step's shape against the formulas written out, the cut
windows against the token stream, the budget's end against a step-by-step count, and exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_helpers import shrunk_model
from safetensors.torch import load_file

from minigpt.checkpoint import format as ckpt
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.runs.train import train
from minigpt.training.batch_schedule import BatchSchedule
from minigpt.training.budget import Budget
from minigpt.training.config import TrainConfig, TrainerConfig


def _schedule(block_size: int = 128, accum: int = 1, world: int = 1, **trainer) -> BatchSchedule:
    return BatchSchedule(TrainerConfig(**trainer), block_size, accum, world)


def test_both_warmups_are_off_by_default():
    tc = TrainerConfig()
    assert (tc.batch_warmup_steps, tc.seq_len_warmup_steps) == (0, 0)
    s = _schedule(accum=2, world=3)
    assert [s.sequences(i) for i in (0, 1, 10**6)] == [tc.batch_size] * 3
    assert [s.seq_len(i) for i in (0, 1, 10**6)] == [128] * 3
    assert s.tokens(0) == tc.batch_size * 128 * 2 * 3 and s.warmup_tokens() == () and s.describe() is None


def test_the_batch_grows_linearly_from_its_start_to_the_batch_size():
    # b(s) = 2 + floor((8 - 2) * s / 6) for s < 6, then 8
    s = _schedule(batch_size=8, batch_warmup_steps=6, batch_warmup_start=2)
    assert [s.sequences(i) for i in range(9)] == [2, 3, 4, 5, 6, 7, 8, 8, 8]
    # b(s) = 1 + floor(3 * s / 10): the ramp's integer steps
    s = _schedule(batch_size=4, batch_warmup_steps=10, batch_warmup_start=1)
    assert [s.sequences(i) for i in range(11)] == [1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4]
    assert s.warmup_tokens() == tuple(n * 128 for n in [1, 1, 1, 1, 2, 2, 2, 3, 3, 3])


def test_the_context_doubles_at_evenly_spaced_steps():
    # t(s) = 16 · 2^floor(3 s / 6) for s < 6 (log2(128 / 16) = 3), then 128
    s = _schedule(seq_len_warmup_steps=6, seq_len_warmup_start=16)
    assert [s.seq_len(i) for i in range(8)] == [16, 16, 32, 32, 64, 64, 128, 128]
    s = _schedule(block_size=64, seq_len_warmup_steps=100, seq_len_warmup_start=32)
    assert [s.seq_len(i) for i in (0, 50, 99, 100)] == [32, 32, 32, 64]  # one doubling: at the end
    assert s.tokens(0) == s.tokens(100)  # the same tokens per step, in shorter windows


def test_cut_windows_are_consecutive_pieces_of_the_stream_with_their_next_tokens():
    stream = torch.arange(1000)
    starts = [3, 500, 77]
    windows = torch.stack([stream[s:s + 17] for s in starts])  # (3, T + 1), T = 16
    x, y = windows[:, :-1], windows[:, 1:]
    s = _schedule(block_size=16, seq_len_warmup_steps=4, seq_len_warmup_start=4)
    cx, cy = s.cut(x, y, 0)  # t = 4
    want = [stream[a + 4 * j: a + 4 * j + 4] for a in starts for j in range(4)]
    assert cx.shape == cy.shape == (12, 4)
    assert torch.equal(cx, torch.stack(want)) and torch.equal(cy, torch.stack(want) + 1)
    assert s.cut(x, y, 4)[0] is x  # warmed up: the windows as they were


def test_the_loss_of_cut_windows_is_the_mean_over_the_short_windows_scored_alone():
    model = shrunk_model("demo")  # rotary positions: each piece starts again at position 0
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (2, 16), generator=g)
    y = torch.randint(0, model.config.vocab_size, (2, 16), generator=g)
    s = _schedule(block_size=16, seq_len_warmup_steps=2, seq_len_warmup_start=8)
    cx, cy = s.cut(x, y, 0)
    _, loss = model(cx, cy)
    alone = [model(x[b:b + 1, i:i + 8], y[b:b + 1, i:i + 8])[1] for b in range(2) for i in (0, 8)]
    torch.testing.assert_close(loss, torch.stack(alone).mean())


@pytest.mark.parametrize("start_step", [0, 3, 9, 20])
def test_the_budget_ends_a_token_budget_where_counting_the_steps_does(start_step):
    s = _schedule(batch_size=8, batch_warmup_steps=12, batch_warmup_start=1)
    budget = Budget(max_tokens=40_000, tokens_per_step=s.tokens(100), warmup_tokens=s.warmup_tokens())
    tokens = sum(s.tokens(i) for i in range(start_step))
    step, seen = start_step, tokens
    while not budget.done(step, 0.0, seen):  # the trainer's loop, step by step
        seen += s.tokens(step)
        step += 1
    assert budget.last_step(start_step, tokens) == step


def test_a_batch_warmup_log_line_names_both_warmups():
    s = _schedule(batch_warmup_steps=5, batch_warmup_start=2, seq_len_warmup_steps=7, seq_len_warmup_start=32)
    assert s.describe() == ("batch-size warmup from 2 to 8 sequences over 5 steps; sequence-length warmup "
                            "from 32 to 128 tokens over 7 steps")


@pytest.mark.parametrize("trainer, message", [
    ({"batch_warmup_steps": -1}, "trainer.batch_warmup_steps=-1 must be >= 0"),
    ({"seq_len_warmup_steps": -2}, "trainer.seq_len_warmup_steps=-2 must be >= 0"),
    ({"batch_warmup_start": 9}, "trainer.batch_warmup_start=9 must be between 1 and trainer.batch_size=8"),
    ({"batch_warmup_start": 0}, "trainer.batch_warmup_start=0 must be between 1"),
    ({"seq_len_warmup_start": 0}, "trainer.seq_len_warmup_start=0 must be at least 1"),
])
def test_bad_warmups_are_one_line_errors_naming_the_key(trainer, message):
    with pytest.raises(UserError) as err:
        TrainerConfig(**trainer)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("start", [48, 256, 3])
def test_a_context_warmup_must_divide_the_block_by_a_power_of_two(start):
    with pytest.raises(UserError, match=rf"seq_len_warmup_start={start} must be model.block_size=128 divided "
                                        r"by a power of two, .*\(try 64, 32, 16, 8\)"):
        TrainConfig(model=ModelConfig(block_size=128),
                    trainer=TrainerConfig(seq_len_warmup_steps=10, seq_len_warmup_start=start))
    TrainConfig(trainer=TrainerConfig(seq_len_warmup_start=start))  # off: not checked


@pytest.mark.slow
def test_a_run_with_both_warmups_resumes_bit_for_bit(make_train_cfg, tmp_path: Path):
    common = ("trainer.batch_warmup_steps=8", "trainer.batch_warmup_start=1",
              "trainer.seq_len_warmup_steps=8", "trainer.seq_len_warmup_start=8", "optim.decay_steps=12",
              "trainer.eval_every=5",
              "trainer.ckpt_every=5", "logging.sample_tokens=0", "model.dropout=0.1")
    straight, split = tmp_path / "straight", tmp_path / "split"
    done = train(make_train_cfg(*common, "trainer.max_steps=12"), straight)
    train(make_train_cfg(*common, "trainer.max_steps=5"), split)  # stops inside both warmups
    resumed = train(make_train_cfg(*common, "trainer.max_steps=12", "trainer.resume=auto"), split)
    # b(s) = 1 + floor(3 s / 8) sequences of 32 tokens for s < 8, then 4
    want = sum(1 + 3 * s // 8 for s in range(8)) * 32 + 4 * 4 * 32
    assert done.tokens_seen == resumed.tokens_seen == want
    a = load_file(straight / "checkpoints" / "last" / ckpt.WEIGHTS)
    b = load_file(split / "checkpoints" / "last" / ckpt.WEIGHTS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert done.val_loss == resumed.val_loss
    state = ckpt.load_state(split / "checkpoints" / "last")
    assert state["loader"]["batches_drawn"] == 12

