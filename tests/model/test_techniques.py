"""The technique switches: each against an explicit formula, every backend agreeing with it on, causality,
cached decoding equal to uncached, validation, parameter counts and the export refusal."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from model_helpers import VOCAB, assert_backends_agree, shrunk_config, tiny_config

from minigpt.errors import UserError
from minigpt.interop.architecture import architecture_of
from minigpt.interop.hf_gpt2 import hf_config_from_model
from minigpt.model.attention import CausalSelfAttention, math_attention
from minigpt.model.chunked_loss import linear_cross_entropy
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.model.ffn import MLP
from minigpt.model.previous_token import HASH_MULTIPLIER
from minigpt.model.rope import RotaryEmbedding, apply_rope
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

# each technique as ModelConfig overrides
SWITCHES = {
    "qk_norm": {"qk_norm": True},
    "relu2": {"activation": "relu2"},
    "zero_init_proj": {"zero_init_proj": True},
    "value_embeds": {"value_embeds": True},
    "smear": {"smear": True},
    "bigram_embed": {"bigram_embed": 37},
    "logit_softcap": {"logit_softcap": 2.0},
    "value_embed_every": {"value_embeds": True, "value_embed_every": 2, "n_layer": 3},
    "norm_gain": {"norm_gain": False},
    "embed_norm": {"embed_norm": True},
    "residual_scalars": {"residual_scalars": True, "n_layer": 3},
    "backout": {"backout": True, "n_layer": 3},
    "qk_scale": {"qk_scale": 1.2, "qk_norm": True},
    "gate_shapes": {"value_embeds": True, "smear": True, "ve_gate_max": 3.0, "ve_gate_channels": 12,
                    "smear_gate_channels": 24},
}
ALL_ON = {k: v for overrides in SWITCHES.values() for k, v in overrides.items()}


def _tokens(B: int = 2, T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def _randomise(model: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    """Redraw every parameter, zero-initialised ones included: at init the switches' zeros hide them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            gain = 1.0 if p.dim() == 1 and p.numel() > 1 else 0.0  # norm gains around 1, the rest around 0
            p.copy_(torch.randn(p.shape, generator=g) * std + gain)
    return model


