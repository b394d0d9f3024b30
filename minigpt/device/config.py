"""Device and precision settings, as dataclasses without torch (Hydra's schemas import this module).

Every command picks its device with the same group (`device=auto|cpu|cuda|mps`, YAML `configs/device/`,
which sets only `device.type`). Training and inference mean different things by "dtype", so they are
different keys:

- training keeps float32 weights and optimizer state, and `device.dtype` is the *autocast* dtype the matmuls
  run in (mixed precision);
- generation and evaluation have no optimizer, so the weights themselves can be stored in a 16-bit type:
  the tools' `weights_dtype` is the dtype of the weights and the KV cache. Their `device` section has no
  `dtype`, `compile` or `tf32` key, so a training-only setting given to a tool is refused, not ignored.

`device.threads` is the same key for all of them: the intra-op CPU threads (threads.py), one per free core
unless set.
"""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.errors import UserError

DEVICE_TYPES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class DeviceConfig:
    """Where and in which precision to train (`device/runtime.py`)."""

    type: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    dtype: str = "auto"  # autocast dtype: auto | float32 | bfloat16 | float16 (auto: see runtime.py)
    compile: bool | None = None  # torch.compile the model; None: the measured default for the device
    tf32: bool = True  # TF32 matmuls on Ampere+ GPUs: ~8x the fp32 rate, 10-bit mantissa is ample here
    peak_tflops: float | None = None  # for MFU; None: known GPU table, else a quick matmul measurement
    threads: int | None = None  # intra-op CPU threads; None: the free cores, measured (device/threads.py)
    keep_freed_memory: bool = True  # on a CPU malloc keeps what a step frees for the next (allocator.py)

    def __post_init__(self) -> None:
        check_choice("device.type", self.type, DEVICE_TYPES)
        check_choice("device.dtype", self.dtype, DTYPES)
        check_threads("device.threads", self.threads)
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise UserError(f"device.peak_tflops={self.peak_tflops} must be positive (or null)")


@dataclass
class InferenceDeviceConfig:
    """Where a tool (generate, evaluate, the inspection tools) runs a model: `device=<option>`."""

    type: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    threads: int | None = None  # intra-op CPU threads; None: the free cores, measured (device/threads.py)

    def __post_init__(self) -> None:
        check_choice("device.type", self.type, DEVICE_TYPES)
        check_threads("device.threads", self.threads)


def check_weights_dtype(weights_dtype: str, int8: bool = False) -> None:
    """Validate a tool's `weights_dtype=` (auto: see `runtime.inference_device`). int8 (weight-only int8
    linear layers, `model/int8.py`) only where the tool offers it: generation."""
    check_choice("weights_dtype", weights_dtype, DTYPES + (("int8",) if int8 else ()))


def check_threads(key: str, threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise UserError(f"{key}={threads} must be at least 1 (or null: as many as there are free cores)")


def check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r} is not one of: {', '.join(allowed)}")
