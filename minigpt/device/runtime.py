"""Device, precision and compilation choices, resolved once: `resolve_runtime` for training,
`inference_device` for generation and the tools. The only place either is decided.

Mixed precision: the weights and the optimizer stay in float32; `autocast` runs the matmuls in a 16-bit
type. bfloat16 has float32's exponent range, so it needs no loss scaling; float16 does (its smallest normal
number is ~6e-5, small gradients underflow to zero), which is what the `GradScaler` is for.

device.dtype=auto: bf16 on a CUDA GPU that has it (fp16 before Ampere); on a CPU whatever a short matmul probe
measures faster by a clear margin (`choose_cpu_dtype`: bf16 on CPUs with bf16 units, fp32 where bf16 is
emulated); float32 on MPS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from minigpt.device.allocator import keep_freed_memory
from minigpt.device.config import DeviceConfig
from minigpt.device.probe import (
    MatmulProbe,
    cpu_matmul_probe,
    cpu_sdpa_probe,
    measure_matmul_flops,
    synchronize,
)
from minigpt.errors import UserError

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense (no 2:4 sparsity) peak TFLOP/s of one GPU for each dtype its matmuls can run in, for MFU. Matched
# against torch.cuda.get_device_name, longest key first ("A100" before "A10", "H100 PCIe" before "H100").
# Sources: NVIDIA's product datasheets (H200, H100 SXM/PCIe, A100, L40S, L4, A10, V100, T4), whose tensor-core
# figures marked "with sparsity" are halved here; the Ampere GA102 and Ada AD102 whitepapers for the GeForce
# cards, taking "FP16/BF16 with FP32 accumulate" (what autocast runs; GeForce halves it against FP16
# accumulate); the A10G (AWS's variant, no NVIDIA datasheet) from Baseten's A10-vs-A10G comparison. "tf32" is
# float32 under device.tf32=true (torch.backends.cuda.matmul.allow_tf32), "fp32" without it. A dtype missing
# from a row (V100 and T4 have no bf16 or TF32 units) falls back to a measured peak.
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},  # SXM
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
    "H100": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},  # SXM
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 35.0},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "V100-PCIE": {"fp16": 112.0, "fp32": 14.0},
    "V100": {"fp16": 125.0, "fp32": 15.7},  # SXM2
    "T4": {"fp16": 65.0, "fp32": 8.1},
}


@dataclass
class Runtime:
    """The resolved device settings the trainer uses."""

    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means autocast is off
    compile: bool
    dtype_reason: str = ""  # why this dtype: the setting, or what device.dtype=auto measured
    attention_kernel: SDPBackend | None = None  # SDPA's kernel (`choose_cpu_attention`); None: torch's choice

    @property
    def type(self) -> str:
        return self.device.type

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The context for forward passes: autocast to `dtype` (nothing in float32), and SDPA's kernel where
        one was chosen."""
        with contextlib.ExitStack() as context:
            if self.dtype != torch.float32:
                context.enter_context(torch.autocast(device_type=self.device.type, dtype=self.dtype))
            if self.attention_kernel is not None:
                context.enter_context(sdpa_kernel(self.attention_kernel))
            yield

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A loss scaler, enabled only for float16 (a disabled scaler is a no-op with the same API)."""
        enabled = self.dtype == torch.float16
        return torch.amp.GradScaler(self.device.type if enabled else "cpu", enabled=enabled)

    def synchronize(self) -> None:
        """Wait for queued device work; called only at log intervals, to time honestly."""
        synchronize(self.device)


def resolve_runtime(cfg: DeviceConfig, local_rank: int = 0, *, probe_cache: Path | None = None,
                    cpu_probe: Callable[[Path | None], MatmulProbe] = cpu_matmul_probe) -> Runtime:
    """Pick the device, the autocast dtype and whether to compile; enable TF32 on CUDA if asked, and on a CPU
    make malloc keep freed memory (allocator.py) unless device.keep_freed_memory=false.

    device.dtype=auto on a CPU runs `cpu_probe` (cached in `probe_cache`, see probe.py) and lets
    `choose_cpu_dtype` decide; the log line says what was chosen and why."""
    device = _pick_device(cfg.type, local_rank)
    dtype, why = _pick_dtype(cfg.dtype, device, lambda: cpu_probe(probe_cache))
    # On a CPU compiling stays opt-in: Inductor needs a C++ toolchain at run time, which a first user may not
    # have and should not need, and the first compile takes tens of seconds of a short run (what it buys is
    # measured by `scripts/bench.py only=[compile]`, docs/performance.md). On CUDA it pays within minutes.
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
    log.info("device %s, autocast dtype %s (%s), compile %s", device, dtype_name, why, compile_model)
    if device.type == "cpu" and cfg.keep_freed_memory:
        log.info("memory: %s", keep_freed_memory())
    return Runtime(device=device, dtype=dtype, compile=compile_model, dtype_reason=why)


# bf16 autocast must beat fp32 matmuls by this factor before it is chosen on a CPU. Only the matmuls speed up
# (about two thirds of a training step's time; the norms, GELU, softmax and AdamW stay as fast as they were),
# and autocast adds a cast of every weight per step: a 1.5x faster matmul makes a step about 1.2x faster. A
# smaller margin would trade a few percent at best against bf16's coarser rounding.
BF16_MIN_SPEEDUP = 1.5


def choose_cpu_dtype(probe: MatmulProbe) -> tuple[torch.dtype, str]:
    """The autocast dtype for device.dtype=auto on a CPU, from its measured matmul rates, and why."""
    rates = (f"{probe.source} {probe.n}x{probe.n} matmuls: bf16 {probe.bf16_flops / 1e9:.1f} GFLOP/s, "
             f"fp32 {probe.fp32_flops / 1e9:.1f}")
    if probe.bf16_speedup >= BF16_MIN_SPEEDUP:
        return torch.bfloat16, f"auto: {rates}, bf16 {probe.bf16_speedup:.2f}x faster"
    return torch.float32, (f"auto: {rates}; bf16 is {probe.bf16_speedup:.2f}x fp32, "
                           f"under the {BF16_MIN_SPEEDUP}x it needs to pay")


# SDPA's math kernel must beat the fused one torch picks by this factor, at the run's own shape, before a CPU
# run uses it: a smaller margin would follow the noise of a few timed calls.
SDPA_MATH_MIN_SPEEDUP = 1.2


def choose_cpu_attention(times: dict[str, float], source: str = "measured") -> tuple[SDPBackend | None, str]:
    """SDPA's kernel for a CPU run from `probe.time_sdpa`'s seconds ("fused", "math"), and why. On a CPU the
    fused (flash) kernel is made for long sequences; at a small model's few heads of 32 channels in bf16 the
    plain matmuls and softmax of the math kernel can be faster."""
    fused, math_kernel = times["fused"], times["math"]
    why = f"{source}: forward and backward {fused * 1e3:.2f} ms fused, {math_kernel * 1e3:.2f} ms math"
    if fused >= SDPA_MATH_MIN_SPEEDUP * math_kernel:
        return SDPBackend.MATH, f"SDPA's math kernel ({why})"
    return None, f"SDPA's fused kernel ({why})"


def with_cpu_attention(runtime: Runtime, shape: tuple[int, int, int, int, int], cache_dir: Path | None,
                       probe: Callable[..., tuple[dict[str, float], str]] = cpu_sdpa_probe) -> Runtime:
    """`runtime` with SDPA's kernel for attention of `shape` on a CPU, from the probe's seconds (measured
    once per machine and shape, and cached in `cache_dir`: see `probe.cpu_sdpa_probe`)."""
    kernel, why = choose_cpu_attention(*probe(cache_dir, shape, runtime.dtype))
    log.info("attention: %s", why)
    return dataclasses.replace(runtime, attention_kernel=kernel)


def inference_device(device: str, weights_dtype: str) -> tuple[torch.device, torch.dtype]:
    """The device (`device.type` of a tool) and the weights' dtype (`weights_dtype`) for generation and tools.

    weights_dtype=auto: bfloat16 on a CUDA GPU that has it (float16 on older ones), float32 elsewhere: on a
    CPU the float32 kernels are the mature ones, and 16-bit weights there are an explicit choice.
    """
    torch_device = _pick_device(device, 0)
    name = weights_dtype
    if name == "auto":
        if torch_device.type == "cuda":
            name = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            name = "float32"
    if name == "float16" and torch_device.type == "cpu":
        raise UserError("weights_dtype=float16 is not supported on CPU (use float32 or bfloat16)")
    return torch_device, _DTYPES[name]


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
        raise UserError("device.type=mps but MPS is not available (use device=cpu or auto)")
    return torch.device(kind)


def _pick_dtype(name: str, device: torch.device, probe: Callable[[], MatmulProbe]) -> tuple[torch.dtype, str]:
    """The autocast dtype and why; `probe` is called only for auto on a CPU."""
    if name == "auto":
        if device.type == "cuda":
            # bf16 needs Ampere or newer; older GPUs get fp16 with loss scaling.
            if torch.cuda.is_bf16_supported():
                return torch.bfloat16, "auto: the GPU has bf16"
            return torch.float16, "auto: the GPU has no bf16, so fp16 with loss scaling"
        if device.type == "cpu":
            # Some CPUs compute bf16 natively (AMX, AVX512-BF16) at twice the fp32 rate or more; others
            # (AVX2-only ones) emulate it about 100x slower than fp32. Only a measurement tells.
            return choose_cpu_dtype(probe())
        return torch.float32, "auto: float32 on MPS"  # autocast on MPS gains little for models this small
    dtype = _DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise UserError("device.dtype=float16 is not supported on CPU (use bfloat16 or float32)")
    return dtype, f"device.dtype={name}"


def matmul_dtype_key(dtype: torch.dtype) -> str:
    """The GPU_PEAK_TFLOPS column for matmuls in `dtype` on CUDA: float32 runs as TF32 when it is allowed."""
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def datasheet_tflops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """Dense TFLOP/s of a known CUDA device for matmuls in `dtype` (GPU_PEAK_TFLOPS), else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    keys = sorted(GPU_PEAK_TFLOPS, key=len, reverse=True)  # the most specific name first
    row = next((GPU_PEAK_TFLOPS[key] for key in keys if key in name), None)
    return None if row is None else row.get(matmul_dtype_key(dtype))


def peak_flops(cfg: DeviceConfig, runtime: Runtime) -> float:
    """FLOP/s one device reaches with matmuls in `runtime.dtype` (the autocast dtype): MFU's denominator.

    `device.peak_tflops` when set (meaning that dtype's peak), else the datasheet for a known GPU, else a
    measured probe: the best rate of 512x512 matmuls in that dtype over 0.2 s (on a CPU under bf16
    autocast, bf16 matmuls, ~100x slower than fp32 on CPUs without bf16 units). A probe is an estimate, not
    a bound, so the MFU meter raises the peak to the model's own rate if it ever beats it
    (training/budget.py).
    """
    if cfg.peak_tflops is not None:
        return cfg.peak_tflops * 1e12
    tflops = datasheet_tflops(runtime.device, runtime.dtype)
    if tflops is not None:
        return tflops * 1e12
    return measure_matmul_flops(512, runtime.dtype, runtime.device, seconds=0.2)
