"""Timing: interleaved rounds and robust summaries, for the wing's choices and for the bench alike.

Two contenders timed one after the other (A A A ... B B B ...) see different machines: a neighbour's job, a
frequency change or a warm cache favours whoever ran at that moment. Timed in rounds (every contender once
per round), such drift is spread over all of them, and ratios measured within one run are what a choice or
the bench reports. The first rounds are warm-up, untimed (a first call allocates, compiles, autotunes). A
choice reads the best round of each (`interleaved_best`: the least disturbed), the bench the median with the
min and max beside it (`Timing`: the spread stays visible), and a choice between two whole steps the median
of their per-round ratio (`paired_speedup`), which a drift from round to round leaves alone.

The margins a measured candidate must win by, on a shared machine, live here too: `MIN_SPEEDUP` for single
kernels, `STEP_MIN_SPEEDUP` for whole steps.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass

import torch

from minigpt.device.probe import synchronize

# A kernel or layout must beat the default by this factor to be chosen: the ones that differ at all differ by
# more (docs/decoding.md), so a smaller ratio is timing noise on a shared machine, not a reason to change.
MIN_SPEEDUP = 1.2
# A whole step is taken over another where the median of their per-round ratio is this much. Whole steps share
# most of their work, so they differ by less than single kernels do; yet two copies of one step, compiled
# apart, measure several percent apart by that median (they differ only in where their weights lie in memory;
# docs/decoding.md gives the spread), and a smaller margin would choose by that.
STEP_MIN_SPEEDUP = 1.1


@dataclass
class Timing:
    """Summary of repeated wall-clock measurements, in seconds."""

    median: float
    min: float
    max: float
    repeats: int

    @classmethod
    def from_samples(cls, samples: list[float]) -> Timing:
        if not samples:
            raise ValueError("no samples to summarise")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def to_dict(self) -> dict:
        return asdict(self)


def time_call(fn: Callable[[], object], device: torch.device | str | None = None) -> float:
    """Seconds one call of `fn` takes, the device's queued work included."""
    if device is not None:
        synchronize(device)
    start = time.perf_counter()
    fn()
    if device is not None:
        synchronize(device)
    return time.perf_counter() - start


def interleaved_times(calls: dict[Hashable, Callable[[], object]], repeats: int, warmup: int = 1,
                      device: torch.device | str | None = None) -> dict[Hashable, list[float]]:
    """Seconds of each zero-argument call in each of `repeats` rounds, after `warmup` untimed rounds.

    Each round reverses the order of the one before (A B C, C B A, A B C, ...). A call's time depends on what
    ran just before it: after a call that read the same memory it finds that memory in the caches, after a
    large one it finds them flushed. In a fixed order (A B C, A B C) every call keeps the same predecessor
    in every round, a bias that no number of rounds averages out; alternating gives each call both neighbours
    in turn."""
    times: dict[Hashable, list[float]] = {key: [] for key in calls}
    order = list(calls)
    for round_ in range(warmup + repeats):
        for key in order:
            seconds = time_call(calls[key], device)
            if round_ >= warmup:
                times[key].append(seconds)
        order.reverse()
    return times


def interleave(calls: dict[Hashable, Callable[[], object]], repeats: int, warmup: int = 1,
               device: torch.device | str | None = None) -> dict[Hashable, Timing]:
    """`interleaved_times`, each call's rounds summarised as median, min and max."""
    times = interleaved_times(calls, repeats, warmup, device)
    return {key: Timing.from_samples(seconds) for key, seconds in times.items()}


def interleaved_best(calls: dict[Hashable, Callable[[], object]], repeats: int,
                     device: torch.device | str | None = None) -> dict[Hashable, float]:
    """Best seconds of each call over `interleaved_times`' rounds (one warm-up round)."""
    return {key: min(seconds) for key, seconds in interleaved_times(calls, repeats, 1, device).items()}


def paired_speedup(slower: list[float], faster: list[float]) -> float:
    """How many times faster the second of two calls timed in the same rounds is: the median over rounds of
    each round's ratio."""
    return statistics.median(s / f for s, f in zip(slower, faster, strict=True))
