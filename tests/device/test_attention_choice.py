"""SDPA's kernel for a CPU training run: chosen from the run's own shape, measured (device/probe.py
`time_sdpa`), never assumed. The choice is tested with the timings injected, both ways; nothing here depends
on how fast this machine is."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from minigpt.device.probe import CACHE_FILE, cpu_sdpa_probe, time_sdpa
from minigpt.device.runtime import SDPA_MATH_MIN_SPEEDUP, Runtime, choose_cpu_attention, with_cpu_attention
from minigpt.model.attention import math_attention


def test_the_math_kernel_is_chosen_where_it_is_measured_clearly_faster() -> None:
    kernel, why = choose_cpu_attention({"fused": 6.06e-3, "math": 3.84e-3})
    assert kernel == SDPBackend.MATH
    assert why == "SDPA's math kernel (measured: forward and backward 6.06 ms fused, 3.84 ms math)"


@pytest.mark.parametrize("fused", [2.0e-3, SDPA_MATH_MIN_SPEEDUP * 3.0e-3 * 0.99])
def test_torch_s_own_choice_stays_unless_the_math_kernel_wins_by_the_margin(fused: float) -> None:
    kernel, why = choose_cpu_attention({"fused": fused, "math": 3.0e-3})
    assert kernel is None and why.startswith("SDPA's fused kernel")


def test_the_runtime_s_context_runs_the_chosen_kernel_and_autocasts(caplog) -> None:
    plain = Runtime(torch.device("cpu"), torch.bfloat16, compile=False)
    with caplog.at_level(logging.INFO, logger="minigpt.device.runtime"):
        chosen = with_cpu_attention(plain, (2, 4, 2, 16, 8), None,
                                    probe=lambda *_: ({"fused": 3e-3, "math": 1e-3}, "measured"))
    assert "attention: SDPA's math kernel (measured: " in caplog.text
    assert plain.attention_kernel is None and chosen.attention_kernel == SDPBackend.MATH
    for runtime, flash in [(plain, True), (chosen, False)]:
        with runtime.autocast():
            assert torch.backends.cuda.flash_sdp_enabled() is flash  # the flags SDPA dispatches on
            assert torch.is_autocast_enabled("cpu")
    assert torch.backends.cuda.flash_sdp_enabled()  # restored on leaving


def test_both_kernels_compute_attention_and_are_timed() -> None:
    """The probe times real calls of the shape it is given (grouped-query heads included), and the kernel it
    may choose computes the same attention as the explicit formula."""
    times = time_sdpa((2, 4, 2, 16, 8), torch.float32, torch.device("cpu"), repeats=1)
    assert set(times) == {"fused", "math"} and all(t > 0 for t in times.values())
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 16, 8, generator=gen) for h in (4, 2, 2))
    runtime = Runtime(torch.device("cpu"), torch.float32, compile=False, attention_kernel=SDPBackend.MATH)
    with runtime.autocast():
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, math_attention(q, k, v, None, True)[0])


def test_the_timings_are_cached_per_machine_shape_and_dtype(tmp_path) -> None:
    """A run that resumes, or a second run on the machine, must choose as the first did whatever the load
    when it starts: the seconds are measured once per shape and dtype and read back after."""
    calls = []

    def timer(shape, dtype, device):
        calls.append((shape, dtype))
        return {"fused": 2e-3 * len(calls), "math": 1e-3}

    first = cpu_sdpa_probe(tmp_path, (8, 3, 3, 128, 32), torch.bfloat16, timer)
    assert first == ({"fused": 2e-3, "math": 1e-3}, "measured")
    assert cpu_sdpa_probe(tmp_path, (8, 3, 3, 128, 32), torch.bfloat16, timer) == (first[0], "cached")
    assert cpu_sdpa_probe(tmp_path, (8, 3, 3, 128, 32), torch.float32, timer)[1] == "measured"
    assert cpu_sdpa_probe(tmp_path, (8, 3, 3, 256, 32), torch.bfloat16, timer)[1] == "measured"
    assert len(calls) == 3
    kept = json.loads((tmp_path / CACHE_FILE).read_text())  # the matmul probe's file, one entry per shape
    assert sorted(k.split(" | sdpa ")[1] for k in kept) == ["8x3x3x128x32 bfloat16", "8x3x3x128x32 float32",
                                                           "8x3x3x256x32 bfloat16"]
    (tmp_path / CACHE_FILE).write_text("{half a file")
    assert cpu_sdpa_probe(tmp_path, (8, 3, 3, 128, 32), torch.bfloat16, timer)[1] == "measured"  # damaged
