"""Blocks and dropout: residual placement by hand, and exactly the configured dropout sites."""

from __future__ import annotations

import pytest
import torch
from model_helpers import VOCAB, shrunk_config, shrunk_model
from torch import nn

from minigpt.model.block import Block
from minigpt.model.factory import build_model


def _block_by_hand(block: Block, x: torch.Tensor, placement: str) -> torch.Tensor:
    """The two residual placements written out from the block's own submodules."""
    if placement == "pre":
        x = x + block.dropout_1(block.attn(block.ln_1(x)))
        return x + block.dropout_2(block.mlp(block.ln_2(x)))
    x = block.ln_1(x + block.dropout_1(block.attn(x)))
    return block.ln_2(x + block.dropout_2(block.mlp(x)))


@pytest.mark.parametrize("preset,placement", [("tiny", "pre"), ("seed", "post"), ("modern", "pre")])
def test_block_follows_its_residual_placement_formula_dropout_included(preset, placement):
    cfg = shrunk_config(preset, dropout=0.3)
    assert cfg.norm_placement == placement
    block = Block(cfg, layer_idx=0).train()
    x = torch.randn(2, 8, cfg.n_embd)
    torch.manual_seed(123)
    out = block(x)
    torch.manual_seed(123)  # the same dropout masks, drawn in the same order
    expected = _block_by_hand(block, x, placement)
    torch.testing.assert_close(out, expected)
    other = "post" if placement == "pre" else "pre"
    torch.manual_seed(123)
    assert not torch.allclose(out, _block_by_hand(block, x, other), atol=1e-3)


def test_post_norm_output_is_normalised_and_has_no_extra_final_norm():
    model = shrunk_model("seed")
    assert isinstance(model.transformer.ln_f, nn.Identity)
    x = torch.randn(2, 8, model.config.n_embd)
    ln = model.transformer.h[0].ln_2
    y = (model.transformer.h[0](x) - ln.bias) / ln.weight
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 8), atol=1e-5, rtol=0)
    assert isinstance(shrunk_model("tiny").transformer.ln_f, nn.LayerNorm)


def _record_dropouts(model: nn.Module):
    """Hooks on every nn.Dropout: name -> list of (input, output)."""
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Dropout):
            def hook(m, inp, out, name=name):
                seen.setdefault(name, []).append((inp[0].detach(), out.detach()))
            handles.append(mod.register_forward_hook(hook))
    return seen, handles


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_exactly_the_three_configured_dropout_sites_fire(backend):
    model = build_model(shrunk_config("tiny", dropout=0.5, attention=backend)).train()
    seen, _ = _record_dropouts(model)
    model(torch.randint(0, VOCAB, (2, 12)))
    fired = {name for name, calls in seen.items() if any(not torch.equal(i, o) for i, o in calls)}
    expected = {"transformer.drop"} | {f"transformer.h.{i}.dropout_{j}" for i in range(2) for j in (1, 2)}
    assert fired == expected
    # and attention-probability dropout is off by default
    assert all(block.attn.attn_drop.p == 0.0 for block in model.transformer.h)


def test_dropout_sites_sit_after_embedding_after_w_o_and_after_the_ffn():
    model = build_model(shrunk_config("tiny", dropout=0.5)).train()
    seen, _ = _record_dropouts(model)
    outputs = {}
    block = model.transformer.h[0]
    block.attn.c_proj.register_forward_hook(lambda m, i, o: outputs.__setitem__("w_o", o.detach()))
    block.mlp.c_proj.register_forward_hook(lambda m, i, o: outputs.__setitem__("down", o.detach()))
    idx = torch.randint(0, VOCAB, (2, 12))
    model(idx)
    wte, wpe = model.transformer.wte, model.transformer.wpe
    torch.testing.assert_close(seen["transformer.drop"][0][0], wte(idx) + wpe(torch.arange(12)))
    torch.testing.assert_close(seen["transformer.h.0.dropout_1"][0][0], outputs["w_o"])
    torch.testing.assert_close(seen["transformer.h.0.dropout_2"][0][0], outputs["down"])


def test_attention_probability_dropout_fires_when_asked():
    model = build_model(shrunk_config("tiny", attn_dropout=0.5, attention="math")).train()
    seen, _ = _record_dropouts(model)
    model(torch.randint(0, VOCAB, (2, 12)))
    inp, out = seen["transformer.h.0.attn.attn_drop"][0]
    assert inp.shape == (2, 4, 12, 12) and not torch.equal(inp, out)


def test_inverted_dropout_keeps_the_mean_and_eval_is_deterministic():
    p = 0.25
    model = build_model(shrunk_config("tiny", dropout=p))
    idx = torch.randint(0, VOCAB, (2, 12))
    seen, _ = _record_dropouts(model)
    model.train()
    for _ in range(60):
        model(idx)
    x = seen["transformer.drop"][0][0]  # the embedding, identical every call
    outs = torch.stack([o for _, o in seen["transformer.drop"]])  # (N, B, T, C)
    # each element is either dropped or scaled by 1/(1-p)
    kept = outs != 0
    torch.testing.assert_close(outs[kept], (x.expand_as(outs) / (1 - p))[kept])
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    # so the train-mode average matches the eval-mode value (relative error of the mean ~ 1/√N)
    ratio = (outs.mean(0) / x).mean().item()
    assert abs(ratio - 1) < 0.02
    model.eval()
    a, b = model(idx)[0], model(idx)[0]
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    no_dropout = build_model(shrunk_config("tiny", dropout=0.0)).eval()
    no_dropout.load_state_dict(model.state_dict())
    torch.testing.assert_close(no_dropout(idx)[0], a, atol=0, rtol=0)
