"""MFU's three inputs: the model's FLOPs per token (against PyTorch's own counter), the peak of the dtype in
use, and the meter that divides them (per device, never above 100%). The 2-rank check is in
cluster/test_distributed.py (`test_mfu_is_per_device`)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from model_helpers import PRESETS, load_preset, shrunk_model
from torch.utils.flop_counter import FlopCounterMode

from minigpt.device import runtime as rt
from minigpt.device.config import DeviceConfig
from minigpt.model.factory import build_model
from minigpt.training.budget import ThroughputMeter


def _vector_params(model: torch.nn.Module) -> int:
    """Biases and norm gains: parameters that take part in no matmul."""
    return sum(p.numel() for p in model.parameters() if p.dim() == 1)


def _addmm_inplace_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode counts addmm but not its in-place form, which the fused loss accumulates dW with."""
    (m, k), (_, n) = a_shape, b_shape
    return 2 * m * n * k


def _counted_train_flops(model: torch.nn.Module, idx: torch.Tensor, **forward_kwargs) -> int:
    """FLOPs of one forward + backward as torch.utils.flop_counter counts them (every aten matmul).

    Use the math attention backend: the counter has no formula for the CPU flash-attention kernel that
    `sdpa` runs on real CPU tensors, so it would silently count no attention at all.
    """
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.addmm_: _addmm_inplace_flops})
    with counter:
        _, loss = model(idx, idx, **forward_kwargs)
        loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("preset", PRESETS)
def test_flops_per_token_agrees_with_pytorchs_flop_counter(preset: str):
    """Full-size presets on the meta device: shapes only, so even GPT-2 small at T=1024 takes a second.

    The model's count is 6 per matmul weight (2 forward, 4 backward) + 12·L·C·T for the attention scores and
    the weighted values; the counter sees every matmul PyTorch runs (math attention: the full T x T products,
    as in the formula). They differ by exactly 6 FLOPs per bias and norm gain, which the formula counts as
    parameters but which take part in no matmul: under 0.5% for every preset.
    """
    cfg = dataclasses.replace(load_preset(preset), vocab_size=50257 if preset == "gpt2" else 4096,
                              attention="math", dropout=0.0)
    with torch.device("meta"):
        model = build_model(cfg)
        idx = torch.zeros(1, cfg.block_size, dtype=torch.long)
    counted = _counted_train_flops(model, idx) / cfg.block_size  # per token
    assert model.flops_per_token() == pytest.approx(counted, rel=0.01)
    assert model.flops_per_token() == counted + 6 * _vector_params(model)


def test_the_fused_training_loss_does_the_same_matmuls():
    """Training runs the head fused with the loss (chunked_loss.py); it must not hide extra work from MFU."""
    torch.manual_seed(0)
    model = shrunk_model("tiny", attention="math").train()
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.block_size))
    fused = _counted_train_flops(model, idx, return_logits=False)
    plain = _counted_train_flops(model, idx)
    assert fused == plain == (model.flops_per_token() - 6 * _vector_params(model)) * idx.numel()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _meter(peak: float, world_size: int, clock: FakeClock) -> ThroughputMeter:
    # 100 FLOPs per token; the tests' steps train 1000 tokens over all ranks
    return ThroughputMeter(100.0, peak, world_size, synchronize=lambda: None, clock=clock)


def test_mfu_is_per_device():
    clock = FakeClock()
    one, two = _meter(1e6, 1, clock), _meter(1e6, 2, clock)
    for m in (one, two):
        m.step_done(1000)
    clock.now = 1.0
    a, b = one.interval(), two.interval()
    assert a.tokens_per_s == b.tokens_per_s == 1000  # the global rate
    assert a.mfu == pytest.approx(100 * 1000 / 1e6)  # 10%: one device did all the work
    assert b.mfu == pytest.approx(100 * 1000 / 2 / 1e6)  # 5%: each of two did half of it


