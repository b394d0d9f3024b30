"""What a measured call costs besides time, and what else the machine is doing while the bench runs.

(The timing itself, interleaved rounds and their summaries, is the wing's harness: minigpt/fast/timing.py.)

Other processes: a busy core does more than slow the bench down. A parallel op waits at its end for every
thread, and on a machine whose cores are all taken one of its threads may be descheduled for a whole time
slice, so a small op can take a thousand times its time. The suite measures, while the bench sleeps, how
many cores something else keeps busy (`device/cpu_load.py`); the report states it and warns when it is not
near zero.

Peak memory: on CUDA, torch's max-allocated counter (reset before each measured call). On CPU,
the process's resident-set high-water mark (VmHWM), reset through /proc/self/clear_refs on
Linux, minus the resident size before the call: the extra memory the call touched. glibc's malloc
would serve a tensor from memory an earlier tensor freed (already resident: invisible to VmHWM), so
freed heap pages are handed back first (`malloc_trim`) and during the measured call every allocation
above 16 KiB is made a fresh mmap (`mallopt`), whose pages count when touched and leave when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path

import torch

from minigpt.device.probe import synchronize

# ---------------------------------------------------------------------------------------------- memory

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    """Reset VmHWM to the current RSS ("5" in clear_refs, Linux >= 4.0); False where unsupported."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)
_MEASURE_MMAP_BYTES = 16 * 1024
_NORMAL_MMAP_BYTES = 32 * 1024 * 1024  # glibc's own ceiling for its adaptive threshold on 64-bit


def _libc_call(name: str, *args: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(getattr(libc, name)(*args))
    except (OSError, AttributeError):  # not glibc: measure without it
        return False


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str | None = None) -> int | None:
    """Extra memory one call of `fn` needs at its peak, in bytes; None where it cannot be measured.

    CUDA: max allocated during the call minus allocated before it. CPU: resident-set high-water
    mark during the call minus the resident size before it (memory freed and reused inside the
    call counts once, memory already resident counts zero).
    """
    if device is not None and torch.device(device).type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    _libc_call("malloc_trim", 0)  # hand freed heap pages back, so reusing them counts again
    _libc_call("mallopt", _M_MMAP_THRESHOLD, _MEASURE_MMAP_BYTES)
    try:
        if not _reset_rss_peak():
            return None
        before = _status_kib("VmRSS")
        fn()
        peak = _status_kib("VmHWM")
    finally:
        # a fixed threshold at glibc's adaptive ceiling: what a warmed-up process runs with anyway
        _libc_call("mallopt", _M_MMAP_THRESHOLD, _NORMAL_MMAP_BYTES)
        _libc_call("mallopt", _M_TRIM_THRESHOLD, 2 * _NORMAL_MMAP_BYTES)
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024
