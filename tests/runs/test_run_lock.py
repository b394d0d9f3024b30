"""One training per run folder: a second training aimed at a folder in use is refused in one line naming the
holder's PID, without touching the folder; a SIGKILLed holder's lock is free at once; the lock file does not
outlive a finished run, and a refused run puts a stale one back exactly as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_script
from conftest import ROOT, fast_overrides

from minigpt.errors import UserError
from minigpt.runs import run_folder as run_lock
from minigpt.runs.run_folder import LOCK_NAME, RunFolder, RunLock


def _wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


@pytest.mark.slow
def test_a_second_training_is_refused_while_the_first_runs_and_free_after_sigkill(tmp_path, corpus_dir,
                                                                                   capsys):
    run, common = tmp_path / "run", [*fast_overrides(tmp_path, corpus_dir), "logging.sample_tokens=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *common, "trainer.max_steps=1000000",
         "trainer.ckpt_every=5", f"hydra.run.dir={run}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (run / "checkpoints" / "last" / "meta.json").is_file() or first.poll() is not None,
                  "the first training's first checkpoint")
        assert first.poll() is None, first.stderr.read()
        assert _read(run / LOCK_NAME).strip() == str(first.pid)
        overrides = (run / ".hydra" / "overrides.yaml").read_bytes()

        second = run_script("train", [*common, "trainer.resume=auto", f"hydra.run.dir={run}"], capsys)

        assert second.code == 2 and len(second.err_lines) == 1, second.err
        assert f"in use by another training (PID {first.pid}" in second.err_lines[0]
        assert (run / ".hydra" / "overrides.yaml").read_bytes() == overrides  # the holder's record stands
        assert first.poll() is None  # and it is still training
    finally:
        first.kill()  # SIGKILL: no handler runs, the kernel drops the lock with the process
        first.wait()
    assert _read(run / LOCK_NAME).strip() == str(first.pid)  # the file stays, but nobody holds its lock

    step = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())["step"]
    third = run_script("train", [*common, "trainer.resume=auto", f"trainer.max_steps={step + 2}",
                                 f"hydra.run.dir={run}"], capsys)
    assert third.code == 0, third.err
    assert json.loads((run / "checkpoints" / "last" / "meta.json").read_text())["step"] == step + 2
    assert not (run / LOCK_NAME).exists()  # a finished run leaves no lock file


def test_a_second_lock_on_the_folder_is_refused_naming_the_holder(tmp_path: Path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    holder = rf"in use by another training \(PID {os.getpid()}, holding .*train.lock"
    with pytest.raises(UserError, match=holder):
        second.acquire()  # flock locks belong to open files, so even this same process is refused
    first.release(restore=False)
    assert not (tmp_path / LOCK_NAME).exists()
    second.acquire()  # free again
    second.release(restore=False)


def test_a_refused_run_puts_a_stale_lock_file_back(tmp_path: Path):
    stale = b"12345\n"  # what a SIGKILLed run leaves: its PID, no lock
    (tmp_path / LOCK_NAME).write_bytes(stale)
    lock = RunLock(tmp_path)
    lock.acquire()
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    lock.release(restore=True)
    assert (tmp_path / LOCK_NAME).read_bytes() == stale


def test_a_lock_file_removed_while_being_taken_is_not_trusted(tmp_path: Path, monkeypatch):
    """The holder removes the file between our open() and our flock(): we must not keep a lock on that
    orphan (a third process would create a new file and run beside us), but lock the file now there."""
    holder, late = RunLock(tmp_path), RunLock(tmp_path)
    holder.acquire()
    real_flock, calls = run_lock.fcntl.flock, []

    def flock(fd, op):
        calls.append(fd)
        if len(calls) == 1:
            holder.release(restore=False)  # unlinks the file `late` has just opened
        return real_flock(fd, op)

    monkeypatch.setattr(run_lock.fcntl, "flock", flock)
    late.acquire()
    assert len(calls) == 2  # locked the orphan, saw it was gone, started over
    monkeypatch.setattr(run_lock.fcntl, "flock", real_flock)
    with pytest.raises(UserError, match="in use"):
        RunLock(tmp_path).acquire()
    late.release(restore=False)


def test_ranks_other_than_zero_take_no_lock(tmp_path: Path):
    # rank 0 and the same job's rank 1, in the same folder
    with RunFolder(tmp_path, enabled=True), RunFolder(tmp_path, enabled=False) as rank1:
        rank1.accept()
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert not (tmp_path / LOCK_NAME).exists()
