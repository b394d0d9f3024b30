"""Faults of the disk while a training writes: a full disk, lost permissions, the run folder deleted, a file
size limit, a real filesystem that fills up. Each ends with one line naming the path and the cause, exit code
2, no traceback, the last good checkpoint intact and loadable, no temporary folder left; a temporary folder a
crash left behind is removed at the next start (and not by a refused one).

Injected faults: OSError at the write call (in this process, through the real script), RLIMIT_FSIZE on a
real process (every write past the limit fails with EFBIG), and a 640 KiB tmpfs mounted in a user namespace
(`unshare -rm`; skipped where the kernel does not allow one).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_script, snapshot
from conftest import ROOT, fast_overrides
from safetensors import SafetensorError
from tensorboard.summary.writer import record_writer

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model
from minigpt.runs.run_folder import LOCK_NAME
from minigpt.training import trainer as trainer_module

# 8 steps, `last` every 2, `best` never before the end: the checkpoints written are last@2, last@4, ...
STEPS = ("trainer.max_steps=8", "trainer.ckpt_every=2", "trainer.eval_every=1000", "logging.sample_tokens=0",
         "logging.log_every=1")


def _args(tmp_path: Path, corpus: Path, run: Path, *extra: str) -> list[str]:
    return [*fast_overrides(tmp_path, corpus), *STEPS, f"hydra.run.dir={run}", *extra]


def _assert_one_line(result, *needles: str) -> str:
    assert result.code == 2, (result.code, result.err[-3000:])
    assert len(result.err_lines) == 1, result.err
    assert "Traceback" not in result.err + result.out
    line = result.err_lines[0]
    assert line.startswith("error: ") and all(n in line for n in needles), line
    return line


def _assert_last_checkpoint_is_whole(run: Path, step: int) -> None:
    folder = run / "checkpoints"
    left = [p.name for p in folder.iterdir() if p.name not in ("last", "best")]
    assert not left, f"temporary folders were left behind: {left}"
    model, tokenizer, meta = load_model(folder / "last", "cpu")
    assert meta["step"] == step and ckpt.load_state(folder / "last")["step"] == step
    assert not (run / LOCK_NAME).exists()


def _fail_the_nth_last_save(monkeypatch, n: int, error: OSError, file_name: str = ckpt.STATE) -> None:
    """`file_name` of the n-th `last` checkpoint fails to write with `error` (its filename set)."""
    real, seen = ckpt._write_file, []

    def write(file: Path, data) -> None:
        if file.name == file_name and file.parent.name.startswith(".last.tmp"):
            seen.append(file)
            if len(seen) == n:
                raise OSError(error.errno, error.strerror, str(file))
        real(file, data)

    monkeypatch.setattr(ckpt, "_write_file", write)


@pytest.mark.slow
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_failed_checkpoint_write_keeps_the_last_one(code, tmp_path, corpus_dir, capsys, monkeypatch):
    _fail_the_nth_last_save(monkeypatch, 2, OSError(code, os.strerror(code)))
    run = tmp_path / "run"
    result = run_script("train", _args(tmp_path, corpus_dir, run), capsys)
    _assert_one_line(result, "checkpoint not saved", f"{run}/checkpoints/last/state.pt", os.strerror(code),
                     f"the previous checkpoint {run}/checkpoints/last is intact")
    _assert_last_checkpoint_is_whole(run, step=2)


@pytest.mark.slow
def test_safetensors_write_errors_become_the_oserror_they_were(tmp_path, corpus_dir, capsys, monkeypatch):
    def save_model(model, filename):  # what safetensors raises when the disk is full mid-write
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ckpt, "save_model", save_model)
    run = tmp_path / "run"
    result = run_script("train", _args(tmp_path, corpus_dir, run), capsys)
    _assert_one_line(result, f"{run}/checkpoints/last/model.safetensors: No space left on device",
                     "no earlier checkpoint was there")
    assert list((run / "checkpoints").iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("tensorboard", ["true", "false"])  # false: only the checkpoint's write notices
def test_a_run_folder_deleted_under_the_run_is_not_recreated(tensorboard, tmp_path, corpus_dir, capsys,
                                                             monkeypatch):
    run = tmp_path / "run"
    real, calls = trainer_module.optimizer_step, []

    def deleting_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            shutil.rmtree(run)  # e.g. `rm -rf outputs/` in another terminal
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "optimizer_step", deleting_step)
    args = _args(tmp_path, corpus_dir, run, f"logging.tensorboard={tensorboard}")
    result = run_script("train", args, capsys)
    # Whichever write notices first (the TensorBoard events, the next checkpoint) names its path.
    _assert_one_line(result, f"cannot write {run}", "No such file or directory")
    assert not run.exists()  # nothing wrote a new, partial run folder in its place


@pytest.mark.slow
def test_a_failed_log_write_ends_the_run_in_one_line(tmp_path, corpus_dir, capsys, monkeypatch):
    """train.log's disk fills up: one line naming train.log, not logging's traceback for every later line."""
    real_open, run = logging.FileHandler._open, tmp_path / "run"

    class FillingFile:
        def __init__(self, f):
            self.f = f

        def write(self, text):
            if (run / "checkpoints" / "last").exists():  # the disk is full from the first checkpoint on
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(text)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(logging.FileHandler, "_open", lambda self: FillingFile(real_open(self)))
    result = run_script("train", _args(tmp_path, corpus_dir, run), capsys)
    _assert_one_line(result, f"cannot write {run}/train.log: No space left on device")
    step = json.loads((run / "checkpoints" / "last" / ckpt.META).read_text())["step"]
    _assert_last_checkpoint_is_whole(run, step)


# The writer thread's own traceback would reach pytest's thread-exception hook (in a real process: stderr).
@pytest.mark.slow
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_tensorboard_write_ends_the_run_in_one_line(tmp_path, corpus_dir, capsys, monkeypatch):
    real_write, writes = record_writer.RecordWriter.write, []

    def write(self, data):  # runs in the event writer's background thread
        writes.append(1)
        if len(writes) > 20:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    run = tmp_path / "run"
    result = run_script("train", _args(tmp_path, corpus_dir, run), capsys)
    # ... and not the writer thread's own traceback
    _assert_one_line(result, f"cannot write {run}/tb: No space left on device")
    step = json.loads((run / "checkpoints" / "last" / ckpt.META).read_text())["step"]
    _assert_last_checkpoint_is_whole(run, step)


@pytest.mark.slow
def test_temporaries_left_by_a_crash_go_at_the_next_start_not_at_a_refused_one(tmp_path, corpus_dir, capsys):
    run = tmp_path / "run"
    assert run_script("train", _args(tmp_path, corpus_dir, run, "trainer.max_steps=2"), capsys).code == 0
    for name in (".last.tmp-4242", ".best.tmp-4243"):  # what SIGKILL mid-save leaves
        (run / "checkpoints" / name).mkdir()
        (run / "checkpoints" / name / ckpt.WEIGHTS).write_bytes(b"half a file")
    before = snapshot(run)
    refused = run_script("train", _args(tmp_path, corpus_dir, run, "trainer.max_steps=2"), capsys)
    assert refused.code == 2 and "already holds a checkpoint" in refused.err
    assert snapshot(run) == before  # a refused run removes nothing either
    args = _args(tmp_path, corpus_dir, run, "trainer.max_steps=4", "trainer.resume=auto")
    resumed = run_script("train", args, capsys)
    assert resumed.code == 0, resumed.err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "last"]


# ------------------------------------------------------------------------------------------- real faults


def _train_cmd(tmp_path: Path, corpus: Path, run: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train.py"), *_args(tmp_path, corpus, run, *extra)]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


@pytest.mark.slow
def test_a_file_size_limit_fails_the_checkpoint_of_a_real_process(tmp_path, corpus_dir, capsys):
    """RLIMIT_FSIZE below the weights' size: the resumed run's first checkpoint cannot be written (EFBIG;
    Python ignores SIGXFSZ, so the write fails instead of killing the process)."""
    run = tmp_path / "run"
    assert run_script("train", _args(tmp_path, corpus_dir, run, "trainer.max_steps=4"), capsys).code == 0
    limit = (run / "checkpoints" / "last" / ckpt.WEIGHTS).stat().st_size // 2  # logs and events stay below
    proc = subprocess.run(
        _train_cmd(tmp_path, corpus_dir, run, "trainer.resume=auto"), cwd=ROOT, env=_env(),
        capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert f"{run}/checkpoints/last/model.safetensors: File too large" in lines[0], lines[0]
    assert "the previous checkpoint" in lines[0] and "Traceback" not in proc.stderr + proc.stdout
    _assert_last_checkpoint_is_whole(run, step=4)


@pytest.mark.slow
def test_a_real_filesystem_that_fills_up(tmp_path, corpus_dir):
    """A 640 KiB tmpfs holds one checkpoint (about 430 KiB) and the logs, not a second one beside it."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no unprivileged mount namespace here (unshare -rm) to mount a small tmpfs in")
    disk, run, kept = tmp_path / "disk", tmp_path / "disk" / "run", tmp_path / "kept"
    disk.mkdir()
    # The tmpfs lives as long as the namespace: copy what the run left to real disk before it goes.
    script = f'mount -t tmpfs -o size=640k tmpfs "$1" || exit 90; shift; "$@"; echo "rc=$?"; ' \
             f'cp -a {run} {kept}'
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", str(disk), *_train_cmd(tmp_path, corpus_dir, run)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    if proc.returncode == 90:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert "rc=2" in proc.stdout.splitlines(), proc.stdout[-2000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr[-3000:]
    assert f"the previous checkpoint {run}/checkpoints/last is intact" in errors[0]
    _assert_last_checkpoint_is_whole(kept, step=2)
