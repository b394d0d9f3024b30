"""Sweeps through Hydra's submitit launcher (`hydra/launcher=local`): every job in processes of its own.

submitit's local executor starts jobs exactly as on SLURM (a pickled task function, one process per task,
the task's place in environment variables), only on this machine. One sweep of three jobs with two tasks each
covers the launcher path: two jobs train with DDP across their tasks, task 0 alone writing each job's folder,
and the third has a bad value, which ends that job with one line in its own log and the sweep with one line,
after the others finished. Six processes pay a torch import each: one sweep, started once for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import assert_same_weights, event_writers, train_two_ranks
from conftest import ROOT, compose_train, fast_overrides, write_corpus

from minigpt.cli import to_object
from minigpt.training.config import TrainConfig

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
pytestmark = pytest.mark.slow

STEPS = ("2", "3", "-1")  # the sweep: two good jobs and a bad value


def _train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("submitit")
    common = [*fast_overrides(root, write_corpus(root / "corpus")), "logging.sample_tokens=0"]
    # The reference first (it also prepares the data cache the jobs then reuse): job 0's config, 2 ranks.
    reference = to_object(compose_train([*common, "trainer.max_steps=2"]), TrainConfig)
    train_two_ranks([(reference, root / "reference")])
    (root / "cwd").mkdir()  # where the sweep is launched: nothing may appear there
    proc = _train(root / "cwd", "-m", "hydra/launcher=local", "hydra.launcher.tasks_per_node=2", *common,
                  f"trainer.max_steps={','.join(STEPS)}", f"hydra.sweep.dir={root / 'sweep'}")
    return root, proc


def test_each_job_trains_with_ddp_across_its_tasks_in_its_own_folder(sweep):
    root, proc = sweep
    for num, steps in enumerate(STEPS[:2]):
        job = root / "sweep" / str(num)
        meta = json.loads((job / "checkpoints" / "last" / "meta.json").read_text())
        assert (meta["step"], meta["world_size"]) == (int(steps), 2), proc.stderr[-2000:]
        assert len(event_writers(job)) == 1  # task 0 alone wrote TensorBoard events
        log = (job / "train.log").read_text()
        assert "process group: rank 0 of 2" in log and "rank 1" not in log  # task 1 wrote nothing there
        assert "step 0/" in log and "done: step" in log
    assert_same_weights(root / "sweep" / "0", root / "reference")  # torchrun's DDP, bit for bit
    assert not list((root / "cwd").iterdir())  # no task made a folder of its own


def test_a_bad_value_fails_its_job_alone_with_one_line(sweep):
    root, proc = sweep
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: a sweep job failed: "), proc.stderr
    assert "trainer.max_steps=-1 must be at least 1" in errors[0]
    log_path = Path(errors[0].split("(its log: ")[1].split(")")[0])
    assert log_path.parent == root / "sweep" / ".submitit"
    assert log_path.read_text().splitlines() == ["error: trainer.max_steps=-1 must be at least 1"]
    bad_job = root / "sweep" / "2"
    assert not (bad_job / "checkpoints").exists()
    assert "trainer.max_steps=-1 must be at least 1" in (bad_job / "train.log").read_text()


def test_a_bad_override_stops_the_sweep_before_any_job_is_submitted(tmp_path: Path):
    """Hydra composes every job's config in the launching process first: a wrong type submits nothing."""
    proc = _train(tmp_path, "-m", "hydra/launcher=local", "trainer.max_steps=2,abc",
                  f"hydra.sweep.dir={tmp_path / 'sweep'}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "trainer.max_steps" in lines[0], proc.stderr
    assert not (tmp_path / "sweep" / ".submitit").exists()
