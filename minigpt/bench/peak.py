"""The denominator of MFU: what this machine's matmul units can actually do.

On CPU there is no datasheet to trust (a shared, virtualised, frequency-scaled core), so the peak is
measured: the best throughput of large square matmuls with the configured thread count, in fp32 and
in bf16. Square matmuls of a few hundred to a thousand rows are the most favourable workload the
machine runs, so MFU against them says how close the model's mix of ops comes to the best case.

On CUDA the datasheet dense bf16 peak is also reported by device name (the table lives with the
trainer's MFU, `training/device.py`), because the measured number depends on clocks and on how
well one matmul size happens to tile.
"""

from __future__ import annotations

import time

import torch

from minigpt.bench.timing import synchronize
from minigpt.training.device import GPU_PEAK_TFLOPS


def matmul_flops(n: int, dtype: torch.dtype, device: torch.device, seconds: float = 0.5) -> float:
    """Best FLOP/s of (n x n) @ (n x n) in `dtype`: batches of calls are timed, the fastest batch counts."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: thread pool, packing buffers, kernel selection
    best, deadline = 0.0, time.perf_counter() + seconds
    calls = 1
    while True:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            torch.matmul(a, b, out=out)
        synchronize(device)
        elapsed = time.perf_counter() - start
        best = max(best, 2 * n**3 * calls / elapsed)
        if time.perf_counter() > deadline:
            return best
        if elapsed < 0.05:  # too short to time reliably: make the batch bigger
            calls *= 2


def datasheet_tflops(device: torch.device) -> float | None:
    """Dense bf16 tensor-core TFLOP/s of a known CUDA device, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in GPU_PEAK_TFLOPS.items():
        if key in name:
            return tflops
    return None


def bench_peak(device: torch.device, quick: bool = False) -> dict:
    """Measured fp32 and bf16 matmul peaks (FLOP/s) and, on CUDA, the datasheet peak."""
    n = 512 if quick else 1024
    if device.type == "cuda":
        n = 4096 if quick else 8192
    seconds = 0.3 if quick else 1.0
    return {
        "n": n,
        "threads": torch.get_num_threads(),
        "fp32_flops": matmul_flops(n, torch.float32, device, seconds),
        "bf16_flops": matmul_flops(n, torch.bfloat16, device, seconds),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "datasheet_tflops": datasheet_tflops(device),
    }
