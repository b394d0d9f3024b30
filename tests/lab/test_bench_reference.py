"""The bench compares like with like: the HF reference holds minigpt's weights, and the timed training steps
and attention contenders compute the same thing (checked against each other, never against timings)."""

from __future__ import annotations

import pytest
import torch

from minigpt.interop.hf_gpt2 import hf_state_dict
from minigpt.lab.bench.attention import BACKENDS, attention_fn
from minigpt.lab.bench.reference import gpt2_like_config, logits_agree, reference_model
from minigpt.lab.bench.train_step import make_step
from minigpt.model.factory import build_model

pytest.importorskip("transformers")

VOCAB, T = 97, 16


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(gpt2_like_config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, block_size=T))
    with torch.no_grad():  # wider weights than the init, so a wrong mapping shows in the logits
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, T), generator=gen), torch.randint(0, VOCAB, (2, T), generator=gen)


def test_reference_has_the_same_weights_and_logits() -> None:
    model = _model().eval()
    ref = reference_model(model).eval()
    assert type(ref).__name__ == "GPT2LMHeadModel" and ref.config.activation_function == "gelu"
    x, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(ref(input_ids=x).logits, model(x)[0], atol=1e-5, rtol=1e-5)
    assert logits_agree(model, ref, x) <= 1e-4


def test_logits_agree_catches_a_different_model() -> None:
    model = _model()
    ref = reference_model(model)
    with torch.no_grad():
        ref.transformer.h[1].mlp.c_fc.weight.add_(0.1)
    with pytest.raises(RuntimeError, match="disagree"):
        logits_agree(model, ref, _batch()[0])


def test_one_training_step_updates_both_models_identically() -> None:
    model = _model().train()
    ref = reference_model(model).train()
    x, y = _batch()
    opt = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)  # the reference's optimizer
    loss_ours = make_step(model, opt(model), x, y, None, hf=False)()
    loss_ref = make_step(ref, opt(ref), x, y, None, hf=True)()
    torch.testing.assert_close(loss_ours, loss_ref, atol=1e-5, rtol=1e-5)
    theirs = ref.state_dict()
    for name, tensor in hf_state_dict(model).items():  # minigpt's weights in HF's layout
        torch.testing.assert_close(tensor, theirs[name], atol=1e-5, rtol=1e-4, msg=name)


def test_attention_contenders_compute_the_same_output() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 70, 8, generator=gen) for _ in range(3))
    # explicit causal softmax attention, written out here
    scores = (q @ k.transpose(-2, -1)) / 8**0.5
    scores = scores.masked_fill(torch.ones(70, 70, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    for backend in BACKENDS:
        torch.testing.assert_close(attention_fn(backend, q, k, v, block_size=16)(), expected, atol=1e-5,
                                   rtol=1e-5, msg=backend)
