"""What this machine's matmul units and memory can do, measured: a CPU has no datasheet to trust (shared,
virtualised, frequency-scaled cores, and bf16 units some CPUs have and others emulate ~100x slower).

    synchronize             wait for queued device work, so a clock measures the work and not its launch
    measure_matmul_flops    best FLOP/s of square matmuls in a dtype: the denominator of MFU
    measure_read_bandwidth  best bytes/s of reading a buffer larger than the caches: the denominator of MBU
    cpu_matmul_probe        this CPU's fp32 and bf16 matmul FLOP/s, measured once per machine and cached;
                            `runtime.choose_cpu_dtype` decides the autocast dtype from it
    time_sdpa               seconds of attention's forward and backward at a run's own shape, with torch's
                            fused kernel and with its math kernel
    cpu_sdpa_probe          those seconds for this CPU and shape, measured once and cached beside the matmul
                            probe; `runtime.choose_cpu_attention` decides SDPA's kernel from them
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

log = logging.getLogger(__name__)

# The probe's size: (256 x 256) @ (256 x 256) is large enough for the bf16 kernels (AMX tiles, AVX-512 BF16)
# to reach most of their rate, and small enough that a CPU which emulates bf16 (~1 GFLOP/s) spends ~35 ms
# per call: the whole probe stays under half a second on any machine.
PROBE_N = 256
PROBE_SECONDS = 0.1  # per dtype, after one warm-up call
CACHE_FILE = "device_probe.json"  # in the data cache folder (see `cpu_matmul_probe`)


def synchronize(device: torch.device | str) -> None:
    """Wait until the device has finished its queued work (a no-op on CPU, whose ops run when called)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measure_matmul_flops(n: int, dtype: torch.dtype, device: torch.device, seconds: float = 0.5) -> float:
    """Best FLOP/s of (n x n) @ (n x n) in `dtype`: batches of calls are timed, the fastest batch counts.

    Square matmuls of a few hundred rows and more are the most favourable work the machine does, so a model's
    MFU against this says how close its mix of ops comes to the best case.
    """
    gen = torch.Generator().manual_seed(0)  # its own generator: the training RNG stream stays untouched
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: thread pool, packing buffers, kernel selection
    return _best_rate(lambda: torch.matmul(a, b, out=out), 2 * n**3, device, seconds)


def measure_read_bandwidth(device: torch.device, nbytes: int = 256 * 2**20, seconds: float = 0.5) -> float:
    """Best bytes/s of reading an `nbytes` float32 buffer once (far larger than a CPU's last-level cache).

    Two readers, the faster counts: a sum, and a one-row product against the buffer laid out as a matrix
    (the very access of a decode step reading a weight). A decode step's MBU against this says how close it
    comes to just streaming its weights and KV cache from memory.
    """
    # constant values: a read costs the same whatever it reads, and no RNG (nor a CPU-side copy) is involved
    buf = torch.full((nbytes // 4,), 0.5, device=device)  # (n,)
    mat = buf.view(-1, 1024)  # (n / 1024, 1024): read row after row by the product below
    row = torch.full((1, mat.shape[0]), 0.5, device=device)  # (1, n / 1024)
    out = torch.empty(1, 1024, device=device)
    readers = (lambda: buf.sum(), lambda: torch.mm(row, mat, out=out))
    best = 0.0
    for read in readers:
        read()  # warm-up
        best = max(best, _best_rate(read, buf.numel() * 4, device, seconds / len(readers)))
    return best


def _best_rate(fn, work: float, device: torch.device, seconds: float) -> float:
    """Best `work` per second of `fn`: batches of calls, doubled until one lasts 50 ms, for `seconds`."""
    best, deadline, calls = 0.0, time.perf_counter() + seconds, 1
    while True:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        elapsed = time.perf_counter() - start
        best = max(best, work * calls / elapsed)
        if time.perf_counter() > deadline:
            return best
        if elapsed < 0.05:  # too short to time reliably: make the batch bigger
            calls *= 2


def time_sdpa(shape: tuple[int, int, int, int, int], dtype: torch.dtype, device: torch.device,
              repeats: int = 5) -> dict[str, float]:
    """Median seconds of one causal `scaled_dot_product_attention` forward and backward at `shape` = (batch,
    query heads, key/value heads, sequence, head size) in `dtype`: "fused", the kernel torch picks, and
    "math", its explicit one, timed alternately after one untimed call each, so that a machine that slows
    down slows both. On a CPU which is faster depends on the shape, the dtype and the CPU: a run measures.
    """
    b, h, h_kv, t, d = shape
    gen = torch.Generator().manual_seed(0)  # its own generator: the training RNG stream stays untouched
    q, k, v = (torch.randn(b, heads, t, d, generator=gen).to(device, dtype).requires_grad_()
               for heads in (h, h_kv, h_kv))
    kernels = {"fused": contextlib.nullcontext, "math": lambda: sdpa_kernel(SDPBackend.MATH)}

    def call(kernel) -> float:
        start = time.perf_counter()
        with kernel():
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 enable_gqa=h_kv != h)
        y.sum().backward()
        synchronize(device)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in kernels}
    for i in range(repeats + 1):
        for name, kernel in kernels.items():
            seconds = call(kernel)
            if i:  # the first call of each allocates and warms up
                times[name].append(seconds)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


