"""The benchmark suite: which sections run, at which sizes, and what they return.

`run_suite` is what `scripts/bench.py` calls. The full run takes a few minutes on two CPU cores;
`quick=True` shrinks every section (smaller training shapes, fewer tokens and repeats) to finish in
under a minute, for smoke tests. Sections:

    peak        measured fp32/bf16 matmul FLOP/s and read bandwidth (the MFU and MBU denominators)
    train_S     training step, shape S (train_M: shape M; `train` selects both), fp32 and bf16 autocast
    generation  decoding shape W2: minigpt fp32 / bf16 / int8, eager and compiled, against HF generate and
                llama.cpp (f32 / bf16 / q8_0) and the uncached path; MBU, the targets, latency by position and
                the op overhead of a step, prefill
    default_decode   the Llama-style model (`model=demo`) decoding at batch 1, eager and compiled
    first_token      a trained checkpoint's time to first token in a fresh process: eager, compiled with the
                     decode-step cache cold and warm, beside each one's tokens/s
    decode_batch     W2 at batch 1, 4, 16, 64: tokens/s, per-token latency, where throughput saturates
    speculative      W2 with int8 / bf16 copies drafting: acceptance rate and speed-up
    step_spread      W2 compiled steps against equal copies and their streamed twins: the spread a choice
                     between whole steps must beat
    decode_accuracy  a trained checkpoint in bf16 and int8 against float32: logits, greedy tokens, val loss
    (`decoding` selects these seven)
    attention   math / online / sdpa forward time and memory at growing T
    data        default-corpus prepare time, encode MB/s
    train_loop  (only when asked for) sustained training with the trainer's step code: GPT-2 small with
                bf16 + compile on CUDA (scripts/device_check.sh), a tiny smoke shape on CPU
    compile     (only when asked for) does torch.compile pay for the Llama-style run (TrainConfig())?
                compile time, eager vs compiled steps, break-even step count
    techniques  (only when asked for) the trainer's step of the Llama-style model with each technique switch
                on, relative to the default's (docs/tricks.md)
    busy        (only when asked for) training tokens/s alone and beside a busy loop, with the thread count
                measured and fixed (docs/performance.md)

bf16 contenders of the training step (and the reference's bf16 generation) run only where bf16 matmuls
are at least half as fast as fp32 ones: on a CPU without native bf16 units (AVX2-only) they are emulated
about 100x slower and would take minutes per step to confirm what the peak already says.

The decoding sections compile their decode steps unless --no-compile (or --quick) says otherwise; each
compiled model is a graph of its own for Dynamo, whose default limit of 8 per function would send the
later ones back to eager, so the limit is raised while they run.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from minigpt.data.config import DataConfig
from minigpt.data.encode import cpu_count
from minigpt.device.config import DeviceConfig
from minigpt.device.cpu_load import CpuLoad
from minigpt.device.probe import cpu_flags, cpu_model
from minigpt.device.runtime import resolve_runtime
from minigpt.errors import UserError
from minigpt.lab.bench.attention import bench_attention
from minigpt.lab.bench.busy import bench_busy
from minigpt.lab.bench.compile import bench_compile
from minigpt.lab.bench.data import bench_data
from minigpt.lab.bench.decode_accuracy import bench_decode_accuracy
from minigpt.lab.bench.decode_batch import bench_decode_batch
from minigpt.lab.bench.default_decode import bench_default_decode
from minigpt.lab.bench.first_token import bench_first_token
from minigpt.lab.bench.generation import bench_generation
from minigpt.lab.bench.peak import bench_peak
from minigpt.lab.bench.sections import DECODING
from minigpt.lab.bench.speculative import bench_speculative
from minigpt.lab.bench.step_spread import bench_step_spread
from minigpt.lab.bench.techniques import bench_techniques
from minigpt.lab.bench.train_loop import bench_train_loop
from minigpt.lab.bench.train_step import QUICK_SHAPES, SHAPES, bench_train_step

BUSY_WARNING = 0.25  # cores kept busy by other processes above which the report warns (an idle box: ~0.01)
BUSY_SECONDS = 0.5  # how long the other processes' load is measured, before the run and after it


def bf16_units() -> list[str]:
    """The bfloat16 instruction sets /proc/cpuinfo lists for this CPU (avx512_bf16, amx_bf16), or []."""
    return sorted(f for f in cpu_flags() if f in ("avx512_bf16", "amx_bf16", "avx_ne_convert"))


def bf16_is_fast(peak: dict) -> bool:
    """Whether bf16 matmuls run at least half as fast as fp32 here (native units), by the peak section."""
    return peak["bf16_flops"] >= 0.5 * peak["fp32_flops"]


def train_contenders(peak: dict, quick: bool, compile_: bool | None, shape: str = "M") -> tuple[tuple, list]:
    """The training contenders worth running here, and a note for each one left out.

    Each path runs in fp32 and, where bf16 matmuls are fast, under bf16 autocast: the reference too, so every
    table compares best with best. torch.compile costs tens of seconds per model on a small CPU, so by default
    it is measured on shape M only, and not at all with quick=true; compile= forces it."""
    dtypes = ["fp32"]
    notes = []
    if bf16_is_fast(peak):
        dtypes.append("bf16")
    else:
        notes.append(f"bf16 contenders skipped: bf16 matmuls run at {peak['bf16_flops'] / 1e9:.2f} GFLOP/s "
                     f"here, fp32 at {peak['fp32_flops'] / 1e9:.1f} (no native bf16 units)")
    names = [f"{who} {d}{suffix}" for d in dtypes
             for who, suffix in (("minigpt", " simple"), ("minigpt", ""), ("reference", ""))]
    if compile_ if compile_ is not None else (not quick and shape == "M"):
        names += [f"minigpt compile {d}" for d in dtypes]
    else:
        notes.append("torch.compile contenders skipped (by default measured on shape M only; --compile)")
    return tuple(names), notes


def trainer_default(device: torch.device) -> dict:
    """The contender `make train` runs on this machine: device.dtype=auto and device.compile's default,
    decided as the trainer decides them (the CPU probe cached in the default data.cache_dir)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        runtime = resolve_runtime(DeviceConfig(type=device.type), probe_cache=Path(DataConfig().cache_dir))
    finally:  # resolving turns TF32 on for CUDA training; the bench's fp32 rows keep their own setting
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    short = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(runtime.dtype)
    row = None if short is None else f"minigpt {'compile ' if runtime.compile else ''}{short}"
    return {"row": row, "dtype": str(runtime.dtype).removeprefix("torch."), "compile": runtime.compile,
            "reason": runtime.dtype_reason}


