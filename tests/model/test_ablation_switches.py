"""The ablation switches: defaults, validation, warnings, and every backend honouring every switch."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
from cli_helpers import run_script
from conftest import compose_train, fast_overrides
from model_helpers import PRESETS, VOCAB, assert_backends_agree, load_preset, shrunk_config, tiny_config

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model
from minigpt.cli import to_object
from minigpt.data.tokenizers import ByteTokenizer
from minigpt.errors import UserError
from minigpt.interop.hf_gpt2 import hf_config_from_model
from minigpt.model.config import ablation_warnings
from minigpt.model.factory import build_model
from minigpt.runs.train import train
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams
from minigpt.training.config import TrainConfig

# each ablation as ModelConfig overrides, and the key its warning must name
SWITCHES = {
    "no_causal_mask": ({"causal": False}, "model.causal=false"),
    "no_attn_scale": ({"attn_scale": "none"}, "model.attn_scale=none"),
    "integer_positions": ({"pos_encoding": "integer"}, "model.pos_encoding=integer"),
    "no_positions": ({"pos_encoding": "none"}, "model.pos_encoding=none"),
    "no_residual": ({"residual": False}, "model.residual=false"),
    "no_final_norm": ({"final_norm": False}, "model.final_norm=false"),
    "batchnorm": ({"norm": "batchnorm"}, "model.norm=batchnorm"),
}


def _tokens(B: int = 2, T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def test_every_switch_defaults_to_keeping_its_piece():
    cfg = tiny_config()
    assert (cfg.causal, cfg.attn_scale, cfg.residual, cfg.final_norm) == (True, "sqrt", True, True)
    for preset in PRESETS:
        assert ablation_warnings(load_preset(preset)) == [], preset


@pytest.mark.parametrize("name", SWITCHES)
def test_each_switch_has_one_warning_line_naming_its_key(name):
    overrides, key = SWITCHES[name]
    lines = ablation_warnings(shrunk_config("tiny", **overrides))
    assert len(lines) == 1 and lines[0].startswith(key) and "\n" not in lines[0]


@pytest.mark.parametrize("overrides, field", [
    ({"attn_scale": "half"}, "attn_scale='half' is not one of: sqrt, none"),
    ({"pos_encoding": "absolute"}, "pos_encoding='absolute' is not one of"),
    ({"pos_encoding": "integer", "rope_base": 500.0},
     "model.rope_base=500.0 has no effect with model.pos_encoding=integer"),
    ({"pos_encoding": "none", "rope_base": 500.0},
     "model.rope_base=500.0 has no effect with model.pos_encoding=none"),
    ({"final_norm": False, "norm_placement": "post"},
     "model.final_norm=false only applies to model.norm_placement=pre"),
])
def test_nonsense_values_and_combinations_are_one_line_user_errors(overrides, field):
    with pytest.raises(UserError) as err:
        tiny_config(**overrides)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_switches_compose_through_hydra_and_a_bad_one_stops_the_cli_in_one_line(tmp_path, corpus_dir, capsys):
    switches = ["model.causal=false", "model.attn_scale=none", "model.residual=false",
                "model.final_norm=false", "model.pos_encoding=integer"]
    cfg = to_object(compose_train(["model=demo", *switches]), TrainConfig)
    assert (cfg.model.causal, cfg.model.attn_scale, cfg.model.residual, cfg.model.final_norm,
            cfg.model.pos_encoding) == (False, "none", False, False, "integer")
    run = run_script("train", [*fast_overrides(tmp_path, corpus_dir), "model.attn_scale=half",
                               f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1
    assert "model.attn_scale='half' is not one of: sqrt, none" in run.err_lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_building_or_loading_an_ablation_model_logs_one_line(tmp_path, caplog):
    cfg = shrunk_config("tiny", causal=False, residual=False)
    with caplog.at_level(logging.WARNING, logger="minigpt.model.factory"):
        model = build_model(cfg)
        build_model(shrunk_config("tiny"))  # a normal model says nothing
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert "\n" not in line and "model.causal=false" in line and "model.residual=false" in line
    caplog.clear()
    meta = {"model_config": dataclasses.asdict(model.config)}
    ckpt.save_checkpoint(tmp_path / "ckpt", model, {}, meta, ByteTokenizer())
    with caplog.at_level(logging.WARNING, logger="minigpt.model.factory"):
        loaded, _, _ = load_model(tmp_path / "ckpt", "cpu")
    assert [r.getMessage() for r in caplog.records] == [line]
    assert loaded.config.causal is False


@pytest.mark.parametrize("name", SWITCHES)
def test_math_sdpa_and_online_agree_under_each_switch(name):
    overrides, _ = SWITCHES[name]
    # GQA and an online block smaller than T, so every code path of every backend runs; train mode (no
    # dropout here), because that is where causal=false takes effect
    models = [build_model(shrunk_config("modern" if "pos_encoding" not in overrides else "tiny", attention=b,
                                        online_block_size=5, **overrides)).train()
              for b in ("math", "sdpa", "online")]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    assert_backends_agree(models, _tokens())


@pytest.mark.parametrize("backend", ["math", "sdpa", "online"])
def test_no_causal_mask_sees_the_future_in_training_mode_only(backend):
    model = build_model(shrunk_config("tiny", attention=backend, online_block_size=5, causal=False))
    idx = _tokens()
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    model.train()  # the mode the loss is optimised in: the future is visible
    assert not torch.allclose(model(idx)[0][:, :6], model(changed)[0][:, :6])
    model.eval()  # validation, sampling, inspection: causal, as a decoder must be
    torch.testing.assert_close(model(idx)[0][:, :6], model(changed)[0][:, :6], atol=0, rtol=0)


def test_a_model_trained_without_the_mask_generates_causally_with_and_without_the_cache():
    ablated = build_model(shrunk_config("tiny", causal=False)).eval()
    normal = build_model(shrunk_config("tiny")).eval()
    normal.load_state_dict(ablated.state_dict())
    with torch.no_grad():
        for p in ablated.parameters():
            p.mul_(20.0)  # sharp logits: different attention would show up as different tokens
        normal.load_state_dict(ablated.state_dict())
    prompts, params = [[1, 2, 3], [4, 5, 6, 7, 8]], SamplingParams(temperature=1.0)

    def tokens(model, use_cache):
        return generate(model, prompts, max_new_tokens=10, params=params, use_cache=use_cache,
                        generator=torch.Generator().manual_seed(3)).tokens

    assert tokens(ablated, True) == tokens(normal, True) == tokens(ablated, False)


def test_no_final_norm_feeds_the_raw_stream_to_the_head():
    model = build_model(shrunk_config("tiny", final_norm=False)).eval()
    assert isinstance(model.transformer.ln_f, torch.nn.Identity)
    stream = {}
    model.transformer.h[-1].register_forward_hook(lambda m, i, o: stream.__setitem__("x", o))
    logits, _ = model(_tokens())
    torch.testing.assert_close(logits, stream["x"] @ model.transformer.wte.weight.T)  # tied head, no norm
    assert isinstance(build_model(shrunk_config("tiny")).transformer.ln_f, torch.nn.LayerNorm)


def test_integer_positions_are_the_index_in_every_channel_and_not_saved():
    model = build_model(shrunk_config("tiny", pos_encoding="integer"))
    pe = model.transformer.wpe(torch.tensor([[0, 5, 15]]))  # (1, 3, C)
    expected = torch.tensor([0.0, 5.0, 15.0]).view(1, 3, 1).expand(1, 3, model.config.n_embd)
    torch.testing.assert_close(pe, expected, atol=0, rtol=0)
    assert not any(k.startswith("transformer.wpe") for k in model.state_dict())
    assert "wpe" not in build_model(shrunk_config("tiny", pos_encoding="none")).transformer
    assert model.to(torch.bfloat16)(_tokens())[0].dtype == torch.bfloat16  # follows the model's dtype


@pytest.mark.parametrize("name", SWITCHES)
def test_gpt2_export_refuses_every_ablation(name):
    overrides, key = SWITCHES[name]
    cfg = shrunk_config("gpt2", **overrides)
    with pytest.raises(UserError, match=key.split("=")[0].replace(".", r"\.")):
        hf_config_from_model(cfg)
    hf_config_from_model(shrunk_config("gpt2"))  # the unablated preset exports


@pytest.mark.slow
def test_a_checkpoint_written_before_the_switches_existed_still_loads_and_resumes(make_train_cfg, tmp_path):
    run = tmp_path / "run"
    train(make_train_cfg("trainer.max_steps=4"), run)
    meta_path = run / "checkpoints" / "last" / ckpt.META
    meta = json.loads(meta_path.read_text())
    for key in ("causal", "attn_scale", "residual", "final_norm"):  # what an older minigpt wrote
        del meta["model_config"][key]
    meta_path.write_text(json.dumps(meta))
    model, _, _ = load_model(run, "cpu")
    assert ablation_warnings(model.config) == []  # the missing keys mean what they meant then
    assert train(make_train_cfg("trainer.max_steps=8", "trainer.resume=auto"), run).step == 8
