"""The products' ways (fast/products.py): which are candidates, that the choice follows the measurement
(injected), and that the measurements are real times of the real products."""

from __future__ import annotations

import math

import pytest
import torch

from minigpt.fast import products
from minigpt.fast.step import DEFAULT, Plan

OI, OI_OFF, IO, IO_OFF = ("out_in", True), ("out_in", False), ("in_out", True), ("in_out", False)
PK = ("packed", True)  # a packed matrix is oneDNN's under either flag
FZ = ("frozen", True)  # the plain matrices frozen into a compiled step, Inductor choosing their kernels


def test_the_candidates_are_what_can_differ() -> None:
    # float32: oneDNN's flag changes nothing for plain matrices (BLAS), and a packed one is oneDNN's anyway
    assert products.product_candidates(torch.zeros(4, 4)) == [OI, IO, PK]
    bf16 = torch.zeros(4, 4, dtype=torch.bfloat16)
    assert products.product_candidates(bf16) == [OI, OI_OFF, IO, IO_OFF, PK]
    assert products.product_candidates(torch.zeros(4, 4, device="meta")) == [OI]  # not a CPU


def test_frozen_is_a_candidate_for_a_step_that_will_be_compiled(monkeypatch) -> None:
    monkeypatch.setattr(products, "compile_problem", lambda device: None)
    assert products.product_candidates(torch.zeros(4, 4), compile=True) == [OI, IO, PK, FZ]
    monkeypatch.setattr(products, "compile_problem", lambda device: "no C++ compiler")
    assert products.product_candidates(torch.zeros(4, 4), compile=True) == [OI, IO, PK]


def test_without_onednn_nothing_is_packed(monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert products.product_candidates(torch.zeros(4, 4)) == [OI, IO]


@pytest.mark.parametrize(("head", "blocks", "chosen"), [
    ({OI: 3.0, OI_OFF: 2.0, IO: 4.0, IO_OFF: 4.0, PK: 1.0},
     {OI: 1.0, OI_OFF: 0.5, IO: 1.0, IO_OFF: 1.0, PK: 2.0}, Plan("out_in", "packed", False)),  # any flag
    ({OI: 3.0, OI_OFF: 2.0, IO: 4.0, IO_OFF: 4.0, PK: 1.0},
     {OI: 1.0, OI_OFF: 2.5, IO: 1.0, IO_OFF: 1.0, PK: 2.0}, Plan("out_in", "packed", True)),
    ({OI: 3.0, OI_OFF: 3.0, IO: 1.0, IO_OFF: 4.0, PK: 2.0},
     {OI: 3.0, OI_OFF: 3.0, IO: 3.0, IO_OFF: 3.0, PK: 1.0}, Plan("packed", "in_out", True)),
    ({OI: 1.1, OI_OFF: 1.2, IO: 1.0, IO_OFF: 1.3, PK: 1.0},
     {OI: 1.0, OI_OFF: 1.0, IO: 1.0, IO_OFF: 1.0, PK: 1.0}, DEFAULT),  # within the noise margin
])  # fmt: skip
def test_the_product_choice_follows_the_measurement(head: dict, blocks: dict, chosen: Plan) -> None:
    seen = []

    def measure(matrices, rows, ways):
        seen.append(([m.shape for m in matrices], rows, ways))
        return {w: (head if len(matrices) == 1 else blocks)[w] for w in ways}

    head_w = torch.zeros(61, 32, dtype=torch.bfloat16)
    blocks_w = [torch.zeros(96, 32, dtype=torch.bfloat16), torch.zeros(32, 32, dtype=torch.bfloat16)]
    plan, why = products.choose_products(head_w, blocks_w, 4, measure=measure)
    ways = products.product_candidates(head_w)
    assert plan == chosen and seen == [([(61, 32)], 4, ways), ([(96, 32), (32, 32)], 4, ways)]
    assert chosen.name in why and "ms" in why and "2 block matrices" in why


SLOW = {OI: 9.0, OI_OFF: 9.0, IO: 9.0, IO_OFF: 9.0, PK: 9.0, FZ: 9.0}


@pytest.mark.parametrize(("head", "blocks", "chosen"), [
    ({FZ: 1.0}, {FZ: 1.0}, Plan(frozen=True)),
    # the blocks' fastest way is plain, which a frozen step would freeze too: frozen head + packed blocks
    ({FZ: 1.0, PK: 3.0}, {IO: 1.0, PK: 1.5, FZ: 2.0}, Plan("packed", "out_in", frozen=True)),
    ({FZ: 1.0, PK: 1.5}, {IO: 1.0, PK: 3.0, FZ: 3.0}, Plan("in_out", "packed")),  # 2.5 beats 4.0
    ({FZ: 1.0, OI_OFF: 1.2}, {OI_OFF: 1.0, FZ: 1.5}, Plan(onednn=False)),  # frozen: timed with oneDNN
    ({PK: 1.0, FZ: 2.0}, {FZ: 1.0, PK: 2.0}, Plan("out_in", "packed", frozen=True)),
])  # fmt: skip
def test_frozen_combines_only_with_what_a_frozen_step_leaves_alone(head, blocks, chosen, monkeypatch) -> None:
    monkeypatch.setattr(products, "compile_problem", lambda device: None)
    measure = lambda matrices, rows, ways: {w: {**SLOW, **(head if len(matrices) == 1 else blocks)}[w]
                                            for w in ways}
    head_w, block_w = torch.zeros(61, 32, dtype=torch.bfloat16), torch.zeros(96, 32, dtype=torch.bfloat16)
    plan, why = products.choose_products(head_w, [block_w, block_w], 1, compile=True, measure=measure)
    assert plan == chosen and why.startswith(chosen.name)
    assert ("frozen" in why.split(":")[0]) == chosen.frozen


def test_the_product_measurements_are_real_times() -> None:
    w = torch.randn(256, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ways = products.product_candidates(w)
    times = products.time_products([w, w[:32]], 2, ways, repeats=1)
    assert set(times) == set(ways) and all(0 < t < math.inf for t in times.values())


@pytest.mark.slow
def test_compiled_products_are_the_products_and_are_timed() -> None:
    gen = torch.Generator().manual_seed(0)
    matrices = [torch.randn(96, 32, generator=gen), torch.randn(32, 96, generator=gen)]
    xs = [torch.randn(2, 32, generator=gen), torch.randn(2, 96, generator=gen)]
    linears = [torch.nn.Linear(w.shape[1], w.shape[0], bias=False) for w in matrices]
    for linear, w in zip(linears, matrices, strict=True):
        linear.weight.data.copy_(w)
    for got, x, w in zip(products.compiled_products(linears, frozen=True)(xs), xs, matrices, strict=True):
        torch.testing.assert_close(got, x @ w.T, atol=1e-5, rtol=1e-5)
    times = products.time_products(matrices, 2, [OI, FZ], repeats=1)
    assert set(times) == {OI, FZ} and all(0 < t < math.inf for t in times.values())
