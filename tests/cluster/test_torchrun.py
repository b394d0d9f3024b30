"""`torchrun --nproc_per_node=2 scripts/train.py ...` exactly as a user types it (gloo on CPU).

The in-process distributed tests (test_distributed.py) call `train()` directly; these run the real
launch protocol: only rank 0 composes the config and creates the run folder, and the other rank trains
rank 0's config in rank 0's folder. A resume through the same torchrun command is test_multinode.py's (two
nodes, the weights matched bit for bit); a resume of two ranks on one machine is test_distributed.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, fast_overrides

pytestmark = pytest.mark.slow


def _torchrun(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "scripts" / "train.py"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_trains_in_one_run_folder(tmp_path: Path, corpus_dir: Path):
    run = tmp_path / "run"
    common = [*fast_overrides(tmp_path, corpus_dir), "logging.sample_tokens=0", f"hydra.run.dir={run}"]
    first = _torchrun(tmp_path, *common, "trainer.max_steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    assert (meta["step"], meta["world_size"]) == (4, 2)
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "train.log").is_file()
    # events.out.tfevents.<time>.<host>.<pid>.<n>: every event file comes from one process, rank 0
    writers = {f.name.split(".")[-2] for f in (run / "tb").glob("events.out.tfevents.*")}
    assert len(writers) == 1
    assert not (tmp_path / "outputs").exists()  # no rank made a run folder of its own


def test_torchrun_bad_override_fails_on_every_rank_without_training(tmp_path: Path):
    proc = _torchrun(tmp_path, "model.n_embd=97", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode != 0
    assert "error: model.n_embd=97" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