@dataclass(frozen=True)
class MatmulProbe:
    """Measured matmul rates of one CPU (FLOP/s), and where the numbers came from."""

    fp32_flops: float
    bf16_flops: float
    n: int = PROBE_N
    source: str = "measured"  # measured | cached (read from the cache file)

    @property
    def bf16_speedup(self) -> float:
        return self.bf16_flops / self.fp32_flops


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The first CPU's feature flags as /proc/cpuinfo lists them ([] where there is none: not Linux)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return []
    return next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (`AMD EPYC 7763 64-Core Processor`) from /proc/cpuinfo; elsewhere platform's.

    Virtual machines often report a bare family name (`AMD EPYC`) that two generations share, with different
    speeds and instruction sets; the x86 family and model numbers then tell them apart:
    `AMD EPYC (family 26, model 2)`."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text().splitlines():
            if not line.strip() and fields:
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass  # not Linux
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    if not any(c.isdigit() for c in name) and "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def machine_key() -> str:
    """What the probe's result depends on: the CPU model, its vector ISA as torch sees it, and torch."""
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{cpu_model()} | {capability} | torch {torch.__version__}"


def cpu_matmul_probe(cache_dir: Path | None) -> MatmulProbe:
    """fp32 and bf16 matmul FLOP/s of one core of this CPU: read from `cache_dir`/device_probe.json, else
    measured (a fraction of a second) and written there.

    The data cache folder (`data.cache_dir`) holds it because it is already where minigpt keeps what it can
    recompute (git-ignored, configurable, relative to the launch folder, and pointed at a temporary folder by
    the tests, so no test writes outside its own). One file maps each `machine_key()` to its numbers: a folder
    shared by several machines, or an upgraded torch, gets a fresh measurement. A missing, unreadable or
    damaged cache is measured again; a folder that cannot be written costs only the re-measurement next time.
    """

    def measure() -> dict[str, float]:
        cpu, threads = torch.device("cpu"), torch.get_num_threads()
        # On one thread: the ratio is a property of a core's units, and a single thread is never stalled
        # waiting for a sibling thread the OS has descheduled, which on a busy machine can make fp32 read as
        # slow as emulated bf16 and pick the wrong dtype.
        torch.set_num_threads(1)
        try:
            return {"fp32_flops": measure_matmul_flops(PROBE_N, torch.float32, cpu, PROBE_SECONDS),
                    "bf16_flops": measure_matmul_flops(PROBE_N, torch.bfloat16, cpu, PROBE_SECONDS),
                    "n": PROBE_N}
        finally:
            torch.set_num_threads(threads)

    rates, source = _cached(cache_dir, machine_key(), {"fp32_flops", "bf16_flops", "n"}, measure)
    return MatmulProbe(**rates, source=source)


def cpu_sdpa_probe(cache_dir: Path | None, shape: tuple[int, int, int, int, int], dtype: torch.dtype,
                   timer=time_sdpa) -> tuple[dict[str, float], str]:
    """`time_sdpa`'s seconds for `shape` in `dtype` on this CPU, and where they came from ("measured" or
    "cached"): read from the cache `cpu_matmul_probe` keeps, else timed and written there. Cached because
    the choice they decide changes how a run rounds: a run that resumes, or one run beside another, must
    make the one its predecessor made on this machine, whatever the load when each started."""
    key = f"{machine_key()} | sdpa {'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')}"
    return _cached(cache_dir, key, {"fused", "math"}, lambda: timer(shape, dtype, torch.device("cpu")))


def _cached(cache_dir: Path | None, key: str, fields: set[str], measure: Callable[[], dict[str, float]]
            ) -> tuple[dict[str, float], str]:
    """The numbers kept under `key` in `cache_dir`/device_probe.json, where an entry with exactly `fields`
    is there ("cached"), else `measure()`'s, written there ("measured"); an entry of another layout is
    measured again."""
    path = cache_dir / CACHE_FILE if cache_dir is not None else None
    entries = _read_cache(path)
    kept = entries.get(key)
    if isinstance(kept, dict) and set(kept) == fields:
        return kept, "cached"
    numbers = measure()
    if path is not None:
        entries[key] = numbers
        _write_cache(path, entries)
    return numbers, "measured"


def _read_cache(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, unreadable, or half a file: a cache, so measure again
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict) -> None:
    """Write atomically (a reader sees the old file or the new one, never half), or log why not."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not cache the CPU probes in %s (%s); they will be measured again next run",
                    path, e.strerror or e)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
