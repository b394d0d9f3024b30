"""A checkpoint is data, never code: a state.pt crafted to run code when unpickled is refused, and never runs.

The payload is live -- the first test shows that plain `pickle.loads` does run it -- so the refusals below are
real protection, not a file that would have been harmless anyway.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model
from minigpt.errors import UserError
from minigpt.runs.train import train


class Payload:
    """Unpickling this calls `exec`, which creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",)


def _plant(ckpt_dir: Path, marker: Path, fmt: str) -> None:
    """Replace the checkpoint's state.pt by a malicious one: torch's zip format, or a bare pickle stream."""
    state = {"step": 1, "optimizer": Payload(marker)}
    if fmt == "torch":
        torch.save(state, ckpt_dir / ckpt.STATE)
    else:
        (ckpt_dir / ckpt.STATE).write_bytes(pickle.dumps(state))


@pytest.fixture
def trained(make_train_cfg, tmp_path: Path) -> Path:
    run = tmp_path / "victim"
    train(make_train_cfg("trainer.max_steps=2", "logging.sample_tokens=0"), run)
    return run


def test_the_payload_is_live(tmp_path: Path):
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.read_text() == "pwned"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torch", "pickle"])
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch notes the bare pickle's protocol
def test_crafted_state_is_refused_and_never_runs(trained: Path, tmp_path: Path, fmt: str, make_train_cfg):
    marker = tmp_path / "marker"
    last = trained / "checkpoints" / "last"
    _plant(last, marker, fmt)
    with pytest.raises(UserError, match=r"refused.*other than plain tensors"):
        ckpt.load_state(last)
    with pytest.raises(UserError, match="refused"):  # resuming reads the same file the same way
        train(make_train_cfg("trainer.max_steps=4", "trainer.resume=auto", "logging.sample_tokens=0"),
              trained)
    assert not marker.exists()


@pytest.mark.slow
def test_crafted_state_through_the_cli(trained: Path, tmp_path: Path, capsys, corpus_dir: Path):
    from conftest import fast_overrides

    marker = tmp_path / "marker"
    _plant(trained / "checkpoints" / "last", marker, "torch")
    result = run_script("train", [*fast_overrides(tmp_path, corpus_dir), f"trainer.resume={trained}",
                                  f"hydra.run.dir={tmp_path / 'resumed'}"], capsys)
    assert result.code == 2 and len(result.err_lines) == 1 and "refused" in result.err_lines[0]
    assert "Traceback" not in result.err + result.out
    assert not marker.exists()
    # Inference reads only safetensors, JSON and the tokenizer's JSON: the planted state.pt is never opened.
    model, _, _ = load_model(trained, "cpu")
    assert not marker.exists() and model is not None
