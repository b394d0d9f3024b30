"""Faults of one rank of `torchrun --nproc_per_node=2 scripts/train.py` (gloo on CPU), the real command.

- A rank killed with SIGKILL: the survivor ends with one line naming the dead rank and the last intact
  checkpoint, and exits non-zero; no gloo traceback reaches the console (it goes to train.log). Either rank.
- A disk error on rank 0 (a file size limit on the real processes): rank 0's one line, and nothing from
  rank 1, whose collective failed when rank 0 left.
- A stop signal to one rank only: every rank stops after the same step, one checkpoint, one resume line.

torchrun adds its own report of a failed worker (a `ChildFailedError` block, not the workers' tracebacks):
that is torchrun's, and not ours to change.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import train_two_ranks
from conftest import ROOT, compose_train, fast_overrides

from minigpt.checkpoint import format as ckpt
from minigpt.checkpoint.load import load_model
from minigpt.cli import to_object
from minigpt.training.config import TrainConfig

pytestmark = pytest.mark.slow

LONG = ("trainer.max_steps=100000", "trainer.eval_every=4", "trainer.ckpt_every=4", "logging.sample_tokens=0",
        "logging.progress_bar=true", "logging.log_every=2")


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _torchrun(run: Path, args: list[str], **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "scripts" / "train.py"), *args, f"hydra.run.dir={run}"]
    return subprocess.Popen(cmd, cwd=run.parent, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def _worker(torchrun: subprocess.Popen, rank: int) -> int:
    """The PID of torchrun's worker process of global rank `rank`."""
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (proc / "environ").read_bytes().split(b"\0")
            if parent == torchrun.pid and f"RANK={rank}".encode() in environ:
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no worker of rank {rank} under torchrun {torchrun.pid}")


def _when_logged(run: Path, text: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while not ((run / "train.log").exists() and text in (run / "train.log").read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in {run}/train.log"
        time.sleep(0.02)


def _ours(stderr: str) -> list[str]:
    """Our lines among torchrun's: the `error:` lines."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_is_named_by_its_survivor(victim, tmp_path, corpus_dir):
    run = tmp_path / "run"
    proc = _torchrun(run, [*fast_overrides(tmp_path, corpus_dir), *LONG])
    _when_logged(run, "step 6/", proc)  # the step-4 checkpoint is written by now
    os.kill(_worker(proc, victim), signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    lines = _ours(err)
    survivor = "" if victim == 1 else "[rank 1] "
    assert len(lines) == 1 and lines[0].startswith(f"error: {survivor}rank {victim} died"), err[-3000:]
    meta = ckpt.read_meta(run / "checkpoints" / "last")
    assert f"the last intact checkpoint is {run}/checkpoints/last (step {meta['step']})" in lines[0]
    assert meta["step"] >= 4 and load_model(run / "checkpoints" / "last", "cpu")[2]["step"] == meta["step"]
    assert "trainer.resume=auto" in lines[0]
    for noise in ("pair.cc", "[rank0]:", "[rank1]:", "Error executing job"):  # no worker's traceback
        assert noise not in err, err[-3000:]
    if victim == 1:  # rank 0 survived: the collective's full traceback is in the run's log, for the record
        assert "pair.cc" in (run / "train.log").read_text()


def test_a_disk_error_on_rank_0_is_one_line_and_the_other_rank_stays_quiet(tmp_path, corpus_dir, monkeypatch):
    run = tmp_path / "run"
    common = [*fast_overrides(tmp_path, corpus_dir), "logging.sample_tokens=0", "trainer.ckpt_every=2"]
    # the 2-rank checkpoint the command resumes, trained by two forks of this process: no torchrun to start;
    # from the folder the command starts in, which names the corpus's files as the command will
    monkeypatch.chdir(run.parent)
    train_two_ranks([(to_object(compose_train([*common, "trainer.max_steps=2"]), TrainConfig), run)])
    limit = (run / "checkpoints" / "last" / ckpt.WEIGHTS).stat().st_size // 2  # the next weights cannot fit
    proc = _torchrun(run, [*common, "trainer.max_steps=6", "trainer.resume=auto"],
                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    lines = _ours(err)
    assert len(lines) == 1 and "checkpoint not saved" in lines[0], err[-3000:]
    assert "File too large" in lines[0]
    assert "[rank 1]" not in err and "pair.cc" not in err and "[rank1]:" not in err, err[-3000:]
    assert ckpt.read_meta(run / "checkpoints" / "last")["step"] == 2  # the previous one, intact


def test_a_stop_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path, corpus_dir):
    run = tmp_path / "run"
    proc = _torchrun(run, [*fast_overrides(tmp_path, corpus_dir), *LONG])
    _when_logged(run, "step 6/", proc)
    os.kill(_worker(proc, 1), signal.SIGUSR1)  # SLURM's warning, reaching one task
    out, err = proc.communicate(timeout=120)
    assert _ours(err) == [] and "minigpt/" not in err and 'train.py", line' not in err, err[-3000:]
    step = int(out.split("stopped at step ")[1].split(";")[0])
    assert ckpt.read_meta(run / "checkpoints" / "last")["step"] == step
    assert "resume with:  torchrun --nproc_per_node=2 scripts/train.py" in out
    assert f"stopped by SIGUSR1 at step {step}" in (run / "train.log").read_text()