def run_suite(sections: list[str], device: torch.device, quick: bool = False, compile_: bool | None = None,
              log=print) -> dict:
    """Run `sections` in order; returns {"machine": ..., "sections": {name: result}}."""
    busy = CpuLoad().measure(BUSY_SECONDS)  # before any thread of ours starts
    if busy is not None and busy > BUSY_WARNING:
        log(f"warning: other processes keep {busy:.1f} of {cpu_count()} cores busy: a parallel op waits for "
            "its slowest thread, so timings here can be far off; run the bench on an idle machine")
    start = time.perf_counter()
    capability = torch.backends.cpu.get_cpu_capability()
    cpu = f"{cpu_model()} ({platform.machine()}, {capability}, {cpu_count()} cores)"
    results: dict = {
        "machine": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "quick": quick,
            "python": platform.python_version(), "bf16_units": bf16_units(), "busy_cores_before": busy,
        },
        "sections": {},
    }
    out = results["sections"]
    peak = None
    for name in sections:
        t0 = time.perf_counter()
        log(f"[bench] {name} ...")
        try:
            if name == "peak" or (name in ("train_S", "train_M", *DECODING) and peak is None):
                peak = bench_peak(device, quick)
                if name == "peak":
                    out["peak"] = peak
            if name != "peak":
                out[name] = _run_section(name, device, quick, compile_, peak)
        except Exception as e:  # one broken section (e.g. no transformers) must not lose the others
            if isinstance(e, UserError) and len(sections) == 1:
                raise
            out[name] = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
        log(f"[bench] {name} done in {time.perf_counter() - t0:.1f} s")
    results["machine"]["wall_s"] = time.perf_counter() - start
    results["machine"]["busy_cores_after"] = CpuLoad().measure(BUSY_SECONDS)
    return results


