"""A CPU run's malloc keeps the memory a step frees (device/allocator.py).

The effect is measured by the kernel, not by the code: the page faults a fresh process takes while it
allocates and frees a step's worth of blocks again and again, with glibc's malloc as it comes and as set.
The settings' order and the refusals are tested with a stand-in C library.
"""

from __future__ import annotations

import logging
import platform
import subprocess
import sys
import textwrap

import pytest

from minigpt.device import allocator, runtime
from minigpt.device.allocator import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, MMAP_THRESHOLD_MAX, keep_freed_memory
from minigpt.device.config import DeviceConfig

# A step as malloc sees it: 48 blocks of 2 MiB alive at once (written, so that every page is touched), then
# all freed. The blocks come from libc's malloc itself, so nothing else of Python's lands between them. As
# malloc comes, the freed 96 MiB lie at the top of its heap, more than twice the mmap threshold (which rises
# to the largest block freed, here 2 MiB), and are handed back to the kernel. Each process is fresh, so malloc
# starts from its defaults; the faults of the last 20 steps are counted.
STEPS = textwrap.dedent("""
    import ctypes, resource, sys
    from minigpt.device.allocator import keep_freed_memory
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "keep":
        keep_freed_memory()
    def step():
        blocks = [libc.malloc(2**21) for _ in range(48)]
        for block in blocks:
            ctypes.memset(block, 1, 2**21)
        for block in reversed(blocks):
            libc.free(block)
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
""")


def faults_per_step(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.slow
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="page faults are counted on Linux, and the setting is glibc's")
def test_a_step_reuses_its_pages_instead_of_faulting_them_in_again() -> None:
    as_it_comes = faults_per_step("default")
    kept = faults_per_step("keep")
    pages_per_step = 48 * 2 * 2**20 / 4096  # 24,576
    # As it comes, malloc hands most of the step's 96 MiB back to the kernel and faults it in again.
    assert as_it_comes > pages_per_step / 2
    assert kept < pages_per_step / 50  # kept: the blocks come back from the heap, already mapped


class StandInLibc:
    """Records mallopt's calls; refuses the parameters in `refuse`."""

    def __init__(self, refuse: tuple[int, ...] = ()) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param in self.refuse else 1


def test_the_mmap_threshold_is_set_before_trimming_is_stopped() -> None:
    libc = StandInLibc()
    line = keep_freed_memory(libc)
    assert libc.calls == [(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_TRIM_THRESHOLD, 2**31 - 1)]
    assert MMAP_THRESHOLD_MAX == 32 * 2**20  # glibc's most on 64-bit: a larger value is refused
    assert "keeps freed blocks up to 32 MiB" in line


def test_a_refused_threshold_leaves_trimming_as_it_was() -> None:
    # Trimming stopped with the threshold fixed at its first 128 KiB would map every block afresh.
    libc = StandInLibc(refuse=(M_MMAP_THRESHOLD,))
    assert "unchanged" in keep_freed_memory(libc)
    assert libc.calls == [(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)]


def test_another_c_library_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    assert keep_freed_memory() == "the system allocator, unchanged (not glibc)"


@pytest.mark.parametrize("keep", [True, False])
def test_a_cpu_run_sets_it_unless_told_not_to(keep: bool, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    calls = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append(1) or "kept, said the stand-in")
    with caplog.at_level(logging.INFO, logger="minigpt.device.runtime"):
        runtime.resolve_runtime(DeviceConfig(type="cpu", dtype="float32", keep_freed_memory=keep))
    assert calls == ([1] if keep else [])
    assert ("memory: kept, said the stand-in" in caplog.text) == keep
