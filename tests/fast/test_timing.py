"""The one timing harness (fast/timing.py), which the wing's choices and the bench share: summaries, the order
of interleaved rounds, the paired ratio of whole steps. Fake clocks: nothing here depends on a real time."""

from __future__ import annotations

import pytest

from minigpt.fast import timing
from minigpt.fast.timing import Timing, interleave, interleaved_best, paired_speedup


def test_timing_summary_is_median_min_max() -> None:
    t = Timing.from_samples([3.0, 1.0, 10.0, 2.0])
    assert (t.median, t.min, t.max, t.repeats) == (2.5, 1.0, 10.0, 4)  # even count: mean of the middle two
    assert Timing.from_samples([5.0, 1.0, 4.0]).median == 4.0
    with pytest.raises(ValueError):
        Timing.from_samples([])


def test_interleave_reverses_the_order_every_round_after_warmup(monkeypatch) -> None:
    """A fake clock that only the contenders advance: each timing is exactly its own calls' durations, and no
    contender always follows the same other one."""
    clock, calls = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    durations = {"a": iter([50.0, 60.0, 1.0, 2.0, 3.0]), "b": iter([70.0, 80.0, 10.0, 40.0, 20.0])}

    def contender(name: str):
        def call() -> None:
            calls.append(name)
            clock[0] += next(durations[name])  # the first two calls are warm-up: never counted
        return call

    result = interleave({"a": contender("a"), "b": contender("b")}, repeats=3, warmup=2)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]  # 2 warm-up, 3 timed rounds
    assert (result["a"].median, result["a"].min, result["a"].max, result["a"].repeats) == (2.0, 1.0, 3.0, 3)
    assert (result["b"].median, result["b"].min, result["b"].max) == (20.0, 10.0, 40.0)


def test_the_best_round_and_the_paired_ratio(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    durations = iter([9.0, 3.0, 1.0, 2.0])  # one warm-up round, then 3 timed: 3, 1, 2

    def call() -> None:
        clock[0] += next(durations)

    assert interleaved_best({"x": call}, repeats=3) == {"x": 1.0}
    # the median of each round's ratio: a round where both slowed together changes nothing
    assert paired_speedup([2.0, 4.0, 2.2], [1.0, 2.0, 2.0]) == pytest.approx(2.0)
    assert paired_speedup([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == 1.0
