"""oneDNN-packed linear layers (fast/packed.py) against the formula in float64 and against nn.Linear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minigpt.fast.packed import PackedLinear, can_pack

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # bf16: its product rounds inputs to 8 significant bits


def _linear(out_f: int, in_f: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_f, out_f, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("packed_rows", "shape"),
                         [(1, (1, 40)), (1, (5, 40)), (4, (2, 3, 40)), (4, (1, 40))])
def test_packed_products_follow_the_formula(dtype, bias, packed_rows, shape) -> None:
    """Any number of rows, in any leading shape, whatever row count the matrix was packed for."""
    linear = _linear(61, 40, bias, dtype)  # odd sizes: no tile may assume a round width
    packed = PackedLinear.from_linear(linear, packed_rows)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    exact = x.double() @ linear.weight.double().t()  # (..., out)
    if bias:
        exact = exact + linear.bias.double()
    with torch.no_grad():
        y = packed(x)
    assert y.shape == (*shape[:-1], 61) and y.dtype == dtype
    scale = x.double().abs().sum(-1, keepdim=True) * linear.weight.double().abs().max()  # bounds the product
    assert ((y.double() - exact).abs() <= TOL[dtype] * (scale + 1)).all()


def test_the_packed_matrix_unpacks_to_the_original_values() -> None:
    linear = _linear(61, 40, True, torch.bfloat16)
    packed = PackedLinear.from_linear(linear, 1)
    assert packed.packed.is_mkldnn and torch.equal(packed.weight, linear.weight)
    assert torch.equal(packed.bias, linear.bias) and packed.bias.data_ptr() != linear.bias.data_ptr()


def test_what_can_be_packed() -> None:
    assert can_pack(torch.zeros(2, 2)) and can_pack(torch.zeros(2, 2, dtype=torch.bfloat16))
    assert not can_pack(torch.zeros(2, 2, dtype=torch.float64))
    assert not can_pack(torch.zeros(2, 2, dtype=torch.int8))
    assert not can_pack(torch.zeros(2, 2, device="meta"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_product_inside_torch_compile_is_the_eager_one(dtype) -> None:
    """The product is an operator of its own, which a compiled graph calls as a library kernel (the packed
    tensor itself cannot be lowered by Inductor)."""
    packed = PackedLinear.from_linear(_linear(61, 40, True, dtype), 1)
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(2)).to(dtype)
    compiled = torch.compile(lambda x: torch.relu(packed(x)) * 2, dynamic=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), torch.relu(packed(x)) * 2, atol=TOL[dtype], rtol=TOL[dtype])
