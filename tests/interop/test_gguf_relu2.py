"""ReLU² in GGUF (llama.cpp's `arcee` graph): a trained model with model.activation=relu2, read back from its
f32, f16, bf16 and q8_0 files with gguf's own dequantisation into minigpt's block, computes the f32 model's
activations and logits within each type's precision; the largest activation entering the down projection,
which llama.cpp rounds to float16 in front of a float16 weight, stays finite there."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from interop_helpers import SHAPES, small_bpe, stdlib_texts
from model_helpers import fit

from minigpt.interop.gguf_export import export_gguf
from minigpt.model.factory import build_model
from minigpt.model.gpt import GPT

F16_MAX = torch.finfo(torch.float16).max  # 65,504
# gguf_type -> (largest relative change of any layer's largest activation, largest |logit change| in logit
# stds), about three times what this model shows: float16 keeps 11 significant bits, bfloat16 8, q8_0 8 per
# block of 32 (int8 times the block's scale)
TOLERANCE = {"f32": (0.0, 0.0), "f16": (1e-3, 4e-3), "bf16": (5e-3, 3e-2), "q8_0": (1.5e-2, 8e-2)}


@pytest.fixture(scope="module")
def trained() -> tuple[GPT, torch.Tensor]:
    """The arcee shape trained for 40 steps on standard-library source (seeded), and 4 windows to score."""
    tok = small_bpe()
    torch.manual_seed(0)
    model = build_model(SHAPES["arcee"], tok.vocab_size)
    ids = torch.tensor(tok.encode("\n".join(stdlib_texts()))[:20_000])
    T, g = 64, torch.Generator().manual_seed(0)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(ids) - T - 1, (4,), generator=g)
        windows = torch.stack([ids[s:s + T + 1] for s in starts])  # (4, T + 1)
        return windows[:, :-1], windows[:, 1:]

    fit(model, batch, steps=40, lr=1e-2)
    return model.eval(), ids[-4 * T:].view(4, T)


def _model_from_gguf(path: Path, like: GPT) -> GPT:
    """A minigpt model with the file's tensors, dequantised by gguf, put back under minigpt's names: the q
    and k rows back from adjacent pairs (2i, 2i+1) to halves (i, D/2 + i), then q | k | v stacked."""
    t = {x.name: torch.from_numpy(gguf.quants.dequantize(x.data, x.tensor_type).copy())
         for x in gguf.GGUFReader(path).tensors}
    cfg = like.config

    def halves(rows: torch.Tensor, heads: int) -> torch.Tensor:
        D = rows.shape[0] // heads
        return rows.view(heads, D // 2, 2, -1).transpose(1, 2).reshape(rows.shape)  # (heads, 2, D/2, C)

    sd = {"transformer.wte.weight": t["token_embd.weight"],
          "transformer.ln_f.weight": t["output_norm.weight"], "lm_head.weight": t["output.weight"]}
    for i in range(cfg.n_layer):
        b, p = f"blk.{i}.", f"transformer.h.{i}."
        qkv = [halves(t[b + "attn_q.weight"], cfg.n_head), halves(t[b + "attn_k.weight"], cfg.kv_heads),
               t[b + "attn_v.weight"]]
        sd |= {p + "ln_1.weight": t[b + "attn_norm.weight"], p + "ln_2.weight": t[b + "ffn_norm.weight"],
               p + "attn.c_attn.weight": torch.cat(qkv),
               p + "attn.c_proj.weight": t[b + "attn_output.weight"],
               p + "mlp.c_fc.weight": t[b + "ffn_up.weight"],
               p + "mlp.c_proj.weight": t[b + "ffn_down.weight"]}
    model = build_model(cfg, cfg.vocab_size).eval()
    model.load_state_dict(sd)
    return model


def _run(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits, each layer's activations entering the down projection, relu(up x)²)."""
    seen: list[torch.Tensor] = []
    hooks = [block.mlp.c_proj.register_forward_hook(lambda m, args, out: seen.append(args[0]))
             for block in model.transformer.h]
    try:
        with torch.no_grad():
            logits = model(idx)[0]
    finally:
        for hook in hooks:
            hook.remove()
    return logits, seen


@pytest.mark.parametrize("gguf_type", list(TOLERANCE))
def test_each_type_keeps_the_relu2_activations_and_logits(trained, tmp_path: Path, gguf_type: str) -> None:
    model, idx = trained
    logits, acts = _run(model, idx)
    assert max(a.max().item() for a in acts) > 1.0  # trained: the squares are no longer all tiny
    path = export_gguf(model, small_bpe(), tmp_path / f"{gguf_type}.gguf", gguf_type, "t")
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == "arcee"
    theirs, their_acts = _run(_model_from_gguf(path, model), idx)
    act_tol, logit_tol = TOLERANCE[gguf_type]
    for ours, got in zip(acts, their_acts, strict=True):
        assert abs(got.max().item() / ours.max().item() - 1) <= act_tol, gguf_type
        assert got.max().item() < F16_MAX and torch.isfinite(got.half()).all()  # llama.cpp's f16 inputs
    assert (theirs - logits).abs().max().item() <= logit_tol * logits.std().item(), gguf_type
