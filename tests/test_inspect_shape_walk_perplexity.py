"""The shape walk against shapes observed independently, and perplexity against exp(mean loss)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from minigpt.data.tokenizers import ByteTokenizer
from minigpt.device.config import InferenceDeviceConfig
from minigpt.inspect.config import EvaluateConfig
from minigpt.inspect.perplexity import document_tokens, evaluate, sliding_window_loss
from minigpt.inspect.shape_walk import format_walk, walk_shapes
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model

B, T = 3, 6


def _model(**kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=8, vocab_size=37)
    return build_model(ModelConfig(**(cfg | kw)))


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


def test_perplexity_is_exp_of_the_mean_loss_on_a_short_text() -> None:
    model = _model(block_size=64, vocab_size=257).eval()
    tok = ByteTokenizer()
    text = "def f(x):\n    return x + 1\n"
    tokens = document_tokens([text], tok)
    assert tokens.tolist() == [tok.eot_id, *text.encode()]
    with torch.no_grad():  # independent: one plain forward over the whole (short) text
        logits, _ = model(tokens[None, :-1])
        losses = F.cross_entropy(logits[0], tokens[1:], reduction="none")
    result = sliding_window_loss(model, tokens, batch_size=2)
    assert result.tokens == len(text)
    assert math.isclose(result.perplexity, math.exp(losses.mean().item()), rel_tol=1e-5)


def test_sliding_window_scores_each_token_once_with_its_context() -> None:
    model = _model(block_size=8).eval()
    tokens = torch.randint(0, 37, (41,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # stride 1: every target sees min(8, j) tokens before it
        logits = [model(tokens[None, max(0, j - 8) : j])[0][0, -1] for j in range(1, 41)]  # (V,) each
        naive = [F.cross_entropy(lg, tokens[j]) for j, lg in enumerate(logits, start=1)]
    result = sliding_window_loss(model, tokens, stride=1, batch_size=4)
    assert result.tokens == 40
    assert math.isclose(result.loss, torch.stack(naive).mean().item(), rel_tol=1e-5)
    disjoint = sliding_window_loss(model, tokens, stride=8, batch_size=3)
    assert disjoint.tokens == 40 and abs(disjoint.loss - result.loss) < 0.5


def test_evaluate_a_text_file_from_a_checkpoint(tmp_path: Path) -> None:
    from minigpt.checkpoint.format import save_checkpoint

    model, tok = _model(block_size=16, vocab_size=257), ByteTokenizer()
    save_checkpoint(tmp_path / "ckpt", model, {}, {"model_config": vars(model.config)}, tok)
    (tmp_path / "t.txt").write_text("hello world\n" * 5)
    ckpt, text = str(tmp_path / "ckpt"), str(tmp_path / "t.txt")
    cfg = EvaluateConfig(checkpoint=ckpt, text_file=text, device=InferenceDeviceConfig("cpu"), stride=4)
    result, what = evaluate(cfg)
    expected = sliding_window_loss(model, document_tokens(["hello world\n" * 5], tok), stride=4)
    assert what.endswith("t.txt") and result.tokens == 60
    assert math.isclose(result.loss, expected.loss, rel_tol=1e-6)
