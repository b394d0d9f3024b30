"""Run a script of `scripts/` in this process, exactly as `python scripts/<name>.py args...` would.

`runpy` executes the file as `__main__`, so the real entry point runs (Hydra composition, the one-line error
handling, the exit code) without paying a fresh interpreter's torch import (several seconds on 2 cores).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import resource
import runpy
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

from minigpt.signals import STOP_SIGNALS


@dataclass
class ScriptRun:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_script(name: str, args: list[str], capsys: pytest.CaptureFixture[str] | None) -> ScriptRun:
    """Run scripts/<name>.py with `args`; returns its exit code (0 when it returned) and captured output
    (none without `capsys`).

    Like the end of a process, the end of the run closes the log handlers the script's Hydra job attached
    (its train.log), so later tests in this process cannot write into that run folder, and puts back the
    handlers of the stop signals (every command installs its own: minigpt/signals.py).
    """
    path = ROOT / "scripts" / f"{name}.py"
    saved_argv, saved_env = sys.argv, dict(os.environ)
    saved_signals = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}  # a command installs its own
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    os.environ.pop("HYDRA_FULL_ERROR", None)  # the scripts set it for themselves; start each run clean
    sys.argv = [str(path), *args]
    if capsys is not None:
        capsys.readouterr()
    code = 0
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        for handler in set(root.handlers) - set(saved_handlers):
            handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
    if capsys is None:
        return ScriptRun(code, "", "")
    captured = capsys.readouterr()
    return ScriptRun(code, captured.out, captured.err)


def snapshot(*roots: Path) -> dict[str, str]:
    """Path -> content hash of every file under `roots`, to show that a failed command changed nothing."""
    files: dict[str, str] = {}
    for root in roots:
        for f in sorted(Path(root).rglob("*")):
            if f.is_file():
                files[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return files


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE in this process for the block: every write past `limit` bytes fails with EFBIG, as on a
    full disk (Python ignores SIGXFSZ, so the write fails instead of killing the process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