def _run_section(name: str, device: torch.device, quick: bool, compile_: bool | None,
                 peak: dict | None) -> dict:
    if name in ("train_S", "train_M"):
        shape = (QUICK_SHAPES if quick else SHAPES)[name.removeprefix("train_")]
        names, notes = train_contenders(peak, quick, compile_, name.removeprefix("train_"))
        default = trainer_default(device)  # first: resolving sets the CPU allocator the trainer runs with
        result = bench_train_step(shape, names, device, peak, repeats=1 if quick else 3)
        result["notes"] = notes + result["notes"]
        result["trainer_default"] = default
        return result
    if name in DECODING:
        with torch._dynamo.config.patch(recompile_limit=64):
            return _run_decoding(name, device, quick, compile_ if compile_ is not None else not quick, peak)
    if name == "attention":
        lengths = (512, 2048) if quick else (512, 2048, 8192)
        return bench_attention(device, lengths=lengths, repeats=1 if quick else 2)
    if name == "data":
        return bench_data(quick=quick, repeats=1 if quick else 3)
    if name == "compile":
        return bench_compile(device, quick=quick)
    if name == "techniques":
        return bench_techniques(device, quick=quick)
    if name == "busy":  # CPU training beside a busy loop, whatever the device
        return bench_busy(quick=quick)
    if name == "train_loop":  # GPT-2 small takes minutes per step on a CPU: smoke-sized there
        return bench_train_loop(device, smoke=quick or device.type != "cuda")  # dtype, compile: the trainer's
    raise ValueError(f"unknown section {name}")


def _run_decoding(name: str, device: torch.device, quick: bool, compile_: bool, peak: dict) -> dict:
    bandwidth = peak["read_bytes_per_s"]
    if name == "generation":
        kw = {"read_bytes_per_s": bandwidth, "reference_bf16": bf16_is_fast(peak), "compile": compile_}
        if quick:  # the same model; fewer tokens and repeats
            return bench_generation(device, new_tokens=16, repeats=1, latency_repeats=2,
                                    latency_positions=(64, 1000), **kw)
        return bench_generation(device, **kw)
    if name == "default_decode":
        sizes = {"new_tokens": 32, "repeats": 1} if quick else {}
        return bench_default_decode(device, compile=compile_, **sizes)
    if name == "first_token":  # compile_ off: eager only (a cold compiled start takes minutes)
        return bench_first_token(repeats=1 if quick else 3, compile=compile_)
    if name == "decode_batch":
        sizes = {"batch_sizes": (1, 4), "new_tokens": 8, "repeats": 1} if quick else {}
        return bench_decode_batch(device, compile=compile_, read_bytes_per_s=bandwidth, **sizes)
    if name == "speculative":
        sizes = {"new_tokens": 16, "draft_tokens": (2,), "repeats": 1} if quick else {}
        return bench_speculative(device, compile=compile_, **sizes)
    if name == "step_spread":
        return bench_step_spread(device, runs=1 if quick else 5, compile=compile_)
    return bench_decode_accuracy(**({"windows": 2, "prompts": 1, "new_tokens": 16, "max_tokens": 4096}
                                    if quick else {}))
