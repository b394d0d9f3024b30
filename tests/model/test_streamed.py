"""StreamedLinear (model/streamed.py): nn.Linear's result eagerly and compiled, computed compiled by a loop
Inductor generates (no library product), with the linear's own parameters."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.metrics as inductor_metrics
from torch import nn
from torch._inductor.scheduler import ExternKernelSchedulerNode

from minigpt.model.streamed import StreamedLinear


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
