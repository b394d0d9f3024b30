"""The bench's own measurements and selection: peak memory, other processes' load, section selection and
the contenders worth running."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minigpt.data.encode import cpu_count
from minigpt.errors import UserError
from minigpt.lab.bench import resources
from minigpt.lab.bench.format import other_load
from minigpt.lab.bench.resources import peak_memory_bytes
from minigpt.lab.bench.sections import select_sections
from minigpt.lab.bench.suite import train_contenders


@pytest.mark.slow
def test_peak_memory_sees_a_large_temporary() -> None:
    n = 16 * 2**20  # 64 MiB of float32, freed before the call returns
    extra = peak_memory_bytes(lambda: torch.ones(n).sum())
    if extra is None:
        pytest.skip("resident-set high-water mark not available on this OS")
    assert 60 * 2**20 <= extra < 200 * 2**20
    small = peak_memory_bytes(lambda: torch.ones(16).sum())
    assert small < 16 * 2**20


def test_sections_expand_aliases_and_reject_unknown_names() -> None:
    assert select_sections(["data", "train"]) == ["train_S", "train_M", "data"]  # suite order
    assert select_sections(None)[0] == "peak"
    with pytest.raises(UserError, match="only='trian'"):
        select_sections(["trian"])


def test_bf16_contenders_only_where_bf16_matmuls_are_fast() -> None:
    slow = {"fp32_flops": 100e9, "bf16_flops": 2e9}
    names, notes = train_contenders(slow, quick=False, compile_=False)
    assert names == ("minigpt fp32 simple", "minigpt fp32", "reference fp32") and "bf16" in notes[0]
    fast = {"fp32_flops": 100e9, "bf16_flops": 300e9}
    names, _ = train_contenders(fast, quick=False, compile_=True)
    # best with best: the reference and the simple path run under bf16 autocast too
    assert {"minigpt bf16 simple", "minigpt bf16", "reference bf16", "minigpt compile fp32",
            "minigpt compile bf16"} <= set(names)


def test_busy_ticks_are_all_but_idle_and_iowait() -> None:
    stat = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\nintr 1 2 3\n"
    assert resources.busy_ticks(stat) == 100 + 5 + 50 + 3 + 2  # user nice system irq softirq (steal 0)


@pytest.mark.slow
def test_busy_cores_count_what_others_run_while_the_bench_sleeps(tmp_path: Path) -> None:
    """A real process kept busy on this machine shows as about one core; a missing /proc/stat as None."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy = resources.busy_cores(seconds=0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.8 < busy < cpu_count() + 0.1
    assert resources.busy_cores(seconds=0.01, stat=tmp_path / "missing") is None


@pytest.mark.parametrize(("machine", "said"), [
    ({"busy_cores_before": 0.014, "busy_cores_after": 0.2},
     "; other processes kept 0.01 cores busy before the run, 0.20 after"),
    ({"busy_cores_before": None, "busy_cores_after": None}, ""),  # not Linux
    ({}, ""),  # a JSON written before the bench measured it
])  # fmt: skip
def test_the_report_states_the_other_load(machine: dict, said: str) -> None:
    assert other_load(machine) == said
