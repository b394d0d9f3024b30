"""The parity check (lab/reference_parity.py): the name mapping against tensors written out, and, where a
checkout of the reference is named (MINIGPT_REFERENCE_PATH), minigpt's recipe presets against the reference
itself: the same logits from the same weights and the same update, parameter by parameter."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from minigpt.data.prepare import prepare_dataset
from minigpt.lab.config import ReferenceRecipe, SideBySideConfig
from minigpt.lab.reference_parity import fit, parity, reference_views
from minigpt.lab.side_by_side import import_reference

REFERENCE = os.environ.get("MINIGPT_REFERENCE_PATH")


def test_reference_views_stack_q_k_v_and_rename_the_scalars_and_tables():
    g = torch.Generator().manual_seed(0)
    q, k, v, table = (torch.randn(s, generator=g) for s in ((8, 8), (4, 8), (4, 8), (70, 4)))
    views = reference_views({"transformer.h.0.attn.c_q.weight": q, "transformer.h.0.attn.c_k.weight": k,
                             "transformer.h.0.attn.c_v.weight": v, "value_embeds.1.weight": table,
                             "resid_lambdas": torch.ones(2), "smear_lambda": torch.zeros(1)})
    assert set(views) == {"transformer.h.0.attn.c_attn.weight", "transformer.ve.1.weight",
                          "transformer.scalars.resid", "transformer.smear.lam"}
    qkv = views["transformer.h.0.attn.c_attn.weight"]
    assert torch.equal(qkv[:8], q) and torch.equal(qkv[8:12], k) and torch.equal(qkv[12:], v)
    assert torch.equal(fit(table, torch.empty(64, 4)), table[:64])  # the padded vocabulary rows cut
    assert fit(torch.zeros(1), torch.empty(())).shape == ()


@pytest.mark.skipif(not REFERENCE, reason="MINIGPT_REFERENCE_PATH names no checkout of the reference")
def test_the_recipe_presets_compute_what_the_reference_computes(make_train_cfg):
    # the reference scales its AdamW lrs by (n_embd / 768)^-0.5: written out here for a 32-wide model
    scale = (32 / 768) ** -0.5
    lrs = {"head": 0.008 * scale, "tables": 0.3 * scale, "value_tables": 0.15 * scale}
    minigpt = make_train_cfg("model=recipe", "optim=recipe", "model.n_layer=2", "model.n_head=2",
                             "model.n_kv_head=2", "model.n_embd=32", "model.block_size=32",
                             "trainer.max_steps=100", "trainer.eval_tokens=all", "optim.warmup_steps=40",
                             "optim.weight_decay=0.28",  # the reference's (the default's is 0.8)
                             *(f"optim.groups.{k}.lr={v}" for k, v in lrs.items()))
    cfg = SideBySideConfig(reference_path=REFERENCE, minigpt=minigpt, seeds=[5], parity_steps=4,
                           reference=ReferenceRecipe(n_layer=2, n_head=2, n_kv_head=2, n_embd=32))
    try:
        gpt = import_reference(REFERENCE)
        report = parity(gpt, cfg, prepare_dataset(minigpt.data, minigpt.tokenizer, progress=False), 5, 4)
    finally:
        for name in [m for m in sys.modules if m == "nanochat" or m.startswith("nanochat.")]:
            del sys.modules[name]
    assert report["logits_max_abs_difference"] < 1e-5 * max(report["logits_max_abs"], 1.0)
    # the residual scalars' first gradients are rounding noise (every block starts as the identity, and the
    # norms make the loss blind to the stream's scale), which Adam's first step turns into full steps of
    # either sign, and its moments carry on: they are left out
    for diffs in report["steps"]:
        diffs = {n: d for n, d in diffs.items() if not n.startswith("transformer.scalars.")}
        assert max(diffs.values()) < 1e-3, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
