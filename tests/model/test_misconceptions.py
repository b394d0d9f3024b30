"""Common misconceptions about transformers, each checked on the real modules (docs/design.md lists them).

Each test shows the correct version by an independent computation: an explicit formula, a second route
through the model, or the same model run another way.
"""

from __future__ import annotations

import hashlib

import torch
from model_helpers import VOCAB, shrunk_model, tiny_config

from minigpt.model.attention import CausalSelfAttention
from minigpt.model.factory import build_model
from minigpt.model.gpt import INIT_STD
from minigpt.model.online_softmax import online_softmax
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams


def test_the_softmax_jacobian_is_diag_p_minus_p_p_transpose_not_its_diagonal_alone():
    """dp_i/ds_j = p_i (δ_ij - p_j): p_i (1 - p_i) is only the diagonal. Saturation still kills all of it:
    a one-hot p makes diag(p) - p pᵀ the zero matrix."""
    s = torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for softmax in (lambda x: online_softmax(x, block_size=4), lambda x: torch.softmax(x, -1)):
        jac = torch.autograd.functional.jacobian(softmax, s)  # (6, 6)
        p = softmax(s)
        torch.testing.assert_close(jac, torch.diag(p) - torch.outer(p, p))
        assert (jac - torch.diag(p * (1 - p))).abs().max() > 0.01  # the off-diagonal terms are not zero
        saturated = torch.autograd.functional.jacobian(softmax, 30 * s)  # the top score ~30 above the next
        assert saturated.abs().max() < 1e-6


def test_attention_is_not_a_linear_map_of_its_input():
    """It averages the values linearly, but the weights of the average come from the input too."""
    H, D, T = 2, 8, 6
    attn = CausalSelfAttention(tiny_config(n_layer=1, n_head=H, n_embd=H * D, block_size=T, vocab_size=VOCAB,
                                           bias=False), 0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        attn.c_attn.weight.normal_(0, (H * D) ** -0.5, generator=g)  # scores of order 1
        x, x2 = torch.randn(2, 1, T, H * D, generator=g)
        f = attn
        assert (f(2 * x) - 2 * f(x)).norm() > 0.1 * f(2 * x).norm()  # not homogeneous ...
        assert (f(x + x2) - f(x) - f(x2)).norm() > 0.1 * f(x + x2).norm()  # ... nor additive


def test_one_embedding_table_gets_the_sum_of_every_rows_gradient():
    """Two sequences in a batch that share a token do not each train a copy of its vector: there is one row,
    and its gradient is the batch's (mean) loss gradient, the average of what each sequence alone gives."""
    torch.manual_seed(0)
    model = build_model(tiny_config(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=VOCAB,
                                    tie_weights=False)).train()
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    idx[:, 3] = 5  # token 5 in both sequences

    def row_grad(batch: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        model(batch[:, :-1], batch[:, 1:])[1].backward()
        return model.transformer.wte.weight.grad[5].clone()

    alone = [row_grad(idx[i : i + 1]) for i in range(2)]
    assert all(g.norm() > 0 for g in alone) and not torch.allclose(alone[0], alone[1])
    torch.testing.assert_close(row_grad(idx), (alone[0] + alone[1]) / 2)
    tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.num_embeddings == VOCAB]
    assert tables == [model.transformer.wte]  # one token table


def test_one_forward_pass_predicts_after_every_prefix_at_once():
    """Autoregressive does not mean sequential in training: with the causal mask, position t of one pass
    over T tokens is what a pass over the first t + 1 tokens alone gives: all T predictions train at once."""
    model = shrunk_model("tiny").eval()
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)[0]  # (2, 12, V)
        for t in range(12):
            torch.testing.assert_close(full[:, t], model(idx[:, : t + 1])[0][:, -1], atol=1e-5, rtol=1e-5)


def test_queries_and_keys_do_not_start_with_unit_variance():
    """The 1/√D argument assumes unit-variance q and k; LayerNorm gives unit variance to each token's C
    channels, and q = W_Q·LN(x) then has variance C·std(W_Q)^2 (0.05 here), not 1. What the scale guarantees
    is that the scores' spread does not grow with D, whatever it starts at."""
    C = 128
    model = build_model(tiny_config(n_layer=1, n_head=2, n_embd=C, vocab_size=VOCAB)).eval()
    block = model.transformer.h[0]
    idx = torch.randint(0, VOCAB, (64, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(32))  # (B, T, C)
        normed = block.ln_1(x)
        q = block.attn.c_attn(normed)[..., :C]  # (B, T, C)
    assert abs(x.var().item() / (2 * INIT_STD**2) - 1) < 0.1  # the stream starts ~35x smaller than unit scale
    var = x.var(-1, unbiased=False)  # (B, T): with a stream this small, eps shows: σ²/(σ² + eps) < 1
    expected = var / (var + block.ln_1.eps)
    torch.testing.assert_close(normed.var(-1, unbiased=False), expected, atol=1e-4, rtol=0)
    assert abs(q.var().item() / (C * INIT_STD**2) - 1) < 0.15


def _weights_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_generation_changes_no_weight():
    """Training changes the weights; generation only reads them (the KV cache is the only state it writes)."""
    model = shrunk_model("tiny")
    before = _weights_hash(model)
    params = SamplingParams(temperature=1.0, top_k=5)
    out = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=8, params=params,
                   generator=torch.Generator().manual_seed(0))
    assert len(out.tokens[0]) == 8
    assert _weights_hash(model) == before
