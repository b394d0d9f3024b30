"""The Troubleshooting table as tests: each bad input a user can give prepare, train or generate ends with one
line on stderr naming the problem and the fix, exit code 2, no traceback, and every file that existed before
(corpus, prepared data, checkpoints) unchanged.

The scripts run in this process (`cli_helpers.run_script`): the real entry points, minus a new interpreter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script, snapshot
from conftest import compose_train, fast_overrides, write_corpus

from minigpt.checkpoint import format as ckpt
from minigpt.config import to_object
from minigpt.training.config import TrainConfig
from minigpt.training.trainer import train


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A corpus, its prepared data and one finished 2-step run: the files a mistake must not damage."""
    root = tmp_path_factory.mktemp("errors")
    corpus = write_corpus(root / "corpus")
    overrides = [*fast_overrides(root, corpus), "trainer.max_steps=2", "logging.sample_tokens=0"]
    cfg = to_object(compose_train(overrides), TrainConfig)
    train(cfg, root / "run")
    (root / "empty_corpus").mkdir()
    (root / "empty_corpus" / "blank.txt").write_text("")
    (root / "latin1").mkdir()
    (root / "latin1" / "old.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    (root / "a_file").write_text("not a folder\n")
    (root / "prompt_dir").mkdir()
    # Damaged copies of the run's checkpoint.
    for name in ("future", "no_tokenizer", "truncated"):
        shutil.copytree(root / "run" / "checkpoints" / "last", root / name)
    meta = json.loads((root / "future" / ckpt.META).read_text())
    (root / "future" / ckpt.META).write_text(json.dumps({**meta, "format_version": 99}))
    shutil.rmtree(root / "no_tokenizer" / ckpt.TOKENIZER)
    weights = root / "truncated" / ckpt.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])
    return root


def _train_args(w: Path) -> list[str]:
    return fast_overrides(w, w / "corpus")


