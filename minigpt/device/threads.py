"""How many threads torch splits an op over on the CPU: as many as there are free cores, measured at start.

An op split over N threads ends when the slowest of them does. Beside another process that keeps a core busy,
one of the N threads waits for that core at every op, and the whole run goes at the pace of the time slices
the scheduler grants it: a run with one thread per core then trains several times slower than with one thread
fewer. So the count is chosen from what the cores are doing (cpu_load.py) when a command starts:

    threads = usable cores - cores other processes keep busy (a core counts once they use half of it),
              between 1 and the ceiling

The ceiling is OMP_NUM_THREADS or MKL_NUM_THREADS where one is set (the variables torch itself reads), else
one thread per physical core of those this process may use (torch's own default; a core's second hyperthread
adds little to matmuls). `device.threads=N` sets N and measures nothing. Where /proc/stat is missing (macOS)
the choice is the ceiling. Every command sets it once, first thing: training (which then re-checks it as it
goes, governor.py), evaluation, generation, the inspection tools and the bench.

Only intra-op threads are set: the inter-op pool runs work started with torch.jit.fork, which minigpt never
calls, and it can be sized only before its first use.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from minigpt.device.cpu_load import CpuLoad
from minigpt.errors import UserError

# How long the load is measured at start. Busy ticks are hundredths of a second per core, so a quarter of a
# second reads one busy core to within a few hundredths, and the wait is lost in torch's own start-up.
MEASURE_SECONDS = 0.25
# A core counts as taken once other processes keep it busy more than half the time: a thread of ours that
# waits for it half the time slows every op at least as much as doing without that thread.
TAKEN_ABOVE = 0.5
SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a command runs with, why, and what bounds a new choice (governor.py)."""

    threads: int
    reason: str
    ceiling: int  # the most a measured choice uses
    measured: bool = False  # chosen from the load, so it may be chosen again as the load changes

    def describe(self) -> str:
        return f"{self.threads} thread{'' if self.threads == 1 else 's'} ({self.reason})"


def threads_for(others_busy: float, cores: int, ceiling: int, taken_above: float = TAKEN_ABOVE) -> int:
    """Threads for `cores` usable cores of which other processes keep `others_busy` busy: one per core left
    free, where a core counts as taken once others use more than `taken_above` of it; 1 to `ceiling`."""
    taken = max(0, math.ceil(others_busy - taken_above))
    return max(1, min(ceiling, cores - taken))


def thread_ceiling(cpus: set[int], environ: Mapping[str, str] = os.environ,
                   sys_cpu: Path = SYS_CPU) -> tuple[int, str]:
    """The most threads a measured choice uses, and where that number comes from: MKL_NUM_THREADS or
    OMP_NUM_THREADS where set, as torch reads them (MKL's first), else one per physical core among `cpus`."""
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = environ.get(name, "").strip()
        if value:
            first = value.split(",")[0]  # OpenMP allows one count per nesting level: "4,2"
            if not first.isdigit() or int(first) < 1:
                raise UserError(f"{name}={value!r} is not a positive number of threads (unset it, or set "
                                "device.threads=N)")
            return int(first), f"{name}={first}"
    physical = physical_cores(cpus, sys_cpu)
    if physical is None:  # not Linux: the logical cores are all there is to count
        return len(cpus), f"{len(cpus)} core{'' if len(cpus) == 1 else 's'}"
    return physical, f"{physical} physical core{'' if physical == 1 else 's'}"


def physical_cores(cpus: set[int], sys_cpu: Path = SYS_CPU) -> int | None:
    """Physical cores among the logical `cpus` (hyperthreads of one core share its core and package ids);
    None where the topology is not readable (not Linux)."""
    try:
        cores = {((sys_cpu / f"cpu{cpu}" / "topology" / "physical_package_id").read_text().strip(),
                  (sys_cpu / f"cpu{cpu}" / "topology" / "core_id").read_text().strip()) for cpu in cpus}
    except OSError:
        return None
    return max(1, len(cores))


def choose_threads(setting: int | None, cpu_load: CpuLoad | None = None,
                   environ: Mapping[str, str] = os.environ) -> ThreadChoice:
    """The thread count for `device.threads=setting` (None: measured), without setting it."""
    if setting is not None:
        return ThreadChoice(setting, f"device.threads={setting}", ceiling=setting)
    cpu_load = cpu_load or CpuLoad()
    ceiling, source = thread_ceiling(cpu_load.cpus, environ)
    if ceiling == 1:
        return ThreadChoice(1, source, ceiling=1)
    busy = cpu_load.measure(MEASURE_SECONDS)
    if busy is None:
        return ThreadChoice(ceiling, f"{source}; no /proc/stat here to measure the load", ceiling=ceiling)
    threads = threads_for(busy, cpu_load.cores, ceiling)
    bound = f"; at most {source}" if threads == ceiling < cpu_load.cores else ""
    return ThreadChoice(threads, f"other processes keep {busy:.2f} of {cpu_load.cores} cores busy{bound}",
                        ceiling=ceiling, measured=True)


def set_threads(setting: int | None, cpu_load: CpuLoad | None = None,
                environ: Mapping[str, str] = os.environ) -> ThreadChoice:
    """Choose the thread count (`choose_threads`), set it in torch, and return it: each command reports it
    where it reports a speed (training's first log line and meta.json, generation's summary line, the bench's
    header)."""
    choice = choose_threads(setting, cpu_load, environ)
    torch.set_num_threads(choice.threads)
    return choice