def _model(seed: int = 0, preset: str = "modern", **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    return _randomise(build_model(shrunk_config(preset, **overrides)), seed).eval()


def test_every_switch_is_off_by_default():
    cfg = ModelConfig()
    assert (cfg.qk_norm, cfg.zero_init_proj, cfg.value_embeds, cfg.smear, cfg.bigram_embed,
            cfg.logit_softcap, cfg.activation) == (False, False, False, False, 0, 0.0, "swiglu")
    assert (cfg.value_embed_every, cfg.norm_gain, cfg.embed_norm, cfg.residual_scalars, cfg.backout) == (
        1, True, False, False, False)
    assert (cfg.qk_scale, cfg.ve_gate_max, cfg.ve_gate_channels, cfg.smear_gate_channels) == (1.0, 2.0, 0, 0)


@pytest.mark.parametrize("overrides, message", [
    ({"bigram_embed": -1}, "model.bigram_embed=-1 must be >= 0"),
    ({"logit_softcap": -3.0}, "model.logit_softcap=-3.0 must be >= 0"),
    ({"activation": "relu3"}, "model.activation='relu3' is not one of: relu, relu2,"),
    ({"value_embed_every": 0}, "model.value_embed_every=0 must be at least 1"),
    ({"ve_gate_channels": 129}, "model.ve_gate_channels=129 must be in [0, model.n_embd]"),
    ({"qk_scale": 0.0}, "model.qk_scale=0.0 must be positive"),
])
def test_bad_values_are_one_line_user_errors_naming_the_key(overrides, message):
    with pytest.raises(UserError) as err:
        tiny_config(**overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_relu2_is_relu_squared():
    torch.manual_seed(0)
    mlp = MLP(tiny_config(n_embd=16, activation="relu2"))
    x = torch.randn(2, 5, 16)
    want = mlp.c_proj(torch.relu(mlp.c_fc(x)) ** 2)
    torch.testing.assert_close(mlp(x), want, atol=0, rtol=0)
    assert mlp.hidden == 64  # 4 x 16, not swiglu's 2/3


@pytest.mark.parametrize("n_kv_head", [None, 2])
@pytest.mark.parametrize("scale, gain", [(1.0, True), (1.2, False)])
def test_qk_norm_is_explicit_rms_normalisation_of_each_head(n_kv_head, scale, gain):
    cfg = shrunk_config("modern", qk_norm=True, n_kv_head=n_kv_head, qk_scale=scale, norm_gain=gain)
    torch.manual_seed(0)
    attn = _randomise(CausalSelfAttention(cfg, 0), 1)
    x = torch.randn(2, 7, cfg.n_embd)
    rope = RotaryEmbedding(cfg.head_dim, cfg.block_size)(torch.arange(7))
    H, H_kv, D = cfg.n_head, cfg.kv_heads, cfg.head_dim
    q, k, v = attn.c_attn(x).split([H * D, H_kv * D, H_kv * D], dim=2)
    q, k, v = (t.view(2, 7, -1, D).transpose(1, 2) for t in (q, k, v))

    def rms(t, gain):  # written out: t / sqrt(mean(t²) + eps) * gain, over each head's D channels
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * gain

    q_gain, k_gain = (attn.q_norm.weight, attn.k_norm.weight) if gain else (1.0, 1.0)
    q, k = rms(q, q_gain) * scale, rms(k, k_gain) * scale
    y, _ = math_attention(apply_rope(q, *rope), apply_rope(k, *rope), v, None, True)
    want = attn.c_proj(y.transpose(1, 2).reshape(2, 7, cfg.n_embd))
    torch.testing.assert_close(attn(x, rope=rope), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gate_max, channels", [(2.0, 0), (3.0, 12)])
def test_value_embeds_add_the_gated_table_row_to_the_values(gate_max, channels):
    cfg = shrunk_config("modern", value_embeds=True, n_kv_head=2, ve_gate_max=gate_max,
                        ve_gate_channels=channels)
    torch.manual_seed(0)
    attn = _randomise(CausalSelfAttention(cfg, 0), 2)
    x = torch.randn(2, 6, cfg.n_embd)
    ve = torch.randn(2, 6, cfg.kv_heads * cfg.head_dim)
    H, H_kv, D = cfg.n_head, cfg.kv_heads, cfg.head_dim
    q, k, v = attn.c_attn(x).split([H * D, H_kv * D, H_kv * D], dim=2)
    read = x[..., :channels] if channels else x  # the gate reads the first `channels` channels (0: all)
    gate = gate_max * torch.sigmoid(read @ attn.ve_gate.weight.T)  # (B, T, H_kv)
    v = v.view(2, 6, H_kv, D) + gate.unsqueeze(-1) * ve.view(2, 6, H_kv, D)
    q, k, v = (t.reshape(2, 6, -1, D).transpose(1, 2) for t in (q, k, v))
    y, _ = math_attention(q, k, v, None, True)
    want = attn.c_proj(y.transpose(1, 2).reshape(2, 6, cfg.n_embd))
    torch.testing.assert_close(attn(x, value_embed=ve), want, atol=1e-5, rtol=1e-5)


def test_value_embeds_have_one_table_per_layer_and_their_gates_start_at_one():
    model = build_model(shrunk_config("modern", value_embeds=True))
    assert len(model.transformer.ve) == model.config.n_layer
    assert model.transformer.ve["0"].weight.shape == (VOCAB, model.config.kv_heads * model.config.head_dim)
    for block in model.transformer.h:
        assert (block.attn.ve_gate.weight == 0).all()  # 2·sigmoid(0) = 1


@pytest.mark.parametrize("channels", [0, 24])
def test_smear_adds_the_gated_previous_embedding_and_leaves_position_0_alone(channels):
    model = _model(smear=True, smear_gate_channels=channels)
    idx = _tokens(T=9)
    x = model.transformer.wte(idx)  # (B, T, C)
    smear = model.transformer.smear
    gate = torch.sigmoid((x[..., :channels] if channels else x) @ smear.gate.weight.T)  # (B, T, 1)
    want = x.clone()
    want[:, 1:] = x[:, 1:] + smear.lam * gate[:, 1:] * x[:, :-1]
    got = model.embed_tokens(idx, None, torch.arange(9))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_bigram_embed_adds_the_hashed_pair_row():
    model = _model(bigram_embed=37)
    idx = _tokens(T=9)
    table = model.transformer.bigram.table.weight
    want = model.transformer.wte(idx).clone()
    for b in range(2):
        for t in range(1, 9):
            want[b, t] += table[(int(idx[b, t - 1]) * HASH_MULTIPLIER + int(idx[b, t])) % 37]
    got = model.embed_tokens(idx, None, torch.arange(9))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_the_previous_token_comes_from_the_cache_at_a_step_boundary():
    model = _model(smear=True, bigram_embed=37)
    idx = _tokens(T=9)
    whole = model.embed_tokens(idx, None, torch.arange(9))
    second = model.embed_tokens(idx[:, 5:], idx[:, 4], torch.arange(5, 9))
    torch.testing.assert_close(second, whole[:, 5:], atol=0, rtol=0)


def test_soft_capped_logits_are_cap_times_tanh_of_the_raw_ones():
    capped = _model(logit_softcap=2.0)
    raw = build_model(shrunk_config("modern")).eval()
    raw.load_state_dict(capped.state_dict())
    idx = _tokens()
    want = 2.0 * torch.tanh(raw(idx)[0] / 2.0)
    torch.testing.assert_close(capped(idx)[0], want, atol=1e-6, rtol=1e-6)
    assert capped(idx)[0].abs().max() < 2.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_loss_with_a_soft_cap_equals_cross_entropy_of_capped_logits(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(40, 16, generator=g) * 2).requires_grad_()
    w = (torch.randn(VOCAB, 16, generator=g)).requires_grad_()
    targets = torch.randint(0, VOCAB, (40,), generator=g)
    targets[3] = -1
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        fused = linear_cross_entropy(x, w, targets, chunk_rows=16, softcap=3.0)
    fused.backward()
    got = (fused.detach(), x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        logits = (x @ w.T).float()
    ref = F.cross_entropy(3.0 * torch.tanh(logits / 3.0), targets, ignore_index=-1)
    ref.backward()
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for a, b in zip(got, (ref.detach(), x.grad, w.grad), strict=True):
        torch.testing.assert_close(a, b, **tol)


def test_zero_init_proj_starts_every_block_as_the_identity():
    model = build_model(shrunk_config("modern", zero_init_proj=True))
    assert all((b.attn.c_proj.weight == 0).all() and (b.mlp.c_proj.weight == 0).all()
               for b in model.transformer.h)
    x = torch.randn(2, 5, model.config.n_embd)
    for block in model.transformer.h:
        torch.testing.assert_close(block(x), x, atol=0, rtol=0)
    plain = build_model(shrunk_config("modern"))
    assert plain.transformer.h[0].attn.c_proj.weight.std() > 0


@pytest.mark.parametrize("name", [*SWITCHES, "all"])
def test_math_sdpa_and_online_agree_with_the_switch_on(name):
    overrides = ALL_ON if name == "all" else SWITCHES[name]
    models = [_model(attention=b, online_block_size=5, **overrides).train()
              for b in ("math", "sdpa", "online")]
    assert_backends_agree(models, _tokens())


@pytest.mark.parametrize("name", [*SWITCHES, "all"])
def test_changing_later_tokens_leaves_earlier_logits_unchanged(name):
    model = _model(**(ALL_ON if name == "all" else SWITCHES[name]))
    idx = _tokens()
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    torch.testing.assert_close(model(idx)[0][:, :6], model(changed)[0][:, :6], atol=0, rtol=0)
    assert not torch.allclose(model(idx)[0][:, 6:], model(changed)[0][:, 6:])


def _generate(model, prompts, n, use_cache, seed=0):
    return generate(model, prompts, max_new_tokens=n, params=SamplingParams(1.0, top_k=20),
                    use_cache=use_cache, generator=torch.Generator().manual_seed(seed), keep_logits=True)


@pytest.mark.parametrize("name", [*SWITCHES, "all"])
def test_cached_decoding_equals_uncached_with_the_switch_on(name):
    """Batched prompts of different lengths (left padding) and past the context (re-prefill)."""
    model = _model(seed=3, **(ALL_ON if name == "all" else SWITCHES[name]))
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [7]]
    cached, naive = _generate(model, prompts, 30, True), _generate(model, prompts, 30, False)
    assert cached.tokens == naive.tokens
    for a, b in zip(cached.logits, naive.logits, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)


def test_the_embedding_tables_are_not_counted_as_compute():
    plain = build_model(shrunk_config("modern"))
    tables = build_model(shrunk_config("modern", value_embeds=True, bigram_embed=37))
    gates = sum(b.attn.ve_gate.weight.numel() for b in tables.transformer.h)
    assert tables.num_params(non_embedding=True) == plain.num_params(non_embedding=True) + gates
    extra = sum(t.weight.numel() for t in tables.transformer.ve.values()) + 37 * plain.config.n_embd
    assert tables.num_params(non_embedding=False) == plain.num_params(non_embedding=False) + gates + extra


@pytest.mark.parametrize("name", [n for n in SWITCHES if n not in ("zero_init_proj", "relu2")])
@pytest.mark.parametrize("preset", ["gpt2", "demo"])  # the GPT-2 and the Llama family
def test_every_export_refuses_every_switch_its_family_lacks(name, preset):
    if (name, preset) == ("qk_norm", "demo"):  # Qwen3's block: the Llama block with QK-norm
        assert architecture_of(shrunk_config(preset, **SWITCHES[name])) == "qwen3"
        return
    with pytest.raises(UserError, match=f"model.{next(iter(SWITCHES[name]))}"):
        architecture_of(shrunk_config(preset, **SWITCHES[name]))
    assert architecture_of(shrunk_config(preset, zero_init_proj=True)) in ("gpt2", "llama")  # only the init


def test_gpt2_export_refuses_a_switch_it_lacks():
    with pytest.raises(UserError, match="model.qk_norm=true with model.pos_encoding=learned has no Hugging "
                                        "Face equivalent"):
        hf_config_from_model(shrunk_config("gpt2", qk_norm=True))


def test_relu2_is_arcees_block_with_rotary_positions_and_none_with_learned_ones():
    assert architecture_of(shrunk_config("demo", activation="relu2")) == "arcee"
    with pytest.raises(UserError, match="model.activation=relu2 with model.pos_encoding=learned has no"):
        architecture_of(shrunk_config("gpt2", activation="relu2"))


def test_a_softcap_bounds_the_loss_of_a_confident_wrong_guess():
    # with logits in (-c, c) no token's probability can fall below e^-2c / V: the loss is at most 2c + ln V
    model = _model(logit_softcap=2.0)
    idx = _tokens()
    _, loss = model(idx, idx)
    assert loss.item() < 4.0 + math.log(VOCAB)
