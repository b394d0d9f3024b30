"""The whole model: presets, factory and validation, GPT-2 layout, init, head, loss, and learning."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from model_helpers import PRESETS, VOCAB, load_preset, shrunk_config, shrunk_model, tiny_config

from minigpt.errors import UserError
from minigpt.model.factory import build_model
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.gpt import GPT


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_yaml_is_a_valid_model_config(preset):
    cfg = load_preset(preset)
    assert cfg.vocab_size is None  # taken from the tokenizer
    # full width, at most 2 layers: every shape is built, in a fraction of the memory
    # (the meta device would avoid memory altogether, but its first use imports torch._dynamo: seconds)
    model = build_model(dataclasses.replace(cfg, n_layer=min(cfg.n_layer, 2)), vocab_size=512)
    assert model.config.vocab_size == 512 and cfg.vocab_size is None


def test_presets_carry_their_defining_choices():
    seed, modern, gpt2, small = (load_preset(n) for n in ("seed", "modern", "gpt2", "small"))
    assert (seed.norm_placement, seed.pos_encoding, seed.activation, seed.norm) == (
        "post", "sinusoidal", "relu", "layernorm")
    assert (modern.pos_encoding, modern.norm, modern.activation) == ("rope", "rmsnorm", "swiglu")
    assert not modern.bias
    assert modern.kv_heads < modern.n_head
    assert (small.n_layer, small.n_head, small.n_embd, small.block_size) == (6, 6, 384, 256)
    assert small.dropout == 0.2
    assert (gpt2.pos_encoding, gpt2.activation, gpt2.norm_placement, gpt2.tie_weights, gpt2.bias) == (
        "learned", "gelu_tanh", "pre", True, True)


def test_gpt2_preset_has_gpt2_small_parameter_count():
    cfg = load_preset("gpt2")
    # 1 of the 12 blocks and a 512-token vocabulary keep it cheap; the rest is added by hand
    one_layer = build_model(dataclasses.replace(cfg, n_layer=1), vocab_size=512)
    assert one_layer.transformer.wte.weight.shape == (512, 768)
    per_block = sum(p.numel() for p in one_layer.transformer.h[0].parameters())
    assert per_block == 12 * 768**2 + 13 * 768  # 4C² attention + 8C² FFN weights, 13C biases and norms
    total = one_layer.num_params(non_embedding=False) + 11 * per_block + (50257 - 512) * 768
    assert total == 124_439_808  # OpenAI's GPT-2 small, with the head tied to wte
    assert one_layer.num_params(non_embedding=True) == one_layer.num_params(non_embedding=False) - 1024 * 768
    n, L, C, T = one_layer.num_params(), 1, 768, 1024
    assert one_layer.flops_per_token() == 6 * n + 12 * L * C * T


def test_parameter_names_follow_gpt2():
    model = shrunk_model("gpt2")
    per_layer = [
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias",
    ]
    expected = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                "transformer.ln_f.bias", "lm_head.weight"}
    expected |= {f"transformer.h.{i}.{name}" for i in range(2) for name in per_layer}
    assert set(model.state_dict()) == expected
    assert model.transformer.h[0].attn.c_attn.weight.shape == (3 * 32, 32)  # fused QKV: C -> 3C
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (4 * 32, 32)


def test_swiglu_hidden_size_keeps_the_parameter_count_of_a_4x_ffn():
    cfg = dataclasses.replace(load_preset("small"), activation="swiglu")  # 384 wide
    assert ffn_hidden_size(cfg) == 1024  # 2/3 · 4 · 384: 3·384·1024 == 2·384·1536 weights


def test_weight_tying_shares_one_matrix_and_can_be_turned_off():
    tied = shrunk_model("tiny")
    assert tied.lm_head.weight is tied.transformer.wte.weight
    untied = shrunk_model("tiny", tie_weights=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    extra = VOCAB * 32
    assert untied.num_params(non_embedding=False) == tied.num_params(non_embedding=False) + extra


def test_init_is_gpt2_style_with_scaled_residual_projections():
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(load_preset("tiny"), vocab_size=512))  # 4 layers, 128 wide
    L = model.config.n_layer
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert (p == 0).all(), name
        elif p.dim() == 1:
            assert (p == 1).all(), name
        elif name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.05), name
        else:
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name


def test_last_only_projects_just_the_last_position():
    model = shrunk_model("modern")
    idx = torch.randint(0, VOCAB, (3, 10))
    full, _ = model(idx)
    last, loss = model(idx, last_only=True)
    assert last.shape == (3, 1, VOCAB) and loss is None
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=1e-6)


def test_loss_is_mean_cross_entropy_ignoring_minus_one():
    model = shrunk_model("tiny")
    idx = torch.randint(0, VOCAB, (2, 8))
    targets = torch.randint(0, VOCAB, (2, 8))
    targets[0, :3] = -1
    logits, loss = model(idx, targets)
    logp = F.log_softmax(logits.double(), dim=-1)
    keep = targets != -1
    expected = -logp[keep].gather(1, targets[keep].unsqueeze(1)).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # at init the logits are near zero: the loss is near that of a uniform guess, ln V
    assert abs(loss.item() - math.log(VOCAB)) < 0.3


def test_sequences_longer_than_block_size_are_rejected():
    model = shrunk_model("tiny")  # block_size 16
    with pytest.raises(RuntimeError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


BAD_CONFIGS = [
    ({"n_embd": 100, "n_head": 6}, "n_embd"),
    ({"n_head": 4, "n_kv_head": 3}, "n_kv_head"),
    ({"pos_encoding": "rope", "n_embd": 36, "n_head": 4}, "rope"),  # head size 9
    ({"dropout": 1.0}, "dropout"),
    ({"dropout": -0.1}, "dropout"),
    ({"attn_dropout": 1.5}, "attn_dropout"),
    ({"block_size": 0}, "block_size"),
    ({"n_layer": 0}, "n_layer"),
    ({"pos_encoding": "absolute"}, "pos_encoding"),  # integer and none exist, as ablations
    ({"norm": "groupnorm"}, "norm"),
    ({"norm_placement": "middle"}, "norm_placement"),
    ({"activation": "tanh"}, "activation"),
    ({"attention": "flash"}, "attention"),
    ({"vocab_size": 1}, "vocab_size"),
    ({"ffn_mult": 0}, "ffn_mult"),
    ({"online_block_size": 0}, "online_block_size"),
    ({"rope_base": 0.5}, "rope_base"),
    ({"norm_eps": 0.0}, "norm_eps"),
]


@pytest.mark.parametrize("overrides,field", BAD_CONFIGS)
def test_invalid_configs_raise_user_error_naming_the_field(overrides, field):
    with pytest.raises(UserError, match=field) as err:
        tiny_config(**overrides)
    assert "\n" not in str(err.value)


def test_build_model_fills_and_checks_the_vocab_size():
    cfg = shrunk_config("tiny", vocab_size=None)
    with pytest.raises(UserError, match="vocab_size"):
        build_model(cfg)
    assert build_model(cfg, vocab_size=100).lm_head.out_features == 100
    padded = shrunk_config("tiny", vocab_size=128)
    assert build_model(padded, vocab_size=100).config.vocab_size == 128  # padding up is allowed
    with pytest.raises(UserError, match="vocab_size=50"):
        build_model(shrunk_config("tiny", vocab_size=50), vocab_size=100)
    assert isinstance(build_model(cfg, vocab_size=100), GPT)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_overfits_one_short_sequence(preset):
    torch.manual_seed(0)
    model = build_model(shrunk_config(preset)).train()
    seq = torch.randint(0, VOCAB, (1, 17), generator=torch.Generator().manual_seed(1))
    x, y = seq[:, :-1], seq[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(300):
        _, loss = model(x, y)
        first = loss.item() if first is None else first
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert first > 3.0 and loss.item() < 0.01, (first, loss.item())