# id -> (script, arguments, a piece of the expected message). `{w}` is the world folder; TRAIN stands for the
# fast training preset on the world's corpus.
P, T, G = "prepare_data", "train", "generate"
CASES = {
    # ---- prepare
    "prepare-unknown-key": (P, ["data=text", "data.pathz=[x]"], "pathz"),
    "prepare-missing-path": (P, ["data=text", "data.paths=[{w}/nowhere]", "data.cache_dir={w}/d"],
                             "does not exist"),
    "prepare-empty-corpus": (P, ["data=text", "data.paths=[{w}/empty_corpus]", "data.cache_dir={w}/d"],
                             "no non-empty documents"),
    "prepare-text-without-paths": (P, ["data=text"], "data.paths"),
    "prepare-val-ratio": (P, ["data.val_ratio=1.5"], "data.val_ratio=1.5"),
    "prepare-bpe-vocab-too-small": (P, ["tokenizer=bpe", "tokenizer.vocab_size=100"], "vocab_size=100"),
    "prepare-not-utf8": (P, ["data=text", "data.paths=[{w}/latin1]", "data.cache_dir={w}/d",
                             "tokenizer=byte"], "encoding_errors"),
    "prepare-cache-not-writable": (P, ["data=text", "data.paths=[{w}/corpus]", "tokenizer=byte",
                                       "data.cache_dir={w}/a_file/cache"], "a_file"),
    # ---- train
    "train-unknown-key": (T, ["trainer.max_stepz=3"], "max_stepz"),
    "train-wrong-type": (T, ["trainer.max_steps=ten"], "max_steps"),
    "train-unknown-preset": (T, ["model=huge"], "huge"),
    "train-invalid-model-shape": (T, ["model.n_embd=30", "model.n_head=4"], "model.n_embd=30"),
    "train-missing-data-path": (T, ["data=text", "data.paths=[{w}/nowhere]"], "does not exist"),
    "train-tokens-per-step": (T, ["TRAIN", "trainer.tokens_per_step=1000"], "trainer.tokens_per_step=1000"),
    "train-resume-no-checkpoint": (T, ["TRAIN", "trainer.resume={w}/corpus"], "neither a checkpoint"),
    "train-resume-missing": (T, ["TRAIN", "trainer.resume={w}/nowhere"], "does not exist"),
    "train-resume-other-shape": (T, ["TRAIN", "trainer.resume={w}/run", "model.n_layer=3"],
                                 "different model config"),
    "train-resume-corrupt": (T, ["TRAIN", "trainer.resume={w}/truncated"], "corrupt"),
    "train-resume-past-max-steps": (T, ["TRAIN", "trainer.resume={w}/run", "trainer.max_steps=1"],
                                    "trainer.max_steps=1"),
    "train-run-dir-has-checkpoint": (T, ["TRAIN", "hydra.run.dir={w}/run"], "trainer.resume=auto"),
    "train-run-dir-not-writable": (T, ["TRAIN", "hydra.run.dir={w}/a_file/run"], "a_file"),
    "train-cuda-missing": (T, ["TRAIN", "device=cuda"], "device=cpu"),
    "train-float16-on-cpu": (T, ["TRAIN", "device.dtype=float16"], "float16"),
    "train-compile-unavailable": (T, ["TRAIN", "device.compile=true"], "device.compile=false"),
    "train-unknown-strategy": (T, ["TRAIN", "trainer.strategy=zero"], "trainer.strategy"),
    "train-unknown-on-nonfinite": (T, ["TRAIN", "trainer.on_nonfinite=ignore"], "trainer.on_nonfinite"),
    # ---- generate
    "generate-unknown-key": (G, ["temprature=0.5"], "temprature"),
    "generate-checkpoint-missing": (G, ["checkpoint={w}/nowhere"], "does not exist"),
    "generate-no-runs-yet": (G, ["checkpoint=null"], "make train"),
    "generate-not-a-checkpoint": (G, ["checkpoint={w}/corpus"], "neither a checkpoint"),
    "generate-future-format": (G, ["checkpoint={w}/future"], "format_version 99"),
    "generate-no-tokenizer": (G, ["checkpoint={w}/no_tokenizer"], "tokenizer"),
    "generate-corrupt-weights": (G, ["checkpoint={w}/truncated"], "corrupt"),
    "generate-negative-temperature": (G, ["checkpoint={w}/run", "temperature=-1"], "temperature"),
    "generate-top-p": (G, ["checkpoint={w}/run", "top_p=1.5"], "top_p"),
    "generate-prompt-file-missing": (G, ["checkpoint={w}/run", "prompt_file={w}/nowhere.txt"], "nowhere.txt"),
    "generate-prompt-and-file": (G, ["checkpoint={w}/run", "prompt=hi", "prompt_file={w}/x"], "not both"),
    "generate-cuda-missing": (G, ["checkpoint={w}/run", "device=cuda"], "cuda"),
    # ---- keys a tool would otherwise accept and ignore
    "generate-training-only-device-key": (G, ["checkpoint={w}/run", "device.compile=true"], "device.compile"),
    "generate-autocast-dtype": (G, ["checkpoint={w}/run", "device.dtype=bfloat16"], "device.dtype"),
    "train-vocab-size-for-char": (T, ["TRAIN", "tokenizer=char", "tokenizer.vocab_size=300"],
                                  "tokenizer.vocab_size applies only to tokenizer=bpe"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_with_one_clear_line(case: str, world: Path, tmp_path: Path, capsys, monkeypatch):
    if case.endswith("cuda-missing") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if case == "train-compile-unavailable":  # what a machine without a C++ compiler looks like to Inductor
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.chdir(tmp_path)  # `outputs/` (generate's default search) is empty here
    script, args, needle = CASES[case]
    args = [a.format(w=world) for a in args]
    if "TRAIN" in args:
        args = [*_train_args(world), *(a for a in args if a != "TRAIN")]
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={tmp_path / 'out'}")
    before = snapshot(world)

    result = run_script(script, args, capsys)

    assert result.code == 2, (result.code, result.err[-2000:])
    assert len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith("error: ") and needle in line, line
    assert "Traceback" not in result.err + result.out
    after = snapshot(world)
    changed = [p for p, digest in before.items() if after.get(p) != digest]
    assert not changed, changed
