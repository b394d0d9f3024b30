"""Device, precision and compilation choices, resolved once from `DeviceConfig`.

Mixed precision: the weights and the optimizer stay in float32; `autocast` runs the matmuls in a 16-bit
type. bfloat16 has float32's exponent range, so it needs no loss scaling; float16 does (its smallest normal
number is ~6e-5, small gradients underflow to zero), which is what the `GradScaler` is for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass

import torch

from minigpt.errors import UserError
from minigpt.training.config import DeviceConfig

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense bf16/fp16 tensor-core peaks (TFLOP/s, no sparsity) for MFU, matched against the device name.
GPU_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0,
                    "RTX 4090": 165.0, "RTX 3090": 71.0, "V100": 125.0, "T4": 65.0}


@dataclass
class Runtime:
    """The resolved device settings the trainer uses."""

    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means autocast is off
    compile: bool

    @property
    def type(self) -> str:
        return self.device.type

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context for forward passes: autocast to `dtype`, or nothing in float32."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A loss scaler, enabled only for float16 (a disabled scaler is a no-op with the same API)."""
        enabled = self.dtype == torch.float16
        return torch.amp.GradScaler(self.device.type if enabled else "cpu", enabled=enabled)

    def synchronize(self) -> None:
        """Wait for queued device work; called only at log intervals, to time honestly."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()


def resolve_runtime(cfg: DeviceConfig, local_rank: int = 0) -> Runtime:
    """Pick the device, the autocast dtype and whether to compile; enable TF32 on CUDA if asked."""
    device = _pick_device(cfg.type, local_rank)
    dtype = _pick_dtype(cfg.dtype, device)
    # CPU, measured on this project's 2-core machine with the tiny model: compiled steps ran 1.7x faster, but
    # the first compilation took ~90 s (10 s from a warm cache), which a few-minute `make train` does not win
    # back; it also needs a C++ toolchain. On CUDA compilation pays for itself within minutes.
    compile_model = cfg.compile if cfg.compile is not None else device.type == "cuda"
    problem = compile_problem(device) if compile_model else None
    if problem and cfg.compile:
        raise UserError(f"device.compile=true but torch.compile cannot run here: {problem}; "
                        "or set device.compile=false")
    if problem:
        log.info("not compiling: %s", problem)
        compile_model = False
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
        torch.backends.cudnn.allow_tf32 = cfg.tf32
    dtype_name = str(dtype).removeprefix("torch.")
    log.info("device %s, autocast dtype %s, compile %s", device, dtype_name, compile_model)
    return Runtime(device=device, dtype=dtype, compile=compile_model)


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile would fail on `device`, or None. Checked up front: otherwise it fails at the first
    step with a long compiler traceback. Its Inductor backend generates C++ on CPU, Triton kernels on CUDA."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return f"TorchDynamo does not support Python {version} on {sys.platform}"
    if device.type == "cpu":
        cxx = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")  # what Inductor calls
        if shutil.which(cxx) is None:
            return f"Inductor needs a C++ compiler on CPU and {cxx!r} was not found (install one, or set CXX)"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Inductor needs Triton on CUDA and it is not installed (pip install triton)"
    return None


def _pick_device(kind: str, local_rank: int) -> torch.device:
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UserError("device.type=cuda but no CUDA device is available (use device=cpu or auto)")
        return torch.device("cuda", local_rank)
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UserError("device.type=mps but MPS is not available (use device=cpu or device=auto)")
    return torch.device(kind)


def _pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            # bf16 needs Ampere or newer; older GPUs get fp16 with loss scaling.
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        # CPU and MPS: float32. On this project's 2-core CPU (AVX2, no bf16 units) bf16 matmuls run at about
        # 1 GFLOP/s against 140 for fp32 (`make bench`), so bf16 autocast made training 3-100x slower.
        return torch.float32
    dtype = _DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise UserError("device.dtype=float16 is not supported on CPU (use bfloat16 or float32)")
    return dtype


def peak_flops(cfg: DeviceConfig, runtime: Runtime) -> float:
    """The device's peak FLOP/s for MFU: configured, looked up for known GPUs, or measured with a matmul."""
    if cfg.peak_tflops is not None:
        return cfg.peak_tflops * 1e12
    if runtime.type == "cuda":
        name = torch.cuda.get_device_name(runtime.device)
        for key, tflops in GPU_PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12
    return _measure_matmul_flops(runtime)


def _measure_matmul_flops(runtime: Runtime, n: int = 512, seconds: float = 0.2) -> float:
    """Dense matmul throughput in the autocast dtype: the best this device does on the model's main op."""
    gen = torch.Generator().manual_seed(0)  # its own generator: the training RNG stream stays untouched
    a = torch.randn(n, n, generator=gen).to(runtime.device, runtime.dtype)
    b = torch.randn(n, n, generator=gen).to(runtime.device, runtime.dtype)
    a @ b  # warm-up
    runtime.synchronize()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    runtime.synchronize()
    return 2 * n**3 * count / (time.perf_counter() - start)
