"""The smaller faults, each through the real command: a reader that leaves the pipe (`train.py | head -1`), a
prompt longer than the context, a run folder whose name needs quoting in the printed resume command, and a
file size limit while data is prepared. (A refused run leaving no run folder, a full disk in the cache and a
key of a null config group are rows of project/test_errors.py.)"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
from cli_helpers import run_script
from conftest import ROOT, compose_train, fast_overrides

from minigpt.cluster.dist_env import DistEnv
from minigpt.cluster.launch import Launch
from minigpt.errors import shell_override


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


@pytest.mark.slow
def test_a_reader_that_leaves_the_pipe_does_not_fail_the_training(tmp_path, corpus_dir):
    """`train.py | head -1`: the pipe's read end closes after the first line; the run trains to its end and
    exits 0, its train.log complete, and nothing about the closed pipe is printed."""
    run = tmp_path / "run"
    read_end, write_end = os.pipe()
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *fast_overrides(tmp_path, corpus_dir),
           "logging.sample_tokens=0", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        first = reader.readline()  # what head -1 reads, before it exits
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert first.startswith("threads: ") and err == ""  # the first log line
    assert "done: step 8" in (run / "train.log").read_text()


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_said_to_be_cut(tmp_path, corpus_dir, capsys):
    run = tmp_path / "run"
    trained = run_script("train", [*fast_overrides(tmp_path, corpus_dir), "trainer.max_steps=2",
                                   "logging.sample_tokens=0", f"hydra.run.dir={run}"], capsys)
    assert trained.code == 0
    prompt = "x = 1 + 2  " * 10  # 110 byte tokens, and one eot: the context is 32
    result = run_script("generate", [f"checkpoint={run}", f"prompt='{prompt}'", "max_new_tokens=4",
                                     "device=cpu", f"hydra.run.dir={tmp_path / 'gen'}"], capsys)
    assert result.code == 0, result.err
    seen = 16 + (110 - 32 - 1) % (32 - 16 + 1)  # the window rule (sampling/sequences.py), keep = 32 // 2
    assert result.err_lines[0] == ("note: the prompt has 110 tokens, more than the model's context of 32; it "
                                   f"continues from the last {seen} of them")


@pytest.mark.slow
@pytest.mark.parametrize("value", ["/tmp/my run é", "/tmp/a'b\"c", "/tmp/back\\slash\\", "/tmp/${x}/$HOME",
                                   "/tmp/a,b=[c]:{d}", "/tmp/wow!", "/tmp/`x`", "/tmp/plain-path_1.2"])
def test_a_printed_override_pastes_back_into_a_shell_and_hydra_as_the_same_value(value):
    """bash (the real shell) and Hydra's composition together read back exactly the value quoted."""
    pasted = subprocess.run(["bash", "-c", f"printf %s {shell_override('data.cache_dir', value)}"],
                            capture_output=True, text=True, check=True).stdout
    assert compose_train([pasted]).data.cache_dir == value


def test_the_resume_command_quotes_the_run_folder_for_hydra_and_the_shell(tmp_path):
    command = Launch(DistEnv()).resume_command(tmp_path / "run é 1", ["optim.lr=1e-3", "x.y='a b'"])
    assert command == ("python scripts/train.py optim.lr=1e-3 'x.y='\"'\"'a b'\"'\"'' trainer.resume=auto "
                       f"\"hydra.run.dir='{tmp_path}/run é 1'\"")


@pytest.mark.slow
def test_a_file_size_limit_while_preparing_names_the_dataset_folder(tmp_path, corpus_dir):
    """RLIMIT_FSIZE on a real process: the shard write fails with EFBIG (an OSError without a file name);
    the line names the dataset folder being built, and no temporary folder stays."""
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_data.py"), "data=text",
                           f"data.paths=[{corpus_dir}]", "tokenizer=byte", f"data.cache_dir={cache}",
                           f"hydra.run.dir={tmp_path / 'out'}"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=300,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: cannot write {cache}/text-byte-") and "File too large" in lines[0]
    assert list(cache.iterdir()) == []
