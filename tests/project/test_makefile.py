"""The Makefile's commands, as `make -n` prints them (nothing runs)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def _dry_run(*args: str) -> str:
    proc = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if "tensorboard --logdir" in line][-1]


@pytest.mark.slow
def test_tensorboard_serves_localhost_unless_told_otherwise():
    line = _dry_run("tensorboard")
    assert "--host localhost" in line and "--port 6006" in line
    assert "--bind_all" not in line  # every network interface: the logs hold configs and samples
    exposed = _dry_run("tensorboard", "HOST=0.0.0.0", "PORT=7007")
    assert "--host 0.0.0.0" in exposed and "--port 7007" in exposed
