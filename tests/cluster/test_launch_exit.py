"""How a rank of a distributed run ends: `os._exit` with its exit code, after its output is flushed.

Python's shutdown can abort a process whose gloo process group DDP has used (docs/clusters.md says why),
so the ranks skip it. What skipping it must not lose is checked against a real process: a pipe's stdout is
block-buffered, and a plain `os._exit` drops what is still in the buffer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minigpt.cluster import launch as launch_module
from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.launch import Launch

ENDING = """
import logging, sys
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
logging.getLogger("minigpt").info("checkpoint written")
print("val loss 4.213", end="")  # stays in the pipe's buffer until flushed
sys.stderr.write("a warning")
{end}
"""


def _end_with(end: str, log: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as srun starts a task
    return subprocess.run([sys.executable, "-c", ENDING.format(end=end), str(log)], capture_output=True,
                          text=True, env=env, timeout=60)


@pytest.mark.slow
def test_a_rank_leaves_with_its_code_and_nothing_it_wrote_is_lost(tmp_path: Path):
    log = tmp_path / "a.log"
    done = _end_with("from minigpt.cluster.launch import leave_process\nleave_process(3)", log)
    assert (done.returncode, done.stdout, done.stderr) == (3, "val loss 4.213", "a warning")
    assert "checkpoint written" in log.read_text()


@pytest.mark.slow
def test_without_the_flush_os_exit_would_drop_the_console_output(tmp_path: Path):
    """The control: what leave_process guards against really happens."""
    done = _end_with("import os; os._exit(3)", tmp_path / "b.log")
    assert (done.returncode, done.stdout) == (3, "")


RANK_1_OF_2 = DistEnv(rank=1, local_rank=1, world_size=2)


@pytest.mark.parametrize(("ending", "code", "printed"), [
    (None, 0, ""),
    (SystemExit(2), 2, ""),  # exit_with_error: its line is already printed
    (SystemExit(None), 0, ""),
    (SystemExit("bad input"), 1, "bad input\n"),  # what Python itself would print and return
])
def test_every_ending_of_a_rank_becomes_its_exit_code(monkeypatch, capsys, ending, code, printed):
    def run(self, rank0_main, argv=()):
        if ending is not None:
            raise ending

    left = []
    monkeypatch.setattr(Launch, "run", run)
    monkeypatch.setattr(launch_module, "leave_process", left.append)
    Launch(RANK_1_OF_2).run_process(lambda: None)
    assert left == [code]
    assert capsys.readouterr().err == printed


def test_a_single_process_ends_the_ordinary_way(monkeypatch):
    """Without a process group there is nothing to skip: SystemExit travels on, and Python shuts down."""
    def run(self, rank0_main, argv=()):
        raise SystemExit(2)

    monkeypatch.setattr(Launch, "run", run)
    monkeypatch.setattr(launch_module, "leave_process", lambda code: pytest.fail("left by os._exit"))
    with pytest.raises(SystemExit) as ended:
        Launch(DistEnv()).run_process(lambda: None)
    assert ended.value.code == 2
