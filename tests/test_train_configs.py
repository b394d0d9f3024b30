"""Every preset composes through Hydra's compose API, validates, and builds a model."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import CONFIG_DIR, compose_train

from minigpt.config import TrainConfig, to_object
from minigpt.data.tokenizers import ByteTokenizer, CharTokenizer
from minigpt.errors import UserError
from minigpt.model import build_model


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


# Vocabulary sizes without touching the network or training a BPE: byte and char from their own classes,
# bpe from its config, the tiktoken encodings from their published sizes.
NAMED_VOCAB = {"gpt2": 50257, "cl100k": 100277}


def _vocab(cfg: TrainConfig) -> int:
    kind = cfg.tokenizer.kind
    if kind == "byte":
        return ByteTokenizer().vocab_size
    if kind == "char":
        return CharTokenizer.from_texts(["def f(x):\n    return x\n"]).vocab_size
    if kind == "bpe":
        return cfg.tokenizer.vocab_size
    return NAMED_VOCAB[kind]


@pytest.mark.parametrize("tokenizer", _options("tokenizer"))
@pytest.mark.parametrize("model", _options("model"))
def test_model_x_tokenizer_composes_and_builds(model: str, tokenizer: str):
    cfg = to_object(compose_train([f"model={model}", f"tokenizer={tokenizer}"]), TrainConfig)
    assert cfg.tokenizer.kind == tokenizer
    with torch.device("meta"):  # shapes and wiring only: no memory, no init cost even for gpt2
        gpt = build_model(cfg.model, vocab_size=_vocab(cfg))
    assert gpt.config.vocab_size == _vocab(cfg)
    assert gpt.lm_head.weight.shape == (_vocab(cfg), cfg.model.n_embd)


@pytest.mark.parametrize("group", ["optim", "trainer", "device", "logging", "data"])
def test_every_group_option_composes(group: str):
    for option in _options(group):
        needs_paths = group == "data" and option in ("text", "files")
        overrides = [f"{group}={option}"] + (["data.paths=[x.txt]"] if needs_paths else [])
        cfg = to_object(compose_train(overrides), TrainConfig)
        assert isinstance(cfg, TrainConfig)


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_experiments_compose(experiment: str):
    cfg = to_object(compose_train([f"experiment={experiment}"]), TrainConfig)
    assert cfg.run_name == experiment


def test_defaults_are_the_documented_ones():
    cfg = to_object(compose_train(), TrainConfig)
    assert (cfg.data.source, cfg.tokenizer.kind, cfg.tokenizer.vocab_size) == ("pystdlib", "bpe", 4096)
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.device.type) == (4, 128, "auto")


@pytest.mark.parametrize("override, message", [
    ("optim.lr=-1", "optim.lr=-1"),
    ("trainer.batch_size=0", "trainer.batch_size=0"),
    ("device.type=tpu", "device.type='tpu'"),
])
def test_bad_values_are_user_errors(override: str, message: str):
    with pytest.raises(UserError, match=message.replace(".", r"\.").replace("-", r"\-")):
        to_object(compose_train([override]), TrainConfig)


@pytest.mark.parametrize("run_name, suffix", [(None, ""), ("demo", "_demo")])
def test_run_folder_name(run_name: str | None, suffix: str):
    from hydra import compose, initialize_config_dir

    overrides = [] if run_name is None else [f"run_name={run_name}"]
    compose_train()  # registers the schema and the resolver
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    run_dir = str(cfg.hydra.run.dir)
    assert re.fullmatch(r"outputs/train/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d" + suffix, run_dir), run_dir
    assert cfg.hydra.sweep.dir.startswith("outputs/train/multirun/") and cfg.hydra.job.chdir is False
