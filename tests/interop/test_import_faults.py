"""Malformed Hugging Face folders and a failing disk, through the real `scripts/import_hf.py`: each ends with
one line naming the file (or tensor) and what is wrong with it, exit code 2, no traceback; the folder is read
whole before anything is written, so no checkpoint, temporary or folder of the import is left behind, and the
source is unchanged.

Each damaged folder is a copy of one that imports (a Llama block exported by minigpt), with one thing broken.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from cli_helpers import file_size_limit, run_script, snapshot
from interop_helpers import make_checkpoint, small_bpe
from safetensors.torch import load_file, save_file

from minigpt.interop.hf_export import export_hf

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"


def _edit_config(**changes: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / CONFIG).read_text())
        (folder / CONFIG).write_text(json.dumps({**config, **changes}))
    return edit


def _edit_weights(edit_dict: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        weights = load_file(str(folder / WEIGHTS))
        edit_dict(weights)
        save_file(weights, str(folder / WEIGHTS), metadata={"format": "pt"})
    return edit


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_text(text)


Q = "model.layers.0.self_attn.q_proj.weight"
# id -> (what breaks the folder, a piece of the one line)
DAMAGE = {
    "config-missing-keys": (_write(CONFIG, '{"model_type": "llama", "num_hidden_layers": 2}'),
                            f"{CONFIG} has no hidden_size"),
    "config-not-json": (_write(CONFIG, '{"model_type": '), f"{CONFIG} is not valid JSON"),
    "config-not-an-object": (_write(CONFIG, "[1, 2]"), "holds no JSON object"),
    "config-wrong-type": (_edit_config(hidden_size="big"), "hidden_size='big'; it must be a whole number"),
    "config-no-heads": (_edit_config(num_attention_heads=0), "num_attention_heads=0"),
    "config-null-size": (_edit_config(vocab_size=None), f"{CONFIG} has no vocab_size"),
    "config-other-model-type": (_edit_config(model_type="mistral"), "model_type='mistral'"),
    "config-smaller-vocabulary": (_edit_config(vocab_size=100),
                                  "model.embed_tokens.weight has shape (512, 96) where it needs (100, 96)"),
    "weights-missing": (lambda f: (f / WEIGHTS).unlink(), "has no model.safetensors or pytorch_model.bin"),
    "weights-truncated": (lambda f: (f / WEIGHTS).write_bytes((f / WEIGHTS).read_bytes()[:1000]),
                          "corrupt file"),
    "weights-a-tensor-missing": (_edit_weights(lambda w: w.pop("model.norm.weight")),
                                 "missing ['model.norm.weight']"),
    "weights-more-rows": (_edit_weights(lambda w: w.update({Q: torch.cat([w[Q], w[Q][:2]])})),
                          f"{Q} has shape (98, 96) where it needs (96, 96)"),
    "weights-other-columns": (_edit_weights(lambda w: w.update({Q: torch.zeros(96, 5)})),
                              f"{Q} has shape (96, 5) where it needs (96, 96)"),
    "tokenizer-not-json": (_write(TOKENIZER, '{"model": '), f"{TOKENIZER} is not valid JSON"),
    "tokenizer-not-bpe": (_write(TOKENIZER, '{"model": {"type": "WordPiece", "vocab": {}}}'),
                          "tokenizer_dir=DIR"),
    "tokenizer-no-vocab": (_write(TOKENIZER, json.dumps({"model": {"type": "BPE"}, "added_tokens": [
        {"content": "<|endoftext|>", "id": 3, "special": True}]})), "tokenizer_dir=DIR"),
}


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("import_faults")
    _, model = make_checkpoint(root / "ckpt", "demo")
    return export_hf(model, small_bpe(), root / "hf")


def _one_line(run, *needles: str) -> str:
    assert run.code == 2 and len(run.err_lines) == 1, (run.code, run.err[-3000:])
    assert "Traceback" not in run.err + run.out
    line = run.err_lines[0]
    assert line.startswith("error: ") and all(n in line for n in needles), line
    return line


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_malformed_folder_is_refused_in_one_line(case, hf_folder, tmp_path, capsys):
    damage, needle = DAMAGE[case]
    source = tmp_path / "hf"
    shutil.copytree(hf_folder, source)
    damage(source)
    before = snapshot(tmp_path)
    run = run_script("import_hf", [f"source={source}", f"out={tmp_path / 'new' / 'ckpt'}"], capsys)
    assert str(source) in _one_line(run, needle)  # the folder, or the file in it, is named
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_missing_tokenizer_folder_is_named(hf_folder, tmp_path, capsys):
    run = run_script("import_hf", [f"source={hf_folder}", f"out={tmp_path / 'ckpt'}",
                                   f"tokenizer_dir={tmp_path / 'nowhere'}"], capsys)
    _one_line(run, f"no tokenizer.json in {tmp_path / 'nowhere'}")
    assert list(tmp_path.iterdir()) == []


def test_a_file_size_limit_names_the_file_and_the_key_that_moves_it(hf_folder, tmp_path, capsys):
    """RLIMIT_FSIZE in this process (Python ignores SIGXFSZ, so the write fails with EFBIG)."""
    out = tmp_path / "new" / "ckpt"
    with file_size_limit(64 * 1024):
        run = run_script("import_hf", [f"source={hf_folder}", f"out={out}"], capsys)
    line = _one_line(run, f"cannot write {out}/model.safetensors: File too large", "out=")
    assert "hydra.run.dir" not in line and list(tmp_path.iterdir()) == []
