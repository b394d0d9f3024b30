"""The benchmark suite: which sections run, at which sizes, and what they return.

`run_suite` is what `scripts/bench.py` calls. The full run takes a few minutes on two CPU cores;
`quick=True` shrinks every section (smaller training shapes, fewer tokens and repeats) to finish in
under a minute, for smoke tests. Sections:

    peak        measured fp32/bf16 matmul FLOP/s (the MFU denominator)
    train_S     training step, shape S (train_M: shape M; `train` selects both)
    generation  cached / uncached / HF generate, latency by position, prefill
    attention   math / online / sdpa forward time and memory at growing T
    data        default-corpus prepare time, encode MB/s
    train_loop  (only when asked for) sustained training with the trainer's step code: GPT-2 small with
                bf16 + compile on CUDA (scripts/device_check.sh), a tiny smoke shape on CPU

bf16 contenders of the training step run only where bf16 matmuls are at least half as fast as
fp32 ones: on a CPU without native bf16 units (AVX2-only, like the project's 2-core machine) they
are emulated ~50x slower and would take minutes per step to confirm what the peak already says.
"""

from __future__ import annotations

import os
import platform
import time

import torch

from minigpt.bench.attention import bench_attention
from minigpt.bench.data import bench_data
from minigpt.bench.generation import bench_generation
from minigpt.bench.peak import bench_peak
from minigpt.bench.train_loop import bench_train_loop
from minigpt.bench.train_step import QUICK_SHAPES, SHAPES, bench_train_step
from minigpt.errors import UserError


def train_contenders(peak: dict, quick: bool, compile_: bool | None, shape: str = "M") -> tuple[tuple, list]:
    """The training contenders worth running here, and a note for each one left out.

    torch.compile costs 30-60 s per model on a 2-core CPU, so by default it is measured on shape M
    only (the shape of the issue's targets), and not at all with --quick; --compile forces it."""
    names = ["minigpt fp32 simple", "minigpt fp32", "reference fp32"]
    notes = []
    bf16_ok = peak["bf16_flops"] >= 0.5 * peak["fp32_flops"]
    if bf16_ok:
        names.append("minigpt bf16")
    else:
        notes.append(f"bf16 contenders skipped: bf16 matmuls run at {peak['bf16_flops'] / 1e9:.2f} GFLOP/s "
                     f"here, fp32 at {peak['fp32_flops'] / 1e9:.1f} (no native bf16 units)")
    if compile_ if compile_ is not None else (not quick and shape == "M"):
        names.append("minigpt compile fp32")
        if bf16_ok:
            names.append("minigpt compile bf16")
    else:
        notes.append("torch.compile contenders skipped (by default measured on shape M only; --compile)")
    return tuple(names), notes


def run_suite(sections: list[str], device: torch.device, quick: bool = False, compile_: bool | None = None,
              log=print) -> dict:
    """Run `sections` in order; returns {"machine": ..., "sections": {name: result}}."""
    start = time.perf_counter()
    cpu = f"CPU ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores)"
    results: dict = {
        "machine": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "quick": quick,
            "python": platform.python_version(),
        },
        "sections": {},
    }
    out = results["sections"]
    peak = None
    for name in sections:
        t0 = time.perf_counter()
        log(f"[bench] {name} ...")
        try:
            if name == "peak" or (name in ("train_S", "train_M") and peak is None):
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
    return results


def _run_section(name: str, device: torch.device, quick: bool, compile_: bool | None,
                 peak: dict | None) -> dict:
    if name in ("train_S", "train_M"):
        shape = (QUICK_SHAPES if quick else SHAPES)[name.removeprefix("train_")]
        names, notes = train_contenders(peak, quick, compile_, name.removeprefix("train_"))
        # MFU against the datasheet on a known GPU (bf16), else the measured fp32 matmul peak
        denom = peak["datasheet_tflops"] * 1e12 if peak.get("datasheet_tflops") else peak["fp32_flops"]
        result = bench_train_step(shape, names, device, denom, repeats=1 if quick else 3)
        result["notes"] = notes
        return result
    if name == "generation":
        if quick:  # the same model; fewer tokens and repeats
            return bench_generation(device, new_tokens=16, repeats=1, latency_repeats=2,
                                    latency_positions=(64, 1000))
        return bench_generation(device)
    if name == "attention":
        lengths = (512, 2048) if quick else (512, 2048, 8192)
        return bench_attention(device, lengths=lengths, repeats=1 if quick else 2)
    if name == "data":
        return bench_data(quick=quick, repeats=1 if quick else 3)
    if name == "train_loop":  # GPT-2 small takes minutes per step on a CPU: smoke-sized there
        return bench_train_loop(device, smoke=quick or device.type != "cuda")  # dtype, compile: the trainer's
    raise ValueError(f"unknown section {name}")
