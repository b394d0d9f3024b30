"""The design's "without X it breaks" claims, each shown on a small model against the baseline.

Every test compares an ablated model with the unablated one (or with an explicit formula), never with the
code's own earlier output; the measured numbers are printed (`pytest -s`) and quoted in docs/design.md.
"""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import LAG, VOCAB, WALK_T, WALK_V, fit, mute, shrunk_config, tiny_config, walk, walk_batch

from minigpt.model.attention import CausalSelfAttention, math_attention
from minigpt.model.block import Block
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

pytestmark = pytest.mark.slow  # each test trains small models for a few seconds

# ---------------------------------------------------------------------------------------- a learnable process

STEP_ENTROPY = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # 0.56 nats: the best a causal model can do


def train_on_walks(steps: int = 150, **overrides) -> tuple[torch.nn.Module, float]:
    """A 2-layer, 4-head model with rotary positions trained on fresh walks; returns (model in eval mode,
    last training loss). Rotary positions make "look one token back/ahead" one pattern for all positions."""
    torch.manual_seed(0)
    sizes = {"n_layer": 2, "n_head": 4, "n_embd": 32, "block_size": WALK_T, "vocab_size": WALK_V}
    model = build_model(tiny_config(**{**sizes, "pos_encoding": "rope", **overrides}))
    loss = fit(model, lambda step: walk_batch(16, seed=1000 + step), steps)
    return model.eval(), loss


def eval_loss(model: torch.nn.Module, seq: torch.Tensor) -> float:
    with torch.no_grad():
        return model(seq[:, :-1], seq[:, 1:])[1].item()


def greedy_follows_the_walk(model: torch.nn.Module, seq: torch.Tensor) -> float:
    """The fraction of greedily generated tokens that take the walk's most likely step (+1)."""
    prompts = seq[:, :8].tolist()
    out = generate(model, prompts, max_new_tokens=16, params=SamplingParams(temperature=0.0),
                   generator=torch.Generator().manual_seed(0)).tokens
    steps = [((p + o)[i] - (p + o)[i - LAG]) % WALK_V for p, o in zip(prompts, out, strict=True)
             for i in range(len(p), len(p) + len(o))]
    return sum(s == 1 for s in steps) / len(steps)


@pytest.fixture(scope="module")
def walk_models() -> dict[str, tuple[torch.nn.Module, float]]:
    """The baseline and two ablations, trained on the same walks for the same 150 steps."""
    return {"baseline": train_on_walks(), "no_causal_mask": train_on_walks(causal=False),
            "no_residual": train_on_walks(residual=False)}


# ---------------------------------------------------------------------------------------- the causal mask


def test_without_the_causal_mask_training_loss_collapses_and_causal_use_fails(walk_models):
    (causal, causal_train), (copier, copier_train) = walk_models["baseline"], walk_models["no_causal_mask"]
    val, uniform = walk(64, seed=7), math.log(WALK_V)
    causal_val, copier_val = eval_loss(causal, val), eval_loss(copier, val)
    causal_greedy = greedy_follows_the_walk(causal, val[:16])
    copier_greedy = greedy_follows_the_walk(copier, val[:16])
    print(f"\ntrain loss: causal {causal_train:.3f}, no mask {copier_train:.3f} "
          f"(step entropy {STEP_ENTROPY:.3f}); causal val loss: {causal_val:.3f} vs {copier_val:.3f} "
          f"(uniform {uniform:.3f}); greedy +1 steps: {causal_greedy:.2f} vs {copier_greedy:.2f}")
    assert causal_train > 0.9 * STEP_ENTROPY  # the causal model cannot beat the walk's entropy ...
    assert copier_train < 0.25 * causal_train  # ... the one that sees the next token copies it
    assert causal_val < 0.5 * uniform  # the causal model learned the walk
    assert copier_val > 2.5 * causal_val  # used causally, the copier is worse than guessing
    assert causal_greedy > 0.75 and copier_greedy < 0.5 * causal_greedy


# ---------------------------------------------------------------------------------------- the 1/sqrt(d) scale


