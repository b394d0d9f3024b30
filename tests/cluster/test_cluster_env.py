"""A process's place in a cluster run, read from SLURM's, submitit's or torchrun's variables (no processes).

The references are independent: submitit's own parser of SLURM node lists and its TorchDistributedEnvironment
(what submitit itself would export for torch), and the plugin's schema for the launcher configs.
"""

from __future__ import annotations

import os
import sys

import pytest
from conftest import CONFIG_DIR, compose_train
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from minigpt.cluster.dist_env import DistEnv, first_host, launcher_of, rendezvous_defaults
from minigpt.cluster.launch import Launch
from minigpt.errors import UserError

SLURM_TASK = {  # what srun sets in task 5 of a 2-node x 4-task job step (a subset)
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_STEP_NODELIST": "gpu[007-008]",
}
LOCAL_TASK = {  # what submitit's local executor sets in task 1 of a 2-task job
    "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "31337", "SUBMITIT_LOCAL_GLOBALID": "1",
    "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_NODEID": "0",
    "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
}


def test_srun_tasks_read_their_place_from_slurm():
    env = DistEnv.from_env(SLURM_TASK)
    assert (env.rank, env.local_rank, env.world_size, env.nodes, env.launcher) == (5, 1, 8, 2, "slurm")
    assert env.enabled and not env.is_main


def test_a_batch_script_is_one_process_though_slurm_counts_tasks():
    """Outside an srun step (no SLURM_STEP_ID) SLURM_NTASKS is the allocation, not this process's peers."""
    batch = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_STEP_ID"} | {"SLURM_PROCID": "0"}
    assert DistEnv.from_env(batch) == DistEnv(job_id="4242")  # one process, of job 4242


