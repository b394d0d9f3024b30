"""The denominator of MFU: what this machine's matmul units can actually do.

On CPU there is no datasheet to trust (a shared, virtualised, frequency-scaled core), so the peak is
measured: the best throughput of large square matmuls with the configured thread count, in fp32 and
in bf16. Square matmuls of a few hundred to a thousand rows are the most favourable workload the
machine runs, so MFU against them says how close the model's mix of ops comes to the best case.

On CUDA the datasheet dense bf16 peak is also reported by device name (the table lives with the
trainer's MFU, `device/runtime.py`), because the measured number depends on clocks and on how
well one matmul size happens to tile.
"""

from __future__ import annotations

import torch

from minigpt.device.runtime import datasheet_tflops, measure_matmul_flops


def bench_peak(device: torch.device, quick: bool = False) -> dict:
    """Measured fp32 and bf16 matmul peaks (FLOP/s) and, on CUDA, the datasheet peak."""
    n = 512 if quick else 1024
    if device.type == "cuda":
        n = 4096 if quick else 8192
    seconds = 0.3 if quick else 1.0
    return {
        "n": n,
        "threads": torch.get_num_threads(),
        "fp32_flops": measure_matmul_flops(n, torch.float32, device, seconds),
        "bf16_flops": measure_matmul_flops(n, torch.bfloat16, device, seconds),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "datasheet_tflops": datasheet_tflops(device),
    }