def test_without_the_scale_the_softmax_saturates_and_its_gradient_vanishes():
    """Unit-variance q and k at head size 64: q·k has variance 64. Causal rows of up to 8 keys (the first
    query, with one key, is one-hot either way and left out). The scale is the attention module's own
    (None: 1/√D; attn_scale=none: 1.0)."""
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 128, 8, 8, 64
    q, k, v, upstream = (torch.randn(B, H, T, D, generator=g) for _ in range(4))
    measured = {}
    for attn_scale in ("sqrt", "none"):
        cfg = tiny_config(n_layer=1, n_head=1, n_embd=D, vocab_size=VOCAB, attn_scale=attn_scale)
        scale = CausalSelfAttention(cfg, 0).scale
        qq = q.clone().requires_grad_()
        y, p = math_attention(qq, k, v, None, True, scale=scale)
        (y * upstream).sum().backward()
        # the gradient through the softmax, written out: dL/ds_i = p_i (dL/dp_i - sum_j p_j dL/dp_j)
        dl_dp = upstream @ v.transpose(-2, -1)  # (B, H, T, T)
        dl_ds = p * (dl_dp - (p * dl_dp).sum(-1, keepdim=True))
        s = 1 / math.sqrt(D) if scale is None else scale
        torch.testing.assert_close(qq.grad, s * dl_ds @ k, atol=1e-4, rtol=1e-4)  # the formula is autograd's
        row = dl_ds[:, :, 1:].norm(dim=-1).flatten()  # (B·H·(T-1),) one gradient norm per query row
        measured[attn_scale] = (p[:, :, 1:].amax(-1).mean().item(), row.median().item(), row.mean().item())
    (top_s, med_s, mean_s), (top_n, med_n, mean_n) = measured["sqrt"], measured["none"]
    print(f"\nmean top probability: scaled {top_s:.2f}, unscaled {top_n:.2f}; gradient through the "
          f"softmax per row: median {med_s:.3f} vs {med_n:.3f} ({med_s / med_n:.0f}x), "
          f"mean {mean_s:.3f} vs {mean_n:.3f} ({mean_s / mean_n:.1f}x)")
    assert top_n > 0.85 and top_s < 0.6  # unscaled rows are near one-hot
    assert med_s > 10 * med_n  # the typical row's gradient: more than an order of magnitude smaller
    assert mean_s > 2 * mean_n  # on average less so: rows whose top two scores nearly tie keep theirs


# ---------------------------------------------------------------------------------------- positions


def first_layer_weight_grads(pos_encoding: str, seed: int = 0, T: int = 16) -> tuple[list[float],
                                                                                   torch.Tensor]:
    """The `seed` preset (post-norm: its first attention reads embedding + PE raw), one repeated token, one
    target at a time: for each position t, ||dL_t/dW|| of the first c_attn weight for the model's own loss
    at t alone. Also what that c_attn read, (T, C), captured in the same forward passes."""
    torch.manual_seed(seed)
    model = build_model(shrunk_config("seed", pos_encoding=pos_encoding, block_size=T, dropout=0.0))
    c_attn = model.transformer.h[0].attn.c_attn
    read = []
    c_attn.register_forward_pre_hook(lambda m, args: read.append(args[0][0].detach()))
    idx = torch.full((1, T), 3)
    labels = torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(seed))
    grads = []
    for t in range(T):
        targets = torch.full((1, T), -1)  # -1: ignored
        targets[0, t] = labels[t]
        model.zero_grad()
        model(idx, targets)[1].backward()
        grads.append(c_attn.weight.grad.norm().item())
    return grads, read[0]


def test_integer_positions_make_gradients_grow_with_position_and_sinusoidal_stay_bounded():
    """dL/dW = sum over tokens of (upstream error) ⊗ (what W reads), and with integer positions what the first
    layer reads is the embedding plus t in every channel. The upstream error differs from position to
    position, so the growth is not exactly linear. Margins: over seeds 0-9, g(15)/g(1) was 3.7-9.5 with
    integer positions; their smallest gradient 11-24x the largest sinusoidal one; sinusoidal max/min over
    positions 1-15 was 1.5-2.5."""
    integer, read = first_layer_weight_grads("integer")
    sinusoidal, _ = first_layer_weight_grads("sinusoidal")
    print(f"\n||dL_t/dW|| at positions 1, 8, 15: integer {[round(integer[t], 3) for t in (1, 8, 15)]}, "
          f"sinusoidal {[round(sinusoidal[t], 3) for t in (1, 8, 15)]}")
    t = torch.arange(16.0).unsqueeze(1)  # (T, 1)
    torch.testing.assert_close(read - read[0], t.expand_as(read))  # the raw index, added to every channel
    assert integer[15] > 2.5 * integer[1]  # the same one-target loss teaches harder late in the sequence ...
    assert min(integer[1:]) > 5 * max(sinusoidal[1:])  # ... and far harder than sinusoidal positions anywhere
    assert max(sinusoidal[1:]) < 3.5 * min(sinusoidal[1:])  # bounded: |sin|, |cos| <= 1 at every position


