"""The Hugging Face folder with minigpt's own modeling code: transformers loads it with
trust_remote_code=True and computes minigpt's logits (fp32, within 1e-4; also for left-padded rows) and its
greedy tokens, for models with every technique switch no transformers class has; what the code does not
compute is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import VOCAB, shrunk_config

from minigpt.errors import UserError
from minigpt.interop.hf_custom import custom_config, custom_hf_files
from minigpt.interop.hf_files import write_json, write_weights
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

transformers = pytest.importorskip("transformers")

EVERY_SWITCH = dict(n_layer=3, qk_norm=True, value_embeds=True, value_embed_every=2, smear=True,
                    bigram_embed=37, embed_norm=True, norm_gain=False, residual_scalars=True, backout=True,
                    logit_softcap=3.0, activation="relu2", tie_weights=False, qk_scale=1.2, ve_gate_max=3.0,
                    ve_gate_channels=12, smear_gate_channels=24)
VARIANTS = {"every_switch": EVERY_SWITCH,
            "swiglu_gains_gqa": {**EVERY_SWITCH, "activation": "swiglu", "norm_gain": True, "n_kv_head": 2},
            "tied_value_embeds": {"value_embeds": True, "tie_weights": True}}


def _model(seed: int, **overrides) -> torch.nn.Module:
    """A model with every parameter redrawn (the switches' zeros would hide them)."""
    torch.manual_seed(seed)
    model = build_model(shrunk_config("modern", **overrides))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            gain = 1.0 if p.dim() == 1 and p.numel() > 1 else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + gain)
    return model.eval()


def _export(model, folder: Path) -> Path:
    config, weights, code = custom_hf_files(model, eot_id=VOCAB - 1)
    folder.mkdir()
    write_json(folder / "config.json", config)
    write_weights(folder / "model.safetensors", weights)
    for name, text in code.items():
        (folder / name).write_text(text)
    return folder


def _load(folder: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True,
                                                            local_files_only=True).eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_computes_minigpts_logits(tmp_path, variant):
    model = _model(1, **VARIANTS[variant])
    hf = _load(_export(model, tmp_path / "hf"))
    assert type(hf).__name__ == "MiniGPTForCausalLM"
    ids = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids)[0], atol=1e-4, rtol=0)
        # a left-padded row scores its tokens as it would alone
        mask = torch.ones_like(ids)
        mask[1, :5] = 0
        padded = hf(ids, attention_mask=mask).logits
        torch.testing.assert_close(padded[1, 5:], model(ids[1:, 5:])[0][0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ["every_switch", "swiglu_gains_gqa"])
def test_greedy_generation_gives_minigpts_tokens(tmp_path, variant):
    model = _model(3, **VARIANTS[variant])
    hf = _load(_export(model, tmp_path / "hf"))
    prompt = [5, 17, 2, 40]
    ours = generate(model, [prompt], max_new_tokens=11, params=SamplingParams(temperature=0.0),
                    generator=torch.Generator().manual_seed(0)).tokens[0]
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=11, do_sample=False, use_cache=False,
                         pad_token_id=VOCAB - 1, eos_token_id=None)
    assert theirs[0, len(prompt):].tolist() == ours
    assert len(set(ours)) > 1  # the model does not just repeat one token


def test_the_folder_names_its_code_and_minigpts_weights(tmp_path):
    model = _model(0, **EVERY_SWITCH)
    folder = _export(model, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_minigpt.MiniGPTForCausalLM"
    assert config["value_embed_every"] == 2 and config["ffn_hidden"] == 4 * 32
    hf = _load(folder)
    assert set(hf.state_dict()) == set(model.state_dict())


@pytest.mark.parametrize("overrides, named", [
    ({"pos_encoding": "learned", "value_embeds": True}, "model.pos_encoding=learned"),
    ({"norm_placement": "post", "smear": True}, "model.norm_placement=post"),
    ({"causal": False, "smear": True}, "model.causal=false is an ablation"),
])
def test_what_the_code_does_not_compute_is_refused_in_one_line(overrides, named):
    with pytest.raises(UserError) as refused:
        custom_config(shrunk_config("modern", **overrides), eot_id=0)
    assert str(refused.value).startswith(named) and "\n" not in str(refused.value)
