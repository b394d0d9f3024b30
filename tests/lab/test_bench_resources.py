"""The bench's own measurements and selection: peak memory, the report's line on other processes' load,
section selection and the contenders worth running."""

from __future__ import annotations

import pytest
import torch

from minigpt.errors import UserError
from minigpt.lab.bench import suite
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


@pytest.mark.parametrize(("machine", "said"), [
    ({"busy_cores_before": 0.014, "busy_cores_after": 0.2},
     "; other processes kept 0.01 cores busy before the run, 0.20 after"),
    ({"busy_cores_before": None, "busy_cores_after": None}, ""),  # not Linux
    ({}, ""),  # a JSON written before the bench measured it
])  # fmt: skip
def test_the_report_states_the_other_load(machine: dict, said: str) -> None:
    assert other_load(machine) == said


def test_a_training_table_is_timed_in_the_trainers_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    # Resolving the trainer's runtime sets the CPU allocator for the whole process (device/allocator.py), so
    # it must come before the contenders are timed, or the table times them with malloc as the trainer never
    # runs it.
    order = []
    monkeypatch.setattr(suite, "trainer_default", lambda device: order.append("resolved") or {"row": None})
    monkeypatch.setattr(suite, "bench_train_step",
                        lambda *args, **kwargs: order.append("timed") or {"notes": []})
    peak = {"fp32_flops": 100e9, "bf16_flops": 2e9}
    result = suite._run_section("train_S", torch.device("cpu"), quick=True, compile_=False, peak=peak)
    assert order == ["resolved", "timed"]
    assert result["trainer_default"] == {"row": None}
