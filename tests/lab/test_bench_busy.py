"""The bench's busy-machine section (lab/bench/busy.py): what it runs and reports, never its timings."""

from __future__ import annotations

import pytest

from minigpt.device.cpu_load import CpuLoad
from minigpt.lab.bench.busy import bench_busy, format_busy
from minigpt.lab.bench.sections import select_sections


def _row(tokens_per_s: float, threads: list[int], at_end: list[int] | None = None,
         switched: float | None = None) -> dict:
    step_s = 1024 / tokens_per_s
    return {"step_s": {"median": step_s, "min": step_s, "max": step_s, "repeats": 3},
            "tokens_per_s": tokens_per_s, "threads": threads, "threads_at_end": at_end or threads,
            "switched_after_s": switched}


RESULT = {
    "model": {"n_layer": 4, "n_embd": 96, "vocab_size": 4096, "block_size": 128}, "batch_size": 8,
    "dtype": "bfloat16", "steps": 60, "repeats": 3, "cores": 2, "fixed_threads": 2,
    "rows": {"quiet measured": _row(11000, [2]), "quiet fixed": _row(10000, [2]),
             "busy measured": _row(7700, [1]), "busy fixed": _row(3500, [2]),
             "arrival measured": _row(6600, [2], [1], switched=2.5)},
    "kept": {"measured": 0.7, "fixed": 0.35, "arrival": 0.6}, "quiet_measured_vs_fixed": 1.1,
}


def test_the_table_gives_tokens_per_s_threads_and_what_each_setting_keeps() -> None:
    lines = format_busy(RESULT)
    assert lines[0].startswith("Training beside a busy loop (the Llama-style model, `model=demo`: 4 layers")
    measured = next(line for line in lines if line.startswith("| measured"))
    fixed = next(line for line in lines if line.startswith("| fixed: one per core (2)"))
    assert "11,000 [2]" in measured and "7,700 [1]" in measured and "0.70x" in measured
    assert "10,000 [2]" in fixed and "3,500 [2]" in fixed and "0.35x" in fixed
    assert lines[-2] == "  quiet, the measured choice runs at 1.10x the fixed one"
    assert lines[-1] == ("  a busy loop arriving mid-run: 6,600 tokens/s after it came (0.60x quiet), "
                         "threads [2] -> [1], switched 2.5 s after it came")


def test_the_section_runs_only_when_asked_for() -> None:
    assert "busy" not in select_sections([]) and select_sections(["busy"]) == ["busy"]


@pytest.mark.slow
def test_the_section_gives_the_busy_loop_its_core_and_keeps_the_fixed_count() -> None:
    """A quick run with its real busy loop: the measured runs beside it use a core fewer than there are (on 2
    cores: 1), the fixed ones one per core, and the ratios are those of the rows' own tokens/s."""
    cores = CpuLoad().cores
    if cores < 2:
        pytest.skip("one core: there is no choice to make")
    r = bench_busy(quick=True)
    rows = r["rows"]
    assert max(rows["busy measured"]["threads"]) <= cores - 1
    assert rows["busy fixed"]["threads"] == rows["quiet fixed"]["threads"] == [r["fixed_threads"]]
    kept = rows["busy fixed"]["tokens_per_s"] / rows["quiet fixed"]["tokens_per_s"]
    assert r["kept"]["fixed"] == pytest.approx(kept)
    assert len(format_busy(r)) == 7
