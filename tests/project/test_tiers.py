"""The fast tier's rule, enforced: a test that starts a process or trains is marked `slow` (conftest.py)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest
from conftest import processes_and_training_refused

from minigpt.training.trainer import Trainer


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: Trainer.fit(None),
])
def test_inside_the_guard_a_process_or_a_training_fails_the_test(start) -> None:
    with processes_and_training_refused("tests/x.py::test_y"), pytest.raises(pytest.fail.Exception) as failed:
        start()
    assert "mark it @pytest.mark.slow" in str(failed.value)


@pytest.mark.slow
def test_a_slow_test_may_start_a_process() -> None:
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"
