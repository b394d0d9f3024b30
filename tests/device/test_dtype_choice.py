"""device.dtype=auto on a CPU: chosen from a measured matmul probe (device/probe.py), never assumed.

The choice is tested with the probe's result injected, both ways; nothing here depends on how fast this
machine is. The cache (one JSON per data cache folder, keyed by machine) is tested with a counting fake
measurement.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from minigpt.device import probe as probe_mod
from minigpt.device.config import DeviceConfig
from minigpt.device.probe import MatmulProbe, cpu_matmul_probe
from minigpt.device.runtime import BF16_MIN_SPEEDUP, choose_cpu_dtype, resolve_runtime

NATIVE = MatmulProbe(fp32_flops=205e9, bf16_flops=442e9)  # a Zen 4 core with avx512_bf16 (AMD EPYC)
EMULATED = MatmulProbe(fp32_flops=140e9, bf16_flops=0.9e9)  # an AVX2-only Zen 2 core: bf16 emulated


def test_bf16_is_chosen_where_it_is_measured_clearly_faster() -> None:
    dtype, why = choose_cpu_dtype(NATIVE)
    assert dtype == torch.bfloat16
    assert "bf16 442.0 GFLOP/s" in why and "fp32 205.0" in why and "2.16x faster" in why


def test_fp32_stays_where_bf16_is_emulated() -> None:
    dtype, why = choose_cpu_dtype(EMULATED)
    assert dtype == torch.float32
    assert "bf16 is 0.01x fp32" in why and f"under the {BF16_MIN_SPEEDUP}x" in why


def test_the_margin_is_a_clear_one() -> None:
    below = MatmulProbe(fp32_flops=100e9, bf16_flops=BF16_MIN_SPEEDUP * 100e9 * 0.99)
    at = MatmulProbe(fp32_flops=100e9, bf16_flops=BF16_MIN_SPEEDUP * 100e9)
    assert choose_cpu_dtype(below)[0] == torch.float32
    assert choose_cpu_dtype(at)[0] == torch.bfloat16


@pytest.mark.parametrize(("measured", "expected"), [(NATIVE, torch.bfloat16), (EMULATED, torch.float32)])
def test_resolve_runtime_uses_the_probe_and_says_why_in_its_log_line(measured, expected, tmp_path, caplog):
    seen = []

    def fake_probe(cache: Path | None) -> MatmulProbe:
        seen.append(cache)
        return measured

    with caplog.at_level(logging.INFO, logger="minigpt.device.runtime"):
        runtime = resolve_runtime(DeviceConfig(type="cpu", dtype="auto", compile=False),
                                  probe_cache=tmp_path, cpu_probe=fake_probe)
    assert runtime.dtype == expected and seen == [tmp_path]
    name = str(expected).removeprefix("torch.")
    line = next(r.getMessage() for r in caplog.records if "autocast dtype" in r.getMessage())
    assert f"autocast dtype {name} (auto: measured 256x256 matmuls" in line, line
    assert runtime.dtype_reason in line


@pytest.mark.parametrize(("setting", "expected"), [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_an_explicit_dtype_is_forced_and_nothing_is_measured(setting: str, expected: torch.dtype) -> None:
    def no_probe(cache):
        raise AssertionError("the probe ran for an explicit device.dtype")

    runtime = resolve_runtime(DeviceConfig(type="cpu", dtype=setting, compile=False), cpu_probe=no_probe)
    assert runtime.dtype == expected and runtime.dtype_reason == f"device.dtype={setting}"


@pytest.fixture
def counting_measure(monkeypatch):
    """Replace the matmul measurement by a fake (fp32 100 GFLOP/s, bf16 300) that counts its calls."""
    calls = []

    def fake(n, dtype, device, seconds):
        calls.append(dtype)
        return 300e9 if dtype == torch.bfloat16 else 100e9

    monkeypatch.setattr(probe_mod, "measure_matmul_flops", fake)
    return calls


def test_the_probe_is_measured_once_per_machine_and_then_read_from_the_cache(tmp_path, counting_measure):
    first = cpu_matmul_probe(tmp_path)
    assert first.source == "measured" and counting_measure == [torch.float32, torch.bfloat16]
    stored = json.loads((tmp_path / "device_probe.json").read_text())
    key = probe_mod.machine_key()
    assert stored == {key: {"fp32_flops": 100e9, "bf16_flops": 300e9, "n": 256}}
    assert torch.__version__ in key and torch.backends.cpu.get_cpu_capability() in key
    second = cpu_matmul_probe(tmp_path)
    assert second.source == "cached" and len(counting_measure) == 2  # not measured again
    assert (second.fp32_flops, second.bf16_flops) == (first.fp32_flops, first.bf16_flops)


def test_another_machine_or_torch_is_measured_again_and_kept_beside(tmp_path, counting_measure, monkeypatch):
    cpu_matmul_probe(tmp_path)
    monkeypatch.setattr(probe_mod, "machine_key", lambda: "another CPU | AVX512 | torch 9.9")
    assert cpu_matmul_probe(tmp_path).source == "measured" and len(counting_measure) == 4
    assert len(json.loads((tmp_path / "device_probe.json").read_text())) == 2


@pytest.mark.parametrize("damage", ["{half a fi", "[1, 2]", '{"KEY": {"fp32": 1}}'])
def test_a_damaged_cache_is_measured_again_and_repaired(tmp_path, counting_measure, damage: str) -> None:
    (tmp_path / "device_probe.json").write_text(damage.replace("KEY", probe_mod.machine_key()))
    assert cpu_matmul_probe(tmp_path).source == "measured"
    assert cpu_matmul_probe(tmp_path).source == "cached"


def test_an_unwritable_cache_folder_costs_only_a_warning(tmp_path, counting_measure, caplog) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="minigpt.device.probe"):
        result = cpu_matmul_probe(blocker / "data")
    assert result.source == "measured" and result.bf16_speedup == 3.0
    assert "could not cache the CPU probes" in caplog.text


def test_the_real_probe_is_quick_and_sane(tmp_path) -> None:
    # the one real measurement: no timing is asserted, only that both rates are positive and finite
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = cpu_matmul_probe(tmp_path)
        assert torch.get_num_threads() == 2  # measured on one thread, then restored
    finally:
        torch.set_num_threads(threads)
    assert 0 < result.fp32_flops < float("inf") and 0 < result.bf16_flops < float("inf")


@pytest.mark.slow
def test_the_trainers_first_log_lines_say_the_threads_the_dtype_and_why(make_train_cfg, tmp_path,
                                                                      counting_measure, caplog) -> None:
    from minigpt.runs.train import train

    cfg = make_train_cfg("device.dtype=auto", "trainer.max_steps=1", "logging.sample_tokens=0")
    with caplog.at_level(logging.INFO):
        train(cfg, tmp_path / "run")
    first, second = (r.getMessage() for r in caplog.records[:2])
    assert first == "threads: 1 thread (OMP_NUM_THREADS=1)", first  # the suite's setting (tests/conftest.py)
    assert second.startswith("device cpu, autocast dtype bfloat16 (auto: measured 256x256 matmuls"), second
    assert (Path(cfg.data.cache_dir) / "device_probe.json").is_file()  # cached beside the prepared data


@pytest.mark.parametrize(("cpuinfo", "named"), [
    ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n\n"
     "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n",
     "AMD EPYC (family 26, model 2)"),  # the first processor's numbers
    ("cpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7763 64-Core Processor\n",
     "AMD EPYC 7763 64-Core Processor"),  # a name that tells the generation already stays as it is
    ("processor\t: 0\nmodel name\t: Intel Xeon Processor\n", "Intel Xeon Processor"),  # no numbers to add
])  # fmt: skip
def test_the_cpu_is_named_so_that_generations_differ(tmp_path, cpuinfo: str, named: str) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert probe_mod.cpu_model(path) == named


def test_the_cpu_flags_are_the_first_processors_and_none_off_linux(tmp_path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx512_bf16\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu\n")
    assert probe_mod.cpu_flags(path) == ["fpu", "sse2", "avx512_bf16"]
    path.write_text("processor\t: 0\n")  # an ARM kernel names them `Features`: none listed as flags
    assert probe_mod.cpu_flags(path) == []
    assert probe_mod.cpu_flags(tmp_path / "missing") == []
