"""The training loop in-process: run folder, TensorBoard tags, exact resume, overwrite protection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model
from minigpt.errors import UserError
from minigpt.runs.train import train
from minigpt.training.reporting import SCALAR_TAGS


@pytest.mark.slow
def test_short_run_learns_and_writes_its_run_folder(make_train_cfg, tmp_path: Path):
    out = tmp_path / "run"
    result = train(make_train_cfg("trainer.max_steps=12", "optim.lr=1e-2"), out)
    assert result.step == 12 and result.tokens_seen == 12 * 4 * 32
    assert result.val_loss < result.first_val_loss
    for name in ("last", "best"):
        assert (out / "checkpoints" / name / ckpt.WEIGHTS).is_file()
    model, tok, meta = load_model(out, "cpu")
    assert meta["step"] == 12 and meta["config"]["trainer"]["max_steps"] == 12
    assert tok.name == "byte" and model.config.vocab_size == tok.vocab_size

    events = EventAccumulator(str(out / "tb"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert set(SCALAR_TAGS) <= scalars, set(SCALAR_TAGS) - scalars
    assert {"config/text_summary", "sample/text_summary"} <= set(events.Tags()["tensors"])
    val = [e.value for e in events.Scalars("val/loss")]
    assert [e.step for e in events.Scalars("val/loss")] == [0, 4, 8, 12]
    assert val[-1] == pytest.approx(result.val_loss) and val[0] == pytest.approx(result.first_val_loss)
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8, 10, 12]
    # add_hparams wrote into the run's own folder, not a timestamped sub-run.
    assert [p.name for p in (out / "tb").iterdir() if p.is_dir()] == []


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "last" / ckpt.WEIGHTS)


@pytest.mark.slow
def test_resume_continues_exactly(make_train_cfg, tmp_path: Path):
    # Dropout makes the torch RNG matter; decay_steps pins the schedule's horizon for both halves.
    common = ("model.dropout=0.1", "optim.decay_steps=20", "trainer.eval_every=5", "trainer.ckpt_every=5",
              "logging.sample_tokens=4")
    straight = tmp_path / "straight"
    train(make_train_cfg(*common, "trainer.max_steps=20"), straight)

    split = tmp_path / "split"
    train(make_train_cfg(*common, "trainer.max_steps=10"), split)
    resumed = train(make_train_cfg(*common, "trainer.max_steps=20", "trainer.resume=auto"), split)
    assert resumed.step == 20

    a, b = _weights(straight), _weights(split)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    sa = ckpt.load_state(straight / "checkpoints" / "last")
    sb = ckpt.load_state(split / "checkpoints" / "last")
    assert sa["loader"]["batches_drawn"] == sb["loader"]["batches_drawn"] == 20
    assert torch.equal(sa["rng"][0]["torch"], sb["rng"][0]["torch"])  # one state per rank
    assert sa["best_val_loss"] == sb["best_val_loss"]


@pytest.mark.slow
def test_existing_checkpoint_is_never_overwritten(make_train_cfg, tmp_path: Path):
    out = tmp_path / "run"
    train(make_train_cfg("trainer.max_steps=2", "logging.sample_tokens=0"), out)
    before = (out / "checkpoints" / "last" / ckpt.WEIGHTS).read_bytes()
    with pytest.raises(UserError, match="trainer.resume=auto"):
        train(make_train_cfg("trainer.max_steps=2", "logging.sample_tokens=0"), out)
    assert (out / "checkpoints" / "last" / ckpt.WEIGHTS).read_bytes() == before


def test_bad_resume_path_fails_before_any_work(make_train_cfg, tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        train(make_train_cfg(f"trainer.resume={tmp_path / 'nope'}"), tmp_path / "run")
    assert not (tmp_path / "run").exists()
