"""The denominators of MFU and MBU: what this machine's matmul units and memory can actually do.

On CPU there is no datasheet to trust (a shared, virtualised, frequency-scaled core), so both are
measured (device/probe.py): the best throughput of large square matmuls with the configured thread
count, in fp32 and in bf16, and the best rate of reading a buffer far larger than the caches. Square
matmuls of a few hundred to a thousand rows are the most favourable workload the machine runs, and a
long sequential read the most favourable access, so MFU and MBU against them say how close a model's
mix of ops comes to the best case.

On CUDA the datasheet dense bf16 peak is also reported by device name (the table lives with the
trainer's MFU, `device/runtime.py`), because the measured number depends on clocks and on how
well one matmul size happens to tile.

A measured peak is a lower bound of the true one: where a model's step (or decode) runs faster than the
peak measured here, the report raises the peak to the rate seen and says so (`effective_peak`), so no
utilisation is ever above 100%.
"""

from __future__ import annotations

import torch

from minigpt.device.probe import measure_matmul_flops, measure_read_bandwidth
from minigpt.device.runtime import datasheet_tflops


def bench_peak(device: torch.device, quick: bool = False) -> dict:
    """Measured fp32 and bf16 matmul peaks (FLOP/s), read bandwidth (bytes/s) and, on CUDA, the datasheet."""
    n = 512 if quick else 1024
    if device.type == "cuda":
        n = 4096 if quick else 8192
    seconds = 0.3 if quick else 1.0
    # a buffer well past any last-level cache (a CPU's is tens of MB; an H100's L2 50 MB)
    nbytes = (128 if quick else 512) * 2**20 if device.type == "cpu" else 2 * 2**30
    return {
        "n": n,
        "threads": torch.get_num_threads(),
        "fp32_flops": measure_matmul_flops(n, torch.float32, device, seconds),
        "bf16_flops": measure_matmul_flops(n, torch.bfloat16, device, seconds),
        "read_bytes": nbytes,
        "read_bytes_per_s": measure_read_bandwidth(device, nbytes, seconds),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "datasheet_tflops": datasheet_tflops(device),
    }


def dtype_peak_flops(peak: dict, dtype: str) -> float:
    """The peak MFU divides by for work in `dtype` (float32 | bfloat16): measured, or the datasheet's
    bf16 figure where it is known and higher (a GPU's measured peak depends on clocks and tiling)."""
    measured = peak["bf16_flops"] if dtype == "bfloat16" else peak["fp32_flops"]
    sheet = peak.get("datasheet_tflops")
    if dtype == "bfloat16" and sheet:
        return max(measured, sheet * 1e12)
    return measured


def effective_peak(measured: float, achieved: list[float]) -> tuple[float, bool]:
    """(peak, raised): the measured peak, or the best achieved rate where that is higher (the measurement
    under-read the machine: a busy moment, a size that tiles badly). Utilisation against it is <= 1."""
    best = max(achieved, default=0.0)
    return (best, True) if best > measured else (measured, False)
