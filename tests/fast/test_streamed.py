"""StreamedLinear (fast/streamed.py): nn.Linear's result eagerly and compiled, computed compiled by a loop
Inductor generates (no library product), with the linear's own parameters; and the streamed one-query
attention: the attention's formula in float64, eagerly and compiled, with no library kernel in its graph."""

from __future__ import annotations

import math

import pytest
import torch
import torch._inductor.metrics as inductor_metrics
from torch import nn
from torch._inductor.scheduler import ExternKernelSchedulerNode

from minigpt.fast.streamed import StreamedLinear, streamed_attention


def _linear(out_f: int, in_f: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_f, out_f, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eagerly_it_is_the_linear_itself(dtype: torch.dtype) -> None:
    linear = _linear(61, 40, True, dtype)
    streamed = StreamedLinear.from_linear(linear)
    assert streamed.weight is linear.weight and streamed.bias is linear.bias  # shared: a tie stays a tie
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(1)).to(dtype)
    assert torch.equal(streamed(x), linear(x))


def _extern_kernels(fn, *args) -> tuple[torch.Tensor, int]:
    """fn(*args) compiled afresh, and how many of its kernels are library calls rather than generated code."""
    torch._dynamo.reset()
    inductor_metrics.reset()
    torch._logging.set_logs(inductor_metrics=True)
    try:
        with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():
            out = torch.compile(fn)(*args)
    finally:
        torch._logging.set_logs()
    nodes = [node for node, _ in inductor_metrics.nodes_num_elem]
    return out, sum(isinstance(node, ExternKernelSchedulerNode) for node in nodes)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_compiled_it_is_a_generated_loop_with_the_linear_s_result(dtype: torch.dtype, tol: float) -> None:
    """Against float64 F.linear, with a GELU before it as in a block, and with no library product left in
    the graph, where nn.Linear's graph has one."""
    linear = _linear(61, 48, True, dtype)
    streamed = StreamedLinear.from_linear(linear)
    x = torch.randn(2, 48, generator=torch.Generator().manual_seed(2)).to(dtype)
    expected = torch.nn.functional.linear(torch.nn.functional.gelu(x.double()), linear.weight.double(),
                                          linear.bias.double())
    got, extern = _extern_kernels(lambda x: streamed(torch.nn.functional.gelu(x)), x)
    assert extern == 0
    torch.testing.assert_close(got.double(), expected, atol=tol, rtol=tol)
    _, extern = _extern_kernels(lambda x: linear(torch.nn.functional.gelu(x)), x)
    assert extern >= 1


def _one_query(n_kv_head: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q (2, 4, 1, 8), k/v (2, n_kv_head, 9, 8) in `dtype`, and a padding mask (2, 1, 1, 9): row 1's first
    three keys are padding."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 1, 8, generator=gen).to(dtype)
    k, v = (torch.randn(2, n_kv_head, 9, 8, generator=gen).to(dtype) for _ in range(2))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :3] = False
    return q, k, v, mask


def _attention_in_float64(q, k, v, mask, scale) -> torch.Tensor:
    """softmax(q·kᵀ·scale, padding excluded)·v, each query head h reading key/value head h // (H / H_kv)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D)
    scores = torch.einsum("bhqd,bhsd->bhqs", q, k) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqs,bhsd->bhqd", scores.softmax(-1), v)  # (B, H, 1, D)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("scale", [None, 1.0])
def test_streamed_attention_is_the_attention_formula(dtype, tol, n_kv_head, scale) -> None:
    """Grouped heads, a padding mask, the default 1/√D or another scale; 16-bit inputs summed in float32
    (the error is the output's own rounding)."""
    q, k, v, mask = _one_query(n_kv_head, dtype)
    expected = _attention_in_float64(q, k, v, mask, 1 / math.sqrt(8) if scale is None else scale)
    got = streamed_attention(q, k, v, mask, scale)
    assert got.shape == q.shape and got.dtype == dtype
    torch.testing.assert_close(got.double(), expected, atol=tol, rtol=tol)
    unmasked = streamed_attention(q, k, v, None, scale)
    torch.testing.assert_close(unmasked[0], got[0])  # row 0 has no padding
    with pytest.raises(ValueError, match="one query"):
        streamed_attention(torch.cat([q, q], dim=2), k, v, None)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_compiled_streamed_attention_is_generated_code_with_the_formula_s_result(dtype, tol) -> None:
    """No library kernel in its graph (scaled_dot_product_attention's graph has one)."""
    q, k, v, mask = _one_query(2, dtype)
    got, extern = _extern_kernels(lambda q, k, v, mask: streamed_attention(q, k, v, mask), q, k, v, mask)
    assert extern == 0
    torch.testing.assert_close(got.double(), _attention_in_float64(q, k, v, mask, 1 / math.sqrt(8)),
                               atol=tol, rtol=tol)
    sdpa = lambda q, k, v, mask: torch.nn.functional.scaled_dot_product_attention(q, k, v, mask,
                                                                                  enable_gqa=True)
    assert _extern_kernels(sdpa, q, k, v, mask)[1] >= 1


@pytest.mark.slow
def test_compiled_on_a_slice_of_a_streamed_projection_every_row_reads_its_own_query() -> None:
    """In a model the query is a view into the fused q/k/v projection's output (here a StreamedLinear's with
    a bias, as in GPT-2's block): its strides step over the keys and values. Compiled, each row must read its
    own query; before both layers made their input contiguous, the second row read other memory."""
    _, k, v, mask = _one_query(2, torch.float32)
    qkv = StreamedLinear.from_linear(_linear(3 * 32, 16, True, torch.float32))  # (B, 1, C) -> (B, 1, 3HD)
    x = torch.randn(2, 1, 16, generator=torch.Generator().manual_seed(4))

    def attend(x, k, v, mask):
        q = qkv(x)[..., :32].view(2, 1, 4, 8).transpose(1, 2)  # (B, H, 1, D): the q of q, k, v
        return streamed_attention(q, k, v, mask)

    with torch.no_grad():
        q = qkv(x)[..., :32].view(2, 1, 4, 8).transpose(1, 2)
        torch._dynamo.reset()
        got = torch.compile(attend, dynamic=True)(x, k, v, mask)
    torch.testing.assert_close(got.double(), _attention_in_float64(q, k, v, mask, 1 / math.sqrt(8)),
                               atol=1e-5, rtol=1e-5)
