"""The checkpoint format: round trip, atomic replacement, RNG capture, clear errors for bad checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from model_helpers import tiny_config

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import find_latest_checkpoint, load_model, resolve_checkpoint
from minigpt.data.tokenizers import ByteTokenizer
from minigpt.errors import UserError
from minigpt.model.factory import build_model
from minigpt.training import seeding
from minigpt.training.config import OptimConfig
from minigpt.training.optim import build_optimizer

CFG = tiny_config(n_layer=2, n_head=2, n_embd=32, block_size=16)


def _write(path: Path, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = build_model(CFG, vocab_size=257)
    opt = build_optimizer(model, OptimConfig(lr=1e-2, warmup_steps=2))
    x = torch.randint(0, 257, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    meta = {"step": 1, "model_config": {**CFG.__dict__, "vocab_size": 257}}
    state = {"step": 1, "train_seconds": 0.5, "optimizer": opt.state_dict(), "rng": seeding.rng_state()}
    ckpt.save_checkpoint(path, model, state, meta, ByteTokenizer())
    return model, opt


def test_round_trip(tmp_path: Path):
    model, opt = _write(tmp_path / "run" / "checkpoints" / "last")
    loaded, tok, meta = load_model(tmp_path / "run", "cpu")  # a run folder works too
    assert meta["format_version"] == ckpt.FORMAT_VERSION and meta["step"] == 1
    assert not loaded.training and tok.decode(tok.encode("héllo")) == "héllo"
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # still tied
    state = ckpt.load_state(tmp_path / "run" / "checkpoints" / "last")  # weights_only=True
    restored = build_optimizer(loaded, OptimConfig(lr=1e-2, warmup_steps=2))
    restored.load_state_dict(state["optimizer"])
    for a, b in zip(opt.state.values(), restored.state.values(), strict=True):  # Muon's and AdamW's moments
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_overwrite_is_atomic_and_leaves_no_temporaries(tmp_path: Path):
    path = tmp_path / "checkpoints" / "last"
    _write(path, seed=0)
    first = (path / ckpt.WEIGHTS).read_bytes()
    _write(path, seed=1)
    assert (path / ckpt.WEIGHTS).read_bytes() != first
    assert sorted(p.name for p in path.parent.iterdir()) == ["last"]


def test_rng_state_round_trip():
    state = seeding.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    seeding.set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])


@pytest.mark.parametrize("damage", ["missing_path", "no_meta", "bad_json", "future_version",
                                    "truncated_weights", "no_weights", "garbage_state", "other_model_config"])
def test_bad_checkpoints_raise_user_error(tmp_path: Path, damage: str):
    path = tmp_path / "ckpt"
    _write(path)
    if damage == "missing_path":
        path = tmp_path / "nowhere"
    elif damage == "no_meta":
        (path / ckpt.META).unlink()
    elif damage == "bad_json":
        (path / ckpt.META).write_text("{not json")
    elif damage == "future_version":
        meta = json.loads((path / ckpt.META).read_text())
        (path / ckpt.META).write_text(json.dumps({**meta, "format_version": 99}))
    elif damage == "truncated_weights":
        data = (path / ckpt.WEIGHTS).read_bytes()
        (path / ckpt.WEIGHTS).write_bytes(data[: len(data) // 2])
    elif damage == "no_weights":
        (path / ckpt.WEIGHTS).unlink()
    elif damage == "garbage_state":
        (path / ckpt.STATE).write_bytes(b"\x00garbage" * 10)
    elif damage == "other_model_config":  # weights that are not the recorded model's
        meta = json.loads((path / ckpt.META).read_text())
        meta["model_config"]["n_embd"] = 48
        (path / ckpt.META).write_text(json.dumps(meta))
    with pytest.raises(UserError) as info:
        load_model(path, "cpu")
        ckpt.load_state(resolve_checkpoint(path))
    assert "\n" not in str(info.value)
    if damage == "future_version":
        assert "99" in str(info.value) and "1" in str(info.value)
    if damage == "other_model_config":
        assert ckpt.WEIGHTS in str(info.value) and "size mismatch" in str(info.value)


def test_find_latest_checkpoint_is_the_most_recently_written(tmp_path: Path):
    with pytest.raises(UserError):
        find_latest_checkpoint(tmp_path)
    later_name = tmp_path / "train" / "2026-01-02" / "09-00-00" / "checkpoints" / "last"
    earlier_name = tmp_path / "train" / "2026-01-01" / "10-00-00" / "checkpoints" / "last"
    _write(later_name)
    _write(earlier_name)
    # Written last wins, whatever the folder names say (a run resumed today in an old folder is the latest);
    # explicit times, so the file system's timestamp resolution cannot make the two equal.
    os.utime(later_name / ckpt.META, (1_000_000, 1_000_000))
    os.utime(earlier_name / ckpt.META, (2_000_000, 2_000_000))
    assert find_latest_checkpoint(tmp_path) == earlier_name
    os.utime(later_name / ckpt.META, (3_000_000, 3_000_000))
    assert find_latest_checkpoint(tmp_path) == later_name


def test_a_damaged_tokenizer_folder_is_refused(tmp_path: Path):
    path = tmp_path / "ckpt"
    _write(path)
    recorded = json.loads((path / ckpt.META).read_text())[ckpt.TOKENIZER_HASHES]
    assert recorded == {"tokenizer.json": hashlib.sha256((path / "tokenizer" / "tokenizer.json").read_bytes())
                        .hexdigest()}  # an independent hash of what is on disk
    (path / "tokenizer" / "tokenizer.json").write_text('{"kind": "char", "chars": "ab"}')
    with pytest.raises(UserError, match=r"damaged tokenizer/ folder \(tokenizer\.json changed or missing"):
        load_model(path, "cpu")
    (path / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(UserError, match="tokenizer.json changed or missing"):
        load_model(path, "cpu")


def test_a_checkpoint_from_before_tokenizer_hashes_still_loads(tmp_path: Path):
    path = tmp_path / "ckpt"
    _write(path)
    meta = json.loads((path / ckpt.META).read_text())
    del meta[ckpt.TOKENIZER_HASHES]
    (path / ckpt.META).write_text(json.dumps(meta))
    _, tokenizer, _ = load_model(path, "cpu")
    assert tokenizer.decode(tokenizer.encode("ok")) == "ok"
