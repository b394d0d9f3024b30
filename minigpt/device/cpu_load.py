"""How many cores other processes keep busy: what the thread count is chosen from (threads.py, governor.py).

/proc/stat counts, for every core, the clock ticks (1/100 s) it has spent busy since boot, whoever ran on it;
`time.process_time()` is this process's own CPU time, every thread of it. Over a window, the first less the
second is what the other processes ran. So the measurement needs no pause: a training that keeps every core
busy itself measures its neighbours, not itself, while it goes on training. Only the cores this process may
run on count (the CPU mask of a container or a batch job).

    cpu_load = CpuLoad()
    since = cpu_load.sample()
    ...                                   # sleep, or train
    cpu_load.others_busy(since)           # 0.98: another process kept about one core busy meanwhile

Where there is no /proc/stat (macOS, Windows) `sample()` is None and nothing is measured.

Busy ticks rather than timing a small op at 1 and N threads: on a shared core such a timing is at the
scheduler's mercy and scatters over an order of magnitude, where the ticks read the same load to a few
hundredths of a core (the measurement: docs/training.md, Threads).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def busy_ticks(stat: str, cpus: set[int] | None = None) -> int:
    """Clock ticks the cores `cpus` (None: all of them) have spent busy, from /proc/stat's text.

    A core's line reads `cpuN user nice system idle iowait irq softirq steal guest guest_nice`: busy is all
    but idle and iowait. guest and guest_nice are already counted in user and nice; steal (time a hypervisor
    gave this virtual core to another machine) is busy, since it is a core this process could not have.
    """
    total = 0
    for line in stat.splitlines():
        name, *fields = line.split() or [""]
        if not name.startswith("cpu") or name == "cpu":
            continue  # `cpu` sums every core of the host, not only ours
        if cpus is not None and int(name.removeprefix("cpu")) not in cpus:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        total += user + nice + system + irq + softirq + steal
    return total


def usable_cpus() -> set[int]:
    """The cores this process may run on: its CPU mask where the OS has one (Linux), else every core."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class CpuSample:
    """Busy time of the usable cores and of this process, at one moment."""

    busy_s: float  # seconds the usable cores have spent busy since boot, summed over them (every process)
    own_s: float  # CPU seconds of this process, every thread
    at_s: float  # time.monotonic()


class CpuLoad:
    """Samples the usable cores' busy time; `others_busy` is what other processes ran between two samples."""

    def __init__(self, stat: Path = PROC_STAT, cpus: set[int] | None = None) -> None:
        self.stat = stat
        self.cpus = usable_cpus() if cpus is None else cpus
        self.ticks_per_s = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @property
    def cores(self) -> int:
        return len(self.cpus)

    def sample(self) -> CpuSample | None:
        """Now's sample; None where /proc/stat cannot be read (not Linux)."""
        try:
            ticks = busy_ticks(self.stat.read_text(), self.cpus)
        except (OSError, ValueError):
            return None
        return CpuSample(ticks / self.ticks_per_s, time.process_time(), time.monotonic())

    def others_busy(self, since: CpuSample) -> float | None:
        """Cores that other processes kept busy, on average, from `since` until now; None without /proc/stat.

        Never below 0: ticks are counted in whole hundredths of a second, this process's time to the
        microsecond, so over an idle window the difference can come out a little negative."""
        now = self.sample()
        if now is None:
            return None
        elapsed = now.at_s - since.at_s
        if elapsed <= 0:
            return 0.0
        return max(0.0, (now.busy_s - since.busy_s - (now.own_s - since.own_s)) / elapsed)

    def measure(self, seconds: float) -> float | None:
        """Cores other processes keep busy over the next `seconds`, which this process spends asleep."""
        since = self.sample()
        if since is None:
            return None
        time.sleep(seconds)
        return self.others_busy(since)