def test_mfu_never_exceeds_one(caplog):
    """A peak below what the model reached (a probe on a busy machine) becomes the model's own rate."""
    clock = FakeClock()
    meter = _meter(50_000.0, 1, clock)  # the model will reach 100 FLOPs/token x 1000 tokens/s = 100,000
    meter.step_done(1000)
    clock.now = 1.0
    with caplog.at_level(logging.WARNING, logger="minigpt.training.budget"):
        first = meter.interval()
        meter.step_done(1000)
        clock.now = 3.0  # half as fast: 500 tokens/s
        second = meter.interval()
        meter.step_done(1000)
        clock.now = 3.5  # twice as fast as the first: the peak rises again, without a second warning
        third = meter.interval()
    assert first.mfu == 1.0 and meter.peak_flops == 200_000.0
    assert second.mfu == pytest.approx(0.5 * 100_000 / 100_000)  # against the raised peak of the first
    assert third.mfu == 1.0
    assert len([r for r in caplog.records if "above the peak" in r.getMessage()]) == 1


@pytest.fixture
def gpu_named(monkeypatch):
    """Pretend torch.cuda.get_device_name returns `name` (no GPU needed: only the table lookup runs)."""

    def set_name(name: str) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    tf32 = torch.backends.cuda.matmul.allow_tf32
    yield set_name
    torch.backends.cuda.matmul.allow_tf32 = tf32


def test_datasheet_peaks_are_those_of_the_dtype_in_use(gpu_named):
    cuda = torch.device("cuda", 0)
    gpu_named("NVIDIA H100 80GB HBM3")
    assert rt.datasheet_tflops(cuda, torch.bfloat16) == 989.5
    assert rt.datasheet_tflops(cuda, torch.float16) == 989.5
    torch.backends.cuda.matmul.allow_tf32 = True
    assert rt.datasheet_tflops(cuda, torch.float32) == 494.5  # TF32 tensor cores
    torch.backends.cuda.matmul.allow_tf32 = False
    assert rt.datasheet_tflops(cuda, torch.float32) == 67.0  # plain fp32 units
    gpu_named("NVIDIA H100 PCIe")
    assert rt.datasheet_tflops(cuda, torch.bfloat16) == 756.5  # not the SXM row
    gpu_named("NVIDIA A100-SXM4-80GB")
    assert rt.datasheet_tflops(cuda, torch.bfloat16) == 312.0  # not the A10 row
    gpu_named("NVIDIA A10G")
    assert rt.datasheet_tflops(cuda) == 70.0  # bf16 by default
    gpu_named("Tesla V100-SXM2-16GB")
    assert rt.datasheet_tflops(cuda, torch.bfloat16) is None  # no bf16 units: measure instead
    gpu_named("Some Future GPU")
    assert rt.datasheet_tflops(cuda, torch.bfloat16) is None
    assert rt.datasheet_tflops(torch.device("cpu"), torch.bfloat16) is None


def test_peak_flops_measures_the_autocast_dtype_where_no_datasheet_applies(monkeypatch, gpu_named):
    probed = []
    monkeypatch.setattr(rt, "measure_matmul_flops",
                        lambda n, dtype, device, seconds: probed.append((dtype, device.type)) or 7e9)
    cpu_bf16 = rt.Runtime(torch.device("cpu"), torch.bfloat16, compile=False)
    assert rt.peak_flops(DeviceConfig(), cpu_bf16) == 7e9
    assert probed == [(torch.bfloat16, "cpu")]  # bf16 autocast: the bf16 rate, not fp32's
    assert rt.peak_flops(DeviceConfig(peak_tflops=2.5), cpu_bf16) == 2.5e12  # configured: taken as given
    gpu_named("NVIDIA L4")
    cuda_fp16 = rt.Runtime(torch.device("cuda", 0), torch.float16, compile=False)
    assert rt.peak_flops(DeviceConfig(), cuda_fp16) == 121.0e12
    gpu_named("Tesla T4")
    cuda_bf16 = rt.Runtime(torch.device("cuda", 0), torch.bfloat16, compile=False)
    assert rt.peak_flops(DeviceConfig(), cuda_bf16) == 7e9  # no bf16 row for a T4: measured
    assert probed[-1] == (torch.bfloat16, "cuda")
