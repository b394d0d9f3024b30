"""Which models export: the two families every inference stack runs, and a one-line refusal naming the feature
for everything else, in both formats, before anything is written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from interop_helpers import SHAPES, save_model, small_bpe, wide_model

from minigpt.errors import UserError
from minigpt.interop.architecture import GPT2, LLAMA, QWEN3, architecture_of
from minigpt.interop.config import ExportConfig
from minigpt.interop.export import export
from minigpt.interop.gguf_export import gguf_tensors
from minigpt.interop.hf_export import hf_files
from minigpt.model.config import ModelConfig

GPT2_BASE = SHAPES["gpt2_block"]
LLAMA_BASE = SHAPES["demo"]
# (base, overrides) -> the text the refusal must name; the first two families' own switches, then the rest
REFUSED = [
    (GPT2_BASE, {"norm_placement": "post"}, "model.norm_placement=post"),
    (GPT2_BASE, {"pos_encoding": "sinusoidal"}, "model.pos_encoding=sinusoidal"),
    (GPT2_BASE, {"pos_encoding": "integer"}, "model.pos_encoding=integer"),
    (GPT2_BASE, {"pos_encoding": "none"}, "model.pos_encoding=none"),
    (GPT2_BASE, {"causal": False}, "model.causal=false is an ablation"),
    (GPT2_BASE, {"attn_scale": "none"}, "model.attn_scale=none is an ablation"),
    (GPT2_BASE, {"residual": False}, "model.residual=false is an ablation"),
    (GPT2_BASE, {"final_norm": False}, "model.final_norm=false is an ablation"),
    (GPT2_BASE, {"norm": "rmsnorm"}, "model.norm=rmsnorm with model.pos_encoding=learned"),
    (GPT2_BASE, {"activation": "swiglu"}, "model.activation=swiglu with model.pos_encoding=learned"),
    (GPT2_BASE, {"n_kv_head": 2}, "model.n_kv_head=2"),
    (LLAMA_BASE, {"norm": "layernorm"}, "model.norm=layernorm with model.pos_encoding=rope"),
    (LLAMA_BASE, {"activation": "gelu"}, "model.activation=gelu with model.pos_encoding=rope"),
    (LLAMA_BASE, {"norm_placement": "post"}, "model.norm_placement=post"),
    (LLAMA_BASE, {"causal": False}, "model.causal=false is an ablation"),
    (GPT2_BASE, {"qk_norm": True}, "model.qk_norm=true with model.pos_encoding=learned"),
    (LLAMA_BASE, {"qk_norm": True, "bias": True},
     "model.bias=true with model.pos_encoding=rope and model.qk_norm=true has no"),
]


def test_the_two_families_and_their_variants_export() -> None:
    qwen3 = dataclasses.replace(LLAMA_BASE, qk_norm=True)
    for base, family in ((GPT2_BASE, GPT2), (LLAMA_BASE, LLAMA), (qwen3, QWEN3)):
        assert architecture_of(base) == family
    variants = [
        dataclasses.replace(GPT2_BASE, activation="relu", bias=False, tie_weights=False, ffn_mult=3.0),
        dataclasses.replace(LLAMA_BASE, n_kv_head=None, bias=True, tie_weights=True, rope_base=1e6),
        dataclasses.replace(LLAMA_BASE, dropout=0.1, attn_dropout=0.1, attention="math"),  # not weights
    ]
    for cfg in variants:
        config, weights = hf_files(wide_model(cfg, 300), eot_id=299)
        assert config["model_type"] in (GPT2, LLAMA) and weights
    config, _ = hf_files(wide_model(qwen3, 300), eot_id=299)
    assert (config["model_type"], config["architectures"]) == (QWEN3, ["Qwen3ForCausalLM"])


@pytest.mark.parametrize(("base", "overrides", "named"), REFUSED, ids=[r[2] for r in REFUSED])
def test_a_feature_with_no_equivalent_is_refused_naming_it(base: ModelConfig, overrides: dict, named: str):
    model = wide_model(dataclasses.replace(base, **overrides), 300)
    for convert, target in ((lambda m: hf_files(m, 299), "Hugging Face"), (gguf_tensors, "GGUF")):
        with pytest.raises(UserError) as refused:
            convert(model)
        message = str(refused.value)
        assert named in message and "\n" not in message, message
        assert target in message


def test_a_refused_checkpoint_writes_nothing(tmp_path: Path) -> None:
    ckpt = save_model(tmp_path / "seed", wide_model(dataclasses.replace(GPT2_BASE, norm_placement="post",
                                                                        pos_encoding="sinusoidal"), 512),
                      small_bpe())
    with pytest.raises(UserError, match="model.norm_placement=post has no Hugging Face equivalent"):
        export(ExportConfig(checkpoint=str(ckpt), format="hf", out=str(tmp_path / "hf")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed"]
