"""Several machines with torchrun, tested on one machine as two "nodes" (gloo on 127.0.0.1).

Two `torchrun --nnodes=2 --nproc_per_node=1 --node_rank=i` processes, each in a launch folder of its own,
train one run: global rank 0 (node 0) alone writes the run folder, rank 1 (node 1, LOCAL_RANK 0 there) trains
along. Its weights must equal, bit for bit, those of a single-node 2-rank run with the same global batch, and
so must the weights after stopping halfway and resuming with the same two-node command. Cheaper in-process
checks show that the data cache is prepared under a global barrier (node 1 waits for node 0, not only for its
own local rank 0) and that a run folder one node cannot see stops the run with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from cluster_helpers import assert_same_weights, event_writers, free_port, train_two_ranks
from conftest import ROOT, compose_train, fast_overrides, write_corpus

from minigpt.cli import to_object
from minigpt.cluster import launch as launch_module
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.distributed import main_process_first, process_group
from minigpt.errors import UserError
from minigpt.training.config import TrainConfig

pytestmark = pytest.mark.slow

STEPS, HALF = 4, 2
LAST = Path("checkpoints") / "last"


def _two_nodes(root: Path, *args: str) -> list[subprocess.CompletedProcess]:
    """`torchrun --nnodes=2 ... --node_rank=i scripts/train.py args` for i = 0, 1, at the same time.

    Each node writes into files of its own, read once both have ended: a pipe that nobody drains can stall
    the node that fills it, and with it the other. A node that fails ends the other at once, which would
    otherwise wait for it in torchrun's exit barrier (5 minutes); so does the time limit.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    port = free_port()
    procs, outputs = [], []
    for node in (0, 1):
        cwd = root / f"node{node}"
        cwd.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}",
               str(ROOT / "scripts" / "train.py"), *args]
        out, err = (root / f"node{node}.{stream}" for stream in ("out", "err"))
        with out.open("w") as out_file, err.open("w") as err_file:  # the child keeps its own descriptors
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out_file, stderr=err_file,
                                          start_new_session=True))  # its own group: torchrun and its worker
        outputs.append((out, err))
    deadline = time.monotonic() + 300
    while any(p.poll() is None for p in procs):
        if any(p.returncode for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        time.sleep(0.1)
    return [subprocess.CompletedProcess(p.args, p.returncode, out.read_text(), err.read_text())
            for p, (out, err) in zip(procs, outputs, strict=True)]


def _succeeded(results: list[subprocess.CompletedProcess]) -> None:
    for node, proc in enumerate(results):
        assert proc.returncode == 0, f"node {node} exited {proc.returncode}: {proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    # optim.decay_steps fixed: the schedule must not depend on max_steps (HALF, then resume to STEPS).
    common = [*fast_overrides(root, write_corpus(root / "corpus")), "logging.sample_tokens=0",
              f"optim.decay_steps={STEPS}", f"trainer.eval_every={HALF}", f"trainer.ckpt_every={HALF}"]
    half, full = (to_object(compose_train([*common, f"trainer.max_steps={n}"]), TrainConfig)
                  for n in (HALF, STEPS))
    train_two_ranks([(half, root / "one_node_half"), (full, root / "one_node")])  # also prepares the data
    run = root / "run"
    _succeeded(_two_nodes(root, *common, f"trainer.max_steps={HALF}", f"hydra.run.dir={run}"))
    halfway = {"writers": event_writers(run), "meta": json.loads((run / LAST / "meta.json").read_text())}
    shutil.copy(run / LAST / "model.safetensors", root / "halfway.safetensors")  # resume overwrites `last`
    return root, halfway, common


def test_two_nodes_train_one_run_like_one_node_with_two_ranks(runs):
    root, halfway, _ = runs
    run = root / "run"
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "train.log").is_file()
    assert len(halfway["writers"]) == 1  # one process, global rank 0, wrote TensorBoard events
    assert "step 0/" in (run / "train.log").read_text()
    for node in (0, 1):
        assert not list((root / f"node{node}").iterdir())  # no node made a folder where it was launched
    assert (halfway["meta"]["step"], halfway["meta"]["world_size"]) == (HALF, 2)
    assert_same_weights(root / "halfway.safetensors", root / "one_node_half")


def test_two_nodes_resume_and_match_one_node(runs):
    root, _, common = runs
    run = root / "run"
    second = _two_nodes(root, *common, f"trainer.max_steps={STEPS}", "trainer.resume=auto",
                        f"hydra.run.dir={run}")
    _succeeded(second)
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    assert (meta["step"], meta["world_size"]) == (STEPS, 2)
    assert "resumed from" in (run / "train.log").read_text()
    assert_same_weights(run, root / "one_node")


# ------------------------------------------------------------------- in-process: two "nodes" as two forks


def _node_worker(rank: int, port: int, root: str, check: str) -> None:
    """Rank `rank` on node `rank`: LOCAL_RANK is 0 on both, as with one process per machine."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env = DistEnv(rank=rank, local_rank=0, world_size=2, nodes=2)
    out = Path(root) / f"rank{rank}.txt"
    if check == "cache":
        with process_group(env), main_process_first(env):
            if rank == 0:
                time.sleep(1.0)  # long enough that a rank not held by the barrier would look first
                (Path(root) / "prepared").write_text("rank 0")
            out.write_text(str((Path(root) / "prepared").exists()))
        return
    if rank == 1:  # this "node" does not see rank 0's filesystem
        launch_module.folder_visible = lambda path: False
    launch = launch_module.Launch(env)
    try:
        launch.run(lambda: launch.share((None, Path(root))))
        out.write_text("trained")
    except UserError as e:
        out.write_text(f"UserError: {e}")
    except SystemExit as e:
        out.write_text(f"exit {e.code}")


def _on_two_nodes(root: Path, check: str) -> list[str]:
    mp.start_processes(_node_worker, args=(free_port(), str(root), check), nprocs=2, start_method="fork")
    return [(root / f"rank{r}.txt").read_text() for r in (0, 1)]


def test_the_data_cache_is_prepared_once_behind_a_global_barrier(tmp_path: Path):
    """main_process_first holds every other rank, on every node, until global rank 0 has prepared."""
    assert _on_two_nodes(tmp_path, "cache") == ["True", "True"]


def test_a_run_folder_that_one_node_cannot_see_stops_every_rank(tmp_path: Path):
    rank0, rank1 = _on_two_nodes(tmp_path, "visible")
    assert rank0.startswith("UserError: the run folder") and "filesystem that all nodes share" in rank0
    assert rank1 == "exit 2"
