"""The switches on the residual stream and its norms, each against the forward pass written out by hand: norms
without a gain, the norm after the embedding, the per-layer scalars on the stream and the embedding, the
backout, and value embeddings on every other layer."""

from __future__ import annotations

import pytest
import torch
from model_helpers import VOCAB, shrunk_config

from minigpt.model.factory import build_model
from minigpt.model.norm import build_norm


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _model(seed: int = 0, **overrides) -> torch.nn.Module:
    """A 3-layer model with every parameter redrawn (the switches' zeros and ones would hide them)."""
    torch.manual_seed(seed)
    model = build_model(shrunk_config("modern", n_layer=3, **overrides))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            gain = 1.0 if p.dim() == 1 and p.numel() > 1 else 0.0  # norm gains and scales around 1
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + gain)
    return model.eval()


def _tokens(T: int = 9) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(5))


def _head(model, x: torch.Tensor) -> torch.Tensor:
    return model.lm_head(model.transformer.ln_f(x))


def _blocks(model, idx: torch.Tensor, x: torch.Tensor, before=None, after=None) -> torch.Tensor:
    """Run the blocks on x (B, T, C) as GPT.forward does without a cache, with hooks before and after each."""
    rope = model.transformer.rope(torch.arange(idx.shape[1]))
    for i, block in enumerate(model.transformer.h):
        x = before(i, x) if before else x
        x = block(x, rope=rope)
        x = after(i, x) if after else x
    return x


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_a_norm_without_gain_has_no_parameters_and_only_normalises(kind):
    norm = build_norm(kind, 16, 1e-5, bias=True, gain=False)
    assert list(norm.parameters()) == []
    x = torch.randn(3, 5, 16) * 4 + 1
    centred = x - x.mean(-1, keepdim=True) if kind == "layernorm" else x
    torch.testing.assert_close(norm(x), _rms(centred, 1e-5), atol=1e-5, rtol=1e-5)


def test_norm_gain_false_removes_every_gain():
    model = build_model(shrunk_config("modern", norm_gain=False, embed_norm=True, qk_norm=True))
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if "ln_" in n or "_norm" in n]  # the stream's norms and the heads' QK-norm


def test_embed_norm_normalises_the_token_rows_before_the_blocks():
    model = _model(embed_norm=True, norm_gain=False, smear=True)
    idx = _tokens()
    rows = _rms(model.transformer.wte(idx), model.config.norm_eps)  # (B, T, C)
    smear = model.transformer.smear
    want = rows.clone()  # the smear mixes the normalised rows
    want[:, 1:] = rows[:, 1:] + smear.lam * torch.sigmoid(rows[:, 1:] @ smear.gate.weight.T) * rows[:, :-1]
    torch.testing.assert_close(model.embed_tokens(idx, None, torch.arange(9)), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(idx)[0], _head(model, _blocks(model, idx, want)), atol=1e-5, rtol=1e-5)


def test_residual_scalars_mix_the_stream_and_the_embedding_before_every_block():
    model = _model(residual_scalars=True)
    idx = _tokens()
    a, b = model.transformer.scalars.resid, model.transformer.scalars.x0
    x0 = model.transformer.wte(idx)
    x = _blocks(model, idx, x0, before=lambda i, x: a[i] * x + b[i] * x0)
    torch.testing.assert_close(model(idx)[0], _head(model, x), atol=1e-5, rtol=1e-5)


def test_backout_subtracts_a_share_of_the_stream_after_the_middle_block():
    model = _model(backout=True)
    idx = _tokens()
    kept = {}
    x = _blocks(model, idx, model.transformer.wte(idx), after=lambda i, x: kept.setdefault(i, x))
    c = model.transformer.scalars.backout
    assert model.transformer.scalars.mid_layer == 1  # L // 2 of 3 layers: the stream after the second block
    torch.testing.assert_close(model(idx)[0], _head(model, x - c * kept[1]), atol=1e-5, rtol=1e-5)


def test_the_scalars_start_as_the_plain_model():
    torch.manual_seed(0)
    with_scalars = build_model(shrunk_config("modern", n_layer=3, residual_scalars=True, backout=True)).eval()
    torch.manual_seed(0)
    plain = build_model(shrunk_config("modern", n_layer=3)).eval()
    scalars = with_scalars.transformer.scalars
    assert scalars.resid.tolist() == [1.0] * 3 and scalars.x0.tolist() == [0.0] * 3 and scalars.backout == 0
    idx = _tokens()
    torch.testing.assert_close(with_scalars(idx)[0], plain(idx)[0], atol=0, rtol=0)