def test_torchrun_wins_over_slurm_and_submitit_local_over_an_outer_slurm_step():
    torchrun = {**SLURM_TASK, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    assert launcher_of(torchrun) == "torchrun" and DistEnv.from_env(torchrun).world_size == 2
    local_inside_srun = {**SLURM_TASK, **LOCAL_TASK}  # a local sweep started from an interactive srun shell
    env = DistEnv.from_env(local_inside_srun)
    assert (env.rank, env.local_rank, env.world_size, env.launcher) == (1, 1, 2, "submitit_local")


@pytest.mark.parametrize("env, match", [
    ({**SLURM_TASK, "SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
    ({**SLURM_TASK, "SLURM_PROCID": "8"}, "inconsistent slurm environment SLURM_PROCID=8"),
    ({**LOCAL_TASK, "SUBMITIT_LOCAL_NTASKS": "0"}, "inconsistent submitit_local environment"),
])
def test_a_broken_launcher_environment_is_one_line(env, match):
    with pytest.raises(UserError, match=match):
        DistEnv.from_env(env)


@pytest.mark.parametrize("nodelist", [
    "node[001-004]", "gpu7,gpu9", "a[1,3-5]b", "rack[1-2]-node[07-09]", "login", "n[09-11],m[1-2]", "x-[3]",
])
def test_the_first_host_of_a_node_list_is_submitits(nodelist):
    from submitit.slurm.slurm import _parse_node_list

    assert first_host(nodelist) == _parse_node_list(nodelist)[0]


def test_rendezvous_matches_what_submitit_exports(monkeypatch):
    from submitit.helpers import TorchDistributedEnvironment

    for name, value in {**SLURM_TASK, "SUBMITIT_EXECUTOR": "slurm"}.items():
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    theirs = TorchDistributedEnvironment()
    ours, meet = DistEnv.from_env(), rendezvous_defaults()
    assert (ours.rank, ours.local_rank, ours.world_size) == (theirs.rank, theirs.local_rank,
                                                            theirs.world_size)
    assert meet["MASTER_ADDR"] == theirs.master_addr == "gpu007"


def test_every_task_of_a_job_meets_on_one_port_and_other_jobs_elsewhere():
    port = rendezvous_defaults(SLURM_TASK)["MASTER_PORT"]
    task0 = {**SLURM_TASK, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert rendezvous_defaults(task0)["MASTER_PORT"] == port
    assert rendezvous_defaults({**SLURM_TASK, "SLURM_JOB_ID": "4243"})["MASTER_PORT"] != port
    assert 20000 <= int(port) < 60000
    assert rendezvous_defaults({**SLURM_TASK, "MASTER_PORT": "29500"}) == {"MASTER_ADDR": "gpu007"}
    assert rendezvous_defaults(LOCAL_TASK)["MASTER_ADDR"] == "127.0.0.1"
    assert rendezvous_defaults({"RANK": "0", "WORLD_SIZE": "2"}) == {}  # torchrun says it itself


@pytest.mark.parametrize("env, launcher", [
    (DistEnv(), "python scripts/train.py"),
    (DistEnv(rank=0, world_size=2, launcher="torchrun"), "torchrun --nproc_per_node=2 scripts/train.py"),
    (DistEnv(rank=0, world_size=4, nodes=2, launcher="torchrun"), "torchrun --nnodes=2 --nproc_per_node=2"),
    (DistEnv(rank=0, world_size=8, nodes=2, launcher="slurm"), "srun --nodes=2 --ntasks=8 python"),
])
def test_the_resume_command_names_the_same_launcher(env, launcher, tmp_path):
    command = Launch(env).resume_command(tmp_path, ["model=small", "trainer.resume=x"])
    assert command.startswith(launcher)
    assert command.endswith(f"model=small trainer.resume=auto hydra.run.dir={tmp_path}")


@pytest.mark.parametrize("option, plugin_option, chosen", [
    ("local", "submitit_local", {"submitit_folder", "gpus_per_node"}),
    ("slurm", "submitit_slurm", {"submitit_folder", "gpus_per_node", "setup", "max_num_timeout"}),
])
def test_launcher_options_extend_the_plugins_and_restate_only_its_defaults(option, plugin_option, chosen):
    """configs/hydra/launcher/<option>.yaml is the plugin's config; only `chosen` keys leave its defaults."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    ours, theirs = (_launcher_config(name) for name in (option, plugin_option))
    assert ours.keys() == theirs.keys()
    assert {k for k in ours if ours[k] != theirs[k]} == chosen


def _launcher_config(option: str) -> dict:
    compose_train()  # registers the schemas and the run-folder resolver
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        cfg = compose(config_name="train", overrides=[f"hydra/launcher={option}"], return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=False)


def test_a_sweep_on_slurm_without_the_plugin_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    from cli_helpers import run_script

    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_submitit_launcher", None)  # as if not installed
    result = run_script("train", ["-m", "hydra/launcher=slurm", "trainer.max_steps=1,2",
                                  f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys)
    assert result.code == 2
    assert result.err_lines == ["error: hydra/launcher=slurm needs Hydra's submitit launcher plugin: "
                                "pip install -e '.[cluster]'"]
    assert not (tmp_path / "sweep").exists()


def test_a_follower_closes_the_log_file_hydra_opened_for_it(tmp_path):
    """In a submitit job Hydra's job ran in every task, with the run's log file open in each."""
    import logging

    from minigpt.cluster import launch

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    file_handler, console = logging.FileHandler(tmp_path / "train.log"), logging.StreamHandler()
    root.handlers[:] = [console, file_handler]
    try:
        launch._leave_the_logs_to_rank0()
        assert root.handlers == [console] and root.level == logging.ERROR
        logging.getLogger("minigpt").error("from rank 1")
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
    assert (tmp_path / "train.log").read_text() == ""


class _Submitted(Exception):
    """Raised instead of calling sbatch: carries the script submitit would have submitted."""


def test_the_slurm_option_becomes_this_sbatch_script(monkeypatch, capsys, tmp_path):
    """The real sweep command up to sbatch: our keys, through the plugin, into submitit's sbatch script."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    import submitit
    from cli_helpers import run_script

    fake_bin = tmp_path / "bin"  # submitit's SLURM executor wants srun on PATH before it writes anything
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake_bin / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")

    def map_array(executor, fn, *args):
        raise _Submitted(executor._executor._make_submission_file_text("COMMAND", "uid"))

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", map_array)
    sweep = tmp_path / "sweep"
    with pytest.raises(_Submitted) as submitted:
        run_script("train", ["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                             "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=8",
                             "hydra.launcher.timeout_min=240", "optim.lr=1e-3,3e-3",
                             f"hydra.sweep.dir={sweep}"], capsys)
    script = str(submitted.value)
    for flag in ("--partition=gpu", "--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--time=240",
                 f"--output={sweep}/.submitit/%j_0_log.out"):
        assert f"#SBATCH {flag}\n" in script, flag
    setup, command = script.index("export SLURM_KILL_BAD_EXIT=1"), script.index("srun --unbuffered")
    assert setup < command and script.rstrip().endswith("COMMAND")