def test_pre_norm_layernorm_erases_integer_positions_but_rmsnorm_does_not():
    """LayerNorm subtracts each token's mean over channels: a position added to every channel is such a
    mean, so a pre-norm LayerNorm model with integer positions computes exactly what it would without."""
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    for norm, same in (("layernorm", True), ("rmsnorm", False)):
        integer = build_model(shrunk_config("tiny", norm=norm, pos_encoding="integer")).eval()
        none = build_model(shrunk_config("tiny", norm=norm, pos_encoding="none")).eval()
        none.load_state_dict(integer.state_dict())
        a, b = integer(idx)[0], none(idx)[0]
        assert torch.allclose(a, b, atol=1e-4) is same, norm


@pytest.mark.parametrize("pos_encoding, causal, equivariant", [
    ("none", False, True),  # order-blind: permuting the tokens permutes the outputs, nothing else
    ("learned", False, False),  # positions break the symmetry
    ("none", True, False),  # so does the causal mask (query t sees t + 1 keys)
])
def test_without_positions_or_mask_attention_is_blind_to_order(pos_encoding, causal, equivariant):
    model = build_model(shrunk_config("tiny", pos_encoding=pos_encoding, causal=causal)).train()  # dropout 0
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    out, out_perm = model(idx)[0], model(idx[:, perm])[0]
    assert torch.allclose(out_perm, out[:, perm], atol=1e-5) is equivariant


# ---------------------------------------------------------------------------------------- residual and norms


def _zero_sublayers(block: Block) -> Block:
    with torch.no_grad():
        for proj in (block.attn.c_proj, block.mlp.c_proj):  # W_O and the FFN's down projection
            proj.weight.zero_()
            proj.bias.zero_()
    return block.eval()


def test_a_pre_norm_block_with_nothing_to_add_is_the_identity_and_post_norm_renormalises():
    x = 5.0 * torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0)) + 3.0  # RMS ≈ 5.8
    rms = x.pow(2).mean(-1).sqrt()
    pre = _zero_sublayers(Block(shrunk_config("tiny"), 0))
    torch.testing.assert_close(pre(x), x, atol=0, rtol=0)  # the skip path carries x through unchanged
    post = _zero_sublayers(Block(shrunk_config("seed", dropout=0.0), 0))
    once = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(post(x), once, atol=1e-5, rtol=1e-5)  # Norm(Norm(x)) = Norm(x): magnitude gone
    out_rms = post(x).pow(2).mean(-1).sqrt()
    print(f"\ninput RMS {rms.mean():.2f}; pre-norm output {pre(x).pow(2).mean(-1).sqrt().mean():.2f}, "
          f"post-norm output {out_rms.mean():.2f}")
    torch.testing.assert_close(out_rms, torch.ones_like(out_rms), atol=1e-4, rtol=0)
    no_skip = _zero_sublayers(Block(shrunk_config("tiny", residual=False), 0))
    assert no_skip(x).abs().max() == 0  # without the skip path, nothing of x survives


def test_muted_heads_cost_a_measured_amount_and_the_residual_keeps_the_model_working(walk_models):
    (model, _), (no_skip, _) = walk_models["baseline"], walk_models["no_residual"]
    val, uniform = walk(64, seed=7), math.log(WALK_V)
    base, no_skip_val = eval_loss(model, val), eval_loss(no_skip, val)
    one = [eval_loss(mute(model, 0, [h]), val) - base for h in range(4)]
    last_layer = eval_loss(mute(model, 1, [0, 1, 2, 3]), val) - base
    print(f"\nval loss {base:.3f}; muting one head of layer 0 costs {[round(d, 3) for d in one]} nats; "
          f"muting all 4 heads of layer 1 costs {last_layer:.3f}; the model without residuals reaches "
          f"{no_skip_val:.3f} (uniform {uniform:.3f})")
    assert max(one) > 0.1  # the first layer's heads carry the token one back: muting one costs ...
    assert all(base + d < uniform for d in one)  # ... but the others and the skip path keep it working
    assert last_layer < 0.5  # a whole layer's attention muted: the skip path carries layer 0's work on
    assert no_skip_val > base + 0.2  # without residuals the same 150 steps learn less
    # and there, muting a layer's heads leaves W_O's bias alone on the stream: the output no longer
    # depends on the input at all
    logits = mute(no_skip, 1, [0, 1, 2, 3])(val[:4, :-1])[0]  # (4, T, V)
    torch.testing.assert_close(logits, logits[:1, :1].expand_as(logits), atol=1e-5, rtol=0)
