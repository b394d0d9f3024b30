"""The thread count: chosen from the measured load of the other processes (device/cpu_load.py, threads.py).

The choice is tested with the load injected, so nothing here depends on how busy this machine is; one slow
test runs a real busy loop beside the real measurement and checks only the decision it leads to.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import compose_train

from minigpt.cli import to_object
from minigpt.device.config import InferenceDeviceConfig
from minigpt.device.cpu_load import CpuLoad, CpuSample, busy_ticks
from minigpt.device.threads import (
    MEASURE_SECONDS,
    choose_threads,
    physical_cores,
    set_threads,
    thread_ceiling,
)
from minigpt.errors import UserError
from minigpt.training.config import TrainConfig

QUIET: dict[str, str] = {}  # an environment without OMP_NUM_THREADS or MKL_NUM_THREADS


class FakeLoad:
    """A CpuLoad whose other processes keep `busy` cores busy, whenever it is asked."""

    def __init__(self, busy: float | None, cores: int = 2) -> None:
        self.busy, self.cpus = busy, set(range(cores))
        self.windows: list[float] = []

    @property
    def cores(self) -> int:
        return len(self.cpus)

    def sample(self) -> CpuSample | None:
        return None if self.busy is None else CpuSample(0.0, 0.0, 0.0)

    def others_busy(self, since: CpuSample) -> float | None:
        return self.busy

    def measure(self, seconds: float) -> float | None:
        self.windows.append(seconds)
        return self.busy


@pytest.fixture
def keep_torch_threads():
    """Tests that set torch's thread count put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("busy", "cores", "threads"), [
    (0.02, 2, 2),   # quiet: every core
    (0.98, 2, 1),   # one busy loop beside a 2-core run: the other core
    (2.0, 2, 1),    # both taken: still one thread
    (0.5, 2, 2),    # half a core is not yet taken ...
    (0.51, 2, 1),   # ... a little more is
    (2.9, 8, 5),    # 8 cores, three of them busy
])  # fmt: skip
def test_one_thread_per_free_core(busy: float, cores: int, threads: int) -> None:
    choice = choose_threads(None, FakeLoad(busy, cores), QUIET)
    assert choice.threads == threads and choice.measured
    assert f"other processes keep {busy:.2f} of {cores} cores busy" in choice.reason


def test_the_load_is_measured_once_for_a_quarter_second_and_not_at_all_when_set() -> None:
    load = FakeLoad(0.0)
    choose_threads(None, load, QUIET)
    assert load.windows == [MEASURE_SECONDS]
    fixed = choose_threads(3, load, QUIET)
    assert (fixed.threads, fixed.reason, fixed.measured) == (3, "device.threads=3", False)
    assert load.windows == [MEASURE_SECONDS]


def test_omp_num_threads_is_the_most_a_measured_choice_uses() -> None:
    three = choose_threads(None, FakeLoad(0.0, cores=8), {"OMP_NUM_THREADS": "3"})
    assert three.threads == 3 and three.reason.endswith("; at most OMP_NUM_THREADS=3")
    # torch reads MKL_NUM_THREADS over OMP_NUM_THREADS; OpenMP's per-level list counts its first level
    both = {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "2"}
    assert thread_ceiling({0, 1}, both) == (2, "MKL_NUM_THREADS=2")
    assert thread_ceiling({0, 1}, {"OMP_NUM_THREADS": "4,2"})[0] == 4
    load = FakeLoad(0.0)
    one = choose_threads(None, load, {"OMP_NUM_THREADS": "1"})
    assert (one.threads, one.reason, load.windows) == (1, "OMP_NUM_THREADS=1", [])  # nothing to choose


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_omp_num_threads_is_a_user_error_naming_it(value: str) -> None:
    with pytest.raises(UserError, match=f"OMP_NUM_THREADS='{value}' is not a positive number of threads"):
        choose_threads(None, FakeLoad(0.0), {"OMP_NUM_THREADS": value})


def test_without_proc_stat_the_choice_is_one_thread_per_physical_core(tmp_path: Path) -> None:
    choice = choose_threads(None, CpuLoad(stat=tmp_path / "missing", cpus={0, 1}), QUIET)
    assert choice.threads == thread_ceiling({0, 1}, QUIET)[0] and not choice.measured
    assert "no /proc/stat here to measure the load" in choice.reason


def test_hyperthreads_of_one_core_count_once(tmp_path: Path) -> None:
    for cpu, core in enumerate([0, 1, 0, 1]):  # 4 logical CPUs: two cores with two hyperthreads each
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    assert physical_cores({0, 1, 2, 3}, tmp_path) == 2
    assert physical_cores({0, 2}, tmp_path) == 1  # a CPU mask holding both threads of one core
    assert physical_cores({0, 1, 2}, tmp_path / "missing") is None  # not Linux
    assert thread_ceiling({0, 1, 2}, QUIET, tmp_path / "missing") == (3, "3 cores")  # every logical CPU


def test_busy_ticks_are_all_but_idle_and_iowait_of_the_usable_cores() -> None:
    stat = ("cpu  150 7 75 1500 30 4 3 1 9 0\n"
            "cpu0 100 5 50 1000 20 3 2 1 9 0\n"  # guest (9) is already counted in user
            "cpu1 50 2 25 500 10 1 1 0 0 0\n"
            "intr 1 2 3\n")
    assert busy_ticks(stat) == (100 + 5 + 50 + 3 + 2 + 1) + (50 + 2 + 25 + 1 + 1)
    assert busy_ticks(stat, cpus={1}) == 50 + 2 + 25 + 1 + 1


def test_set_threads_sets_torch_and_says_why(keep_torch_threads) -> None:
    torch.set_num_threads(2)
    choice = set_threads(None, FakeLoad(1.0), QUIET)
    assert torch.get_num_threads() == choice.threads == 1
    assert choice.describe() == "1 thread (other processes keep 1.00 of 2 cores busy)"


@pytest.mark.parametrize("value", [0, -2])
def test_device_threads_below_one_is_a_user_error_naming_the_key(value: int) -> None:
    with pytest.raises(UserError, match=rf"device\.threads={value} must be at least 1"):
        to_object(compose_train([f"device.threads={value}"]), TrainConfig)
    with pytest.raises(UserError, match=rf"device\.threads={value} must be at least 1"):
        InferenceDeviceConfig(threads=value)  # generation, evaluation and the inspection tools


@pytest.mark.slow
def test_beside_a_real_busy_loop_the_choice_leaves_it_a_core() -> None:
    """A real process spinning on this machine is measured as a taken core: on 2 cores, one thread. Only the
    decision is checked (the suite's other processes can only add to the load, never hide the loop)."""
    cpu_load = CpuLoad()
    if cpu_load.cores < 2:
        pytest.skip("one core: there is no choice to make")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # running, not starting
        choice = choose_threads(None, cpu_load, QUIET)
        busy = cpu_load.measure(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.8 < busy < cpu_load.cores + 0.1
    assert choice.measured and choice.threads <= cpu_load.cores - 1, choice
    assert CpuLoad(stat=Path("/nonexistent/stat")).measure(0.01) is None
