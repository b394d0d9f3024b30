"""Resume compares the new config with the checkpoint's (runs/same_run.py): another run (model, tokenizer,
data) is refused naming every differing key -- through the CLI in project/test_errors.py --, a new course
(batch, schedule horizon, lr) is allowed with one warning line per key saying what it changes, its lr numbers
checked against the schedule's formula written out here."""

from __future__ import annotations

import dataclasses
import re

import pytest
from cli_helpers import run_script
from conftest import fast_overrides

from minigpt.data.prepare import NOT_SHAPING
from minigpt.errors import UserError
from minigpt.runs.same_run import compare, flat, kind_of
from minigpt.training.config import TrainConfig


def test_every_key_has_a_kind_and_the_identity_keys_are_model_tokenizer_and_data():
    keys = flat(dataclasses.asdict(TrainConfig()))
    identity = {k for k in keys if kind_of(k) == "identity"}
    want = {k for k in keys if k.startswith(("model.", "tokenizer.")) or
            (k.startswith("data.") and k.split(".")[1] not in NOT_SHAPING)}
    want -= {"model.dropout", "model.attn_dropout", "model.attention", "model.online_block_size"}
    assert identity == want
    course = {k for k in keys if kind_of(k) == "course"}
    assert course >= {"optim.lr", "trainer.max_steps", "trainer.batch_size", "model.dropout",
                      "trainer.eval_tokens"}
    assert kind_of("device.dtype") == kind_of("trainer.ckpt_every") == kind_of("data.cache_dir") == "neither"


def test_a_refusal_names_every_differing_key_and_a_course_change_its_effect():
    saved = dataclasses.asdict(TrainConfig())
    other = TrainConfig()
    other.model.n_layer, other.data.val_ratio = 7, 0.2
    with pytest.raises(UserError) as refused:
        compare(saved, other, "ckpt", 10, 0.0, (8192, 8192))
    line = str(refused.value)
    assert "model.n_layer=4 there, 7 here" in line and "data.val_ratio=0.05 there, 0.2 here" in line
    assert "different model config and data set" in line
    course = TrainConfig()
    course.trainer.batch_size, course.device.compile = 16, True
    lines = compare(saved, course, "ckpt", 10, 0.0, (8192, 16384))
    assert lines == ["trainer.batch_size=16 (the checkpoint's: 8): a step now trains on 16,384 tokens "
                     "instead of 8,192; the data stream goes on from where it was"]  # device.compile: silent


def _wsd_lr(step: int, max_steps: int, lr=6e-3, warmup=2, floor=0.1, cooldown=0.2) -> float:
    """The wsd schedule of training/optim.py, written out: warmup, the peak, then a line down to the floor."""
    p = min(step / max_steps, 1.0)
    decay = 1.0 if p <= 1 - cooldown else (1 - p) / cooldown
    return lr * min(1.0, (step + 1) / warmup) * (floor + (1 - floor) * decay)


@pytest.mark.slow
def test_a_changed_course_resumes_with_one_warning_line_per_key(tmp_path, corpus_dir, capsys):
    run = tmp_path / "run"
    # optim=muon: one lr for every group, the one _wsd_lr computes
    common = [*fast_overrides(tmp_path, corpus_dir), "model=demo", "optim=muon", "logging.sample_tokens=0",
              f"hydra.run.dir={run}"]
    assert run_script("train", [*common, "trainer.max_steps=4"], capsys).code == 0
    changes = ["trainer.max_steps=8", "trainer.batch_size=8", "model.dropout=0.1", "model.attention=math"]
    result = run_script("train", [*common, *changes, "trainer.resume=auto", "logging.log_every=100"], capsys)
    assert result.code == 0, result.err
    warned = [line for line in result.out.splitlines() if line.startswith("resuming with a changed course")]
    old, new = _wsd_lr(4, 4), _wsd_lr(4, 8)  # step 5's lr (index 4), with the old and the new horizon
    assert warned == [  # model.attention: the same numbers computed another way, so not a word
        "resuming with a changed course: model.dropout=0.1 (the checkpoint's: 0.0): training goes on with "
        "another dropout from step 4",
        f"resuming with a changed course: trainer.max_steps=8 (the checkpoint's: 4): the schedule's horizon "
        f"moved, so the lr of step 5 jumps from {old:.2e} to {new:.2e}",
        "resuming with a changed course: trainer.batch_size=8 (the checkpoint's: 4): a step now trains on "
        "256 tokens instead of 128; the data stream goes on from where it was",
    ]
    assert (f"{old:.2e}", f"{new:.2e}") == ("6.00e-04", "6.00e-03")  # from the floor back to the peak
    assert re.search(r"resumed from .* at step 4", result.out)