@pytest.mark.parametrize("n_layer, every, layers", [(4, 2, [1, 3]), (3, 2, [0, 2]), (5, 3, [1, 4]),
                                                    (3, 1, [0, 1, 2])])
def test_value_embeds_every_kth_layer_counted_back_from_the_last(n_layer, every, layers):
    model = build_model(shrunk_config("modern", n_layer=n_layer, value_embeds=True, value_embed_every=every))
    assert sorted(int(k) for k in model.transformer.ve) == layers
    assert [hasattr(b.attn, "ve_gate") for b in model.transformer.h] == [i in layers for i in range(n_layer)]


def test_only_the_layers_with_a_table_add_it_to_their_values():
    model = _model(value_embeds=True, value_embed_every=2)  # 3 layers: tables on 0 and 2
    idx = _tokens()
    rope = model.transformer.rope(torch.arange(idx.shape[1]))
    x = model.transformer.wte(idx)
    for i, block in enumerate(model.transformer.h):
        table = model.transformer.ve[str(i)](idx) if i in (0, 2) else None
        x = block(x, rope=rope, value_embed=table)
    torch.testing.assert_close(model(idx)[0], _head(model, x), atol=1e-5, rtol=1e-5)


def test_fan_in_init_draws_each_weight_at_its_scale():
    torch.manual_seed(0)
    model = build_model(shrunk_config("modern", n_embd=64, n_layer=2, init="fan_in", value_embeds=True,
                                      tie_weights=False, embed_norm=True, vocab_size=4001))
    params = dict(model.named_parameters())
    C = 64
    assert params["transformer.wte.weight"].std().item() == pytest.approx(0.8, rel=0.02)
    assert params["lm_head.weight"].std().item() == pytest.approx(0.001, rel=0.02)
    assert params["transformer.ve.0.weight"].std().item() == pytest.approx(C ** -0.5, rel=0.02)
    qkv = params["transformer.h.0.attn.c_attn.weight"]  # fan-in C
    assert qkv.std().item() == pytest.approx(C ** -0.5, rel=0.05) and qkv.abs().max() <= (3 / C) ** 0.5
    fc = params["transformer.h.0.mlp.c_fc.weight"]  # (hidden, C): fan-in C, at 0.4 of its std
    assert fc.std().item() == pytest.approx(0.4 * C ** -0.5, rel=0.05)
    assert fc.abs().max() <= 0.4 * (3 / C) ** 0.5
    for name in ("transformer.h.0.attn.c_proj.weight", "transformer.h.1.mlp.c_proj.weight"):
        assert (params[name] == 0).all()
    gpt2 = build_model(shrunk_config("modern", n_embd=64, n_layer=2))
    assert dict(gpt2.named_parameters())["transformer.h.0.mlp.c_fc.weight"].std().item() == pytest.approx(
        0.02, rel=0.05)


def test_fan_in_init_starts_the_switches_a_little_on():
    torch.manual_seed(0)
    model = build_model(shrunk_config("modern", n_layer=3, init="fan_in", tie_weights=False,
                                      value_embeds=True, residual_scalars=True, backout=True, smear=True))
    scalars = model.transformer.scalars
    torch.testing.assert_close(scalars.resid.detach(), torch.tensor([1.15, 1.10, 1.05]))  # 1.15 -> 1.05
    torch.testing.assert_close(scalars.x0.detach(), torch.tensor([0.20, 0.125, 0.05]))  # 0.20 -> 0.05
    assert scalars.backout.item() == pytest.approx(0.2) and model.transformer.smear.lam.item() == 0
    for gate in (model.transformer.smear.gate.weight, model.transformer.h[2].attn.ve_gate.weight):
        assert gate.min() >= 0 and gate.max() <= 0.02 and gate.std() > 0


def test_fan_in_init_refuses_tied_weights():
    from minigpt.errors import UserError

    with pytest.raises(UserError, match="model.init=fan_in starts the token table at std 1"):
        shrunk_config("modern", init="fan_in", tie_weights=True)
