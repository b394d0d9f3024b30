"""The shape walk against shapes observed independently, by hooks on every module."""

from __future__ import annotations

import torch
from model_helpers import tiny_config

from minigpt.lab.shape_walk import format_walk, walk_shapes
from minigpt.model.factory import build_model

B, T = 3, 6


def _model(**kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=8, vocab_size=37)
    return build_model(tiny_config(**(cfg | kw)))


def test_shape_walk_rows_are_the_observed_shapes_in_call_order() -> None:
    model = _model(pos_encoding="rope", n_kv_head=2)
    seen: list[tuple[str, tuple[int, ...]]] = []
    started: list[str] = []
    names = {m: n for n, m in model.named_modules() if n}
    hooks = [m.register_forward_pre_hook(lambda m, i: started.append(names[m])) for m in names]
    hooks += [m.register_forward_hook(lambda m, i, o: seen.append((names[m], o))) for m in names]
    with torch.no_grad():
        model(torch.zeros(B, T, dtype=torch.long))
    for h in hooks:
        h.remove()
    walk = walk_shapes(model, batch_size=B, seq_len=T)
    modules = [s for s in walk.stages if s.kind not in ("line", "input", "output")]
    assert [s.name for s in modules] == started  # data-flow (call) order
    observed = {n: [tuple(t.shape) for t in (o if isinstance(o, tuple) else (o,))] for n, o in seen}
    for s in modules:
        assert s.shapes == observed[s.name], s.name
    lines = {s.name.split("  ", 1)[1]: s.shapes for s in walk.stages if s.kind == "line"}
    H, D, C = 4, 8, 32
    scores = next(v for k, v in lines.items() if k.startswith("scores = (q @ k"))
    assert scores == [(B, H, T, T)] * 2 or scores == [(B, H, T, T)]
    assert next(v for k, v in lines.items() if k.startswith("return weights @ v")) == [(B, H, T, D)]
    assert next(v for k, v in lines.items() if k.startswith("y = y.transpose(1, 2)")) == [(B, T, C)]
    assert not any(a.record_probs for a in (blk.attn for blk in model.transformer.h))  # restored
    assert "(B, H, T, T)" in format_walk(walk)


def test_shape_walk_flops_match_the_matmul_count() -> None:
    model = _model()
    walk = walk_shapes(model, batch_size=B, seq_len=T)
    C, F_, V, L, H, D = 32, 128, 37, 2, 4, 8
    linear = C * 3 * C + C * C + C * F_ + F_ * C  # weights of one block's four Linears
    expected = 2 * B * T * (L * linear + C * V) + L * 2 * (2 * B * H * T * T * D)  # + q·kᵀ and p·v
    assert walk.forward_flops == expected
