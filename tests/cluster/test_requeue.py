"""A signal to a job of `hydra/launcher=local` (submitit's local executor: jobs started as SLURM starts them):
SIGUSR2, submitit's checkpoint-and-requeue signal, and SIGTERM, which submitit does not requeue on.

SIGUSR2 reaches every task of a 2-task job: the run finishes its step, writes `last`, and hands the signal to
submitit's own handler, which checkpoints the job's callable (Hydra's launcher: the same job again) and
requeues it; the requeued job, with the same job id, continues its own checkpoint by itself, and its final
weights equal, bit for bit, those of the same 2-rank run never interrupted. SIGTERM stops the job after its
checkpoint too, and the sweep then ends with one line that says so and how to resume.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import assert_same_weights, train_two_ranks
from conftest import ROOT, compose_train, fast_overrides, write_corpus

from minigpt.checkpoint import format as ckpt
from minigpt.cli import to_object
from minigpt.training.config import TrainConfig

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
pytestmark = pytest.mark.slow

STEPS = 200  # long enough that a signal sent at step 10 arrives well before the end
RUN = ("logging.sample_tokens=0", "trainer.eval_every=100000", "trainer.ckpt_every=100000",
       "logging.progress_bar=true", "logging.log_every=5")


def _sweep(root: Path, tasks: int, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "-m", "hydra/launcher=local",
           f"hydra.launcher.tasks_per_node={tasks}", *args, f"hydra.sweep.dir={root / 'sweep'}"]
    cwd = root / "cwd"  # not above the corpus: its file names (and so its split) are absolute, as here
    cwd.mkdir(exist_ok=True)
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _tasks(root: Path) -> list[int]:
    """The PIDs of the job's tasks: processes submitit started (SUBMITIT_LOCAL_GLOBALID in their environment)
    on this sweep's submitit folder (in their command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            if any(v.startswith(b"SUBMITIT_LOCAL_GLOBALID=") for v in environ) and \
                    str(root).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def _signal_the_job_at(root: Path, text: str, sig: signal.Signals, sweep: subprocess.Popen,
                       tasks: int) -> None:
    log = root / "sweep" / "0" / "train.log"
    deadline = time.monotonic() + 240
    while not (log.exists() and text in log.read_text()):
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in {log}"
        time.sleep(0.02)
    pids = _tasks(root)
    assert len(pids) == tasks, pids
    for pid in pids:  # as `scancel --signal` or SLURM's warning reaches every task of the job
        os.kill(pid, sig)


def test_sigusr2_checkpoints_requeues_through_submitit_and_resumes_bitwise(tmp_path):
    root = tmp_path
    common = [*fast_overrides(root, write_corpus(root / "corpus")), *RUN, f"trainer.max_steps={STEPS}"]
    reference = to_object(compose_train(common), TrainConfig)
    train_two_ranks([(reference, root / "reference")])  # it also prepares the data the job reuses
    sweep = _sweep(root, 2, *common)
    _signal_the_job_at(root, f"step 10/{STEPS} |", signal.SIGUSR2, sweep, tasks=2)
    out, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err[-3000:]
    assert "Traceback" not in err and not [line for line in err.splitlines() if line.startswith("error:")]
    job = root / "sweep" / "0"
    log = (job / "train.log").read_text()
    assert "reusing prepared data" in log  # the reference's: the same documents, split alike
    stopped = int(log.split("stopped by SIGUSR2 at step ")[1].split(";")[0])
    assert 10 <= stopped < STEPS
    assert "Requeued job" in log  # submitit's own line, in the job's log (its logger writes there too)
    assert f"was requeued: continuing its own checkpoint {job}/checkpoints/last" in log
    assert f"resumed from {job}/checkpoints/last at step {stopped}" in log
    assert ckpt.read_meta(job / "checkpoints" / "last")["step"] == STEPS
    assert_same_weights(job, root / "reference")
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["best", "last"]


def test_a_stop_that_is_not_requeued_fails_its_job(tmp_path):
    """submitit requeues on its own signal only; on SIGTERM the job ends after its checkpoint, and the sweep
    says so in one line, with the command that continues it."""
    root = tmp_path
    common = [*fast_overrides(root, write_corpus(root / "corpus")), *RUN, f"trainer.max_steps={STEPS}"]
    sweep = _sweep(root, 1, *common)
    _signal_the_job_at(root, f"step 10/{STEPS} |", signal.SIGTERM, sweep, tasks=1)
    _, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: a sweep job failed: stopped by SIGTERM at step ")
    job = root / "sweep" / "0"
    step = ckpt.read_meta(job / "checkpoints" / "last")["step"]
    assert f"stopped by SIGTERM at step {step}, checkpoint {job}/checkpoints/last written" in lines[0]
    assert f"trainer.resume=auto hydra.run.dir={job}" in lines[0] and "Traceback" not in err
