"""Every preset composes through Hydra's compose API, validates, and builds a model."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from conftest import CONFIG_DIR, compose_train

from minigpt.cli import to_object
from minigpt.config import SCHEMAS, register_configs
from minigpt.data.tokenizers import ByteTokenizer, CharTokenizer
from minigpt.errors import UserError
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.training.config import OptimConfig, TrainConfig, default_run_model


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
        return cfg.tokenizer.bpe_vocab_size
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


def _yaml_values(path) -> dict:
    """The keys an option or experiment file sets, flattened (`model.n_layer`), without its defaults list."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    raw.pop("defaults", None)

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    return flat(raw)


def _value(cfg: TrainConfig, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)  # a dict field: optim.groups
    return cfg


@pytest.mark.parametrize("group", ["model", "optim", "trainer", "device", "logging", "data", "tokenizer"])
def test_every_group_option_sets_what_its_file_says(group: str):
    for option in _options(group):
        needs_paths = group == "data" and option in ("text", "files")
        overrides = [f"{group}={option}"] + (["data.paths=[x.txt]"] if needs_paths else [])
        cfg = to_object(compose_train(overrides), TrainConfig)
        for key, want in _yaml_values(CONFIG_DIR / group / f"{option}.yaml").items():
            if (group, key) == ("data", "paths") and needs_paths:
                want = ["x.txt"]
            assert _value(getattr(cfg, group), key) == want, f"{group}={option}: {key}"


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_experiments_switch_what_they_say(experiment: str):
    """Every key an experiment sets, and every group it overrides, arrives in the composed config."""
    from omegaconf import OmegaConf

    path = CONFIG_DIR / "experiment" / f"{experiment}.yaml"
    cfg = to_object(compose_train([f"experiment={experiment}"]), TrainConfig)
    own = _yaml_values(path)
    for key, want in own.items():
        assert _value(cfg, key) == want, key
    for entry in OmegaConf.load(path).get("defaults", []):
        for target, option in dict(entry).items():  # {"override /model": "modern"}
            group = target.split("/")[-1]
            for key, want in _yaml_values(CONFIG_DIR / group / f"{option}.yaml").items():
                if f"{group}.{key}" not in own:  # the experiment's own value wins over its option's
                    assert _value(getattr(cfg, group), key) == want, f"{group}={option}: {key}"


def test_defaults_are_the_documented_ones():
    cfg = to_object(compose_train(), TrainConfig)
    assert (cfg.data.source, cfg.tokenizer.kind, cfg.tokenizer.bpe_vocab_size) == ("pystdlib", "bpe", 4096)
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.device.type) == (4, 96, "auto")


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


def test_the_dataclass_defaults_are_the_plain_presets():
    """One source of defaults: `train(TrainConfig(), ...)` from Python trains what `make train
    ARGS="model=demo optim=muon"` runs, so the YAML of a plain option may restate a dataclass default but
    never differ from it; the default run differs from it in its model and optimizer only."""
    assert to_object(compose_train(["model=demo", "optim=muon"]), TrainConfig) == TrainConfig()
    default = to_object(compose_train(), TrainConfig)
    assert default.model == default_run_model()  # what fine-tuning reads as "not set" (training/start.py)
    assert dataclasses.replace(default, model=ModelConfig(), optim=OptimConfig()) == TrainConfig()


@pytest.mark.parametrize("name, schema", [(n, s) for n, s in SCHEMAS.items() if n != "train_schema"])
def test_every_tool_config_composes_to_its_dataclass_defaults(name: str, schema: type):
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        composed = to_object(compose(config_name=name.removesuffix("_schema")), schema)
    arm = getattr(composed, "minigpt", None)
    if isinstance(arm, TrainConfig):  # a tool that trains the default run holds the plain presets' defaults
        assert arm.model == to_object(compose_train(), TrainConfig).model
        composed = dataclasses.replace(composed, minigpt=dataclasses.replace(arm, model=ModelConfig(),
                                                                             optim=OptimConfig()))
    assert composed == schema()


def test_the_model_presets_of_the_defaults_are_the_dataclass_and_the_test_helper():
    """`model=demo` is ModelConfig()'s defaults; `model=tiny` is GPT-2's block that tests build with
    model_helpers.tiny_config: both restate their source, and neither may drift from it."""
    from model_helpers import tiny_config

    from minigpt.model.config import ModelConfig

    assert to_object(compose_train(["model=demo"]), TrainConfig).model == ModelConfig()
    assert to_object(compose_train(["model=tiny"]), TrainConfig).model == tiny_config()
