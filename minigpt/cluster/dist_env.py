"""This process's place in a multi-process run, read from the environment its launcher set (no torch needed).

Three launchers start several copies of `scripts/train.py` and tell each one its place through environment
variables; minigpt reads the first that is present:

    launcher                     global rank              rank on this node        processes
    torchrun                     RANK                     LOCAL_RANK               WORLD_SIZE
    submitit's local executor    SUBMITIT_LOCAL_GLOBALID  SUBMITIT_LOCAL_LOCALID   SUBMITIT_LOCAL_NTASKS
    SLURM's srun (and submitit)  SLURM_PROCID             SLURM_LOCALID            SLURM_NTASKS

A plain `python scripts/train.py` sets none of them and is one process, `DistEnv()`. SLURM's variables count
only inside an `srun` job step (SLURM_STEP_ID set): a batch script also carries SLURM_NTASKS, but there it is
the one process that will call srun, not one of N tasks, and reading it as a rank would wait forever for the
others.

torchrun also says where the ranks meet (MASTER_ADDR, MASTER_PORT); srun and submitit do not, so
`rendezvous_defaults` derives them the way submitit's TorchDistributedEnvironment does: the first host of the
job's node list, and a port drawn from the job id (the same on every task, different for jobs sharing a node).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from minigpt.errors import UserError

# launcher -> the names of (global rank, rank on this node, number of processes)
RANK_VARIABLES = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    "submitit_local": ("SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_NTASKS"),
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
}
# The rendezvous port is drawn from the job id in submitit's range, 20000-59999: wide, so that jobs sharing a
# node rarely meet on one port, and above the ports that system services use.
PORT_LOW, PORT_SPAN = 20000, 40000


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the run: global rank, rank on this node, number of processes and of nodes."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    nodes: int = 1
    launcher: str = "python"  # python (one process) | torchrun | submitit_local | slurm
    # The scheduler's job this process belongs to (SLURM's, or submitit's local one), whatever started the
    # process inside it: the same after the job is requeued, so a requeued job finds its own checkpoint.
    job_id: str | None = None

    @property
    def is_main(self) -> bool:
        """Global rank 0 alone writes: logs, TensorBoard, checkpoints, the run folder (on any node)."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DistEnv:
        """Read what the launcher set; a plain `python scripts/train.py` (none of it set) is one process."""
        launcher = launcher_of(environ)
        if launcher == "python":
            return cls(job_id=job_id_of(environ))
        names = RANK_VARIABLES[launcher]
        rank, local_rank, world_size = (_integer(environ, n, "1" if i == 2 else "0", launcher)
                                        for i, n in enumerate(names))
        env = cls(rank=rank, local_rank=local_rank, world_size=world_size, launcher=launcher,
                  nodes=_node_count(environ, launcher, world_size), job_id=job_id_of(environ))
        if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
            raise UserError(f"inconsistent {launcher} environment {names[0]}={rank} {names[1]}={local_rank} "
                            f"{names[2]}={world_size} (launch with torchrun --nproc_per_node=N, or srun)")
        return env


def launcher_of(environ: Mapping[str, str]) -> str:
    """Which launcher started this process: torchrun first (it may itself run inside a SLURM step)."""
    if any(n in environ for n in RANK_VARIABLES["torchrun"]):
        return "torchrun"
    if environ.get("SUBMITIT_EXECUTOR") == "local" and "SUBMITIT_LOCAL_GLOBALID" in environ:
        return "submitit_local"
    if "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ:
        return "slurm"
    return "python"


def job_id_of(environ: Mapping[str, str]) -> str | None:
    """The job's id as submitit names it: `<array job>_<task>` in a SLURM job array (what a Hydra sweep
    submits), else SLURM's job id, or submitit's local job's; None outside a job."""
    if environ.get("SUBMITIT_EXECUTOR") == "local" and "SUBMITIT_LOCAL_JOB_ID" in environ:
        return environ["SUBMITIT_LOCAL_JOB_ID"]
    if "SLURM_ARRAY_JOB_ID" in environ and "SLURM_ARRAY_TASK_ID" in environ:
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID")


def rendezvous_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """MASTER_ADDR and MASTER_PORT for torch's env:// rendezvous where the launcher set none (srun, submitit).

    Only the missing ones are returned; a MASTER_PORT the user exported (say, in the sbatch script) wins.
    """
    launcher = launcher_of(environ)
    if launcher == "submitit_local":
        addr, job_id = "127.0.0.1", environ.get("SUBMITIT_LOCAL_JOB_ID", "0")
    elif launcher == "slurm":
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        addr, job_id = first_host(nodelist), environ.get("SLURM_JOB_ID", "0")
    else:
        return {}
    port = PORT_LOW + int("".join(c for c in job_id if c.isdigit()) or "0") % PORT_SPAN
    defaults = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    return {k: v for k, v in defaults.items() if k not in environ}


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `gpu[007-009,12],cpu1` -> `gpu007`, `r[1-2]-n[05-06]` -> `r1-n05`.

    Global rank 0 runs on the first node of the step, so that is where the others meet it. Each bracket holds
    comma-separated numbers or ranges; its first element (zero padding kept) names the first host.
    """
    head = re.match(r"(?:[^,\[]|\[[^\]]*\])+", nodelist.strip())
    if head is None:
        raise UserError(f"cannot read a host from SLURM's node list {nodelist!r} "
                        "(set MASTER_ADDR to rank 0's host)")
    return re.sub(r"\[([^\],\-]*)[^\]]*\]", r"\1", head.group(0))


def _integer(environ: Mapping[str, str], name: str, default: str, launcher: str) -> int:
    raw = environ.get(name, default)
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not an integer (it is set by {launcher}; "
                        "launch with torchrun, which sets RANK, LOCAL_RANK and WORLD_SIZE)") from None


def _node_count(environ: Mapping[str, str], launcher: str, world_size: int) -> int:
    """How many machines the run spans (for messages such as the resume command)."""
    if launcher == "torchrun":
        per_node = environ.get("LOCAL_WORLD_SIZE", "")
        return max(1, world_size // int(per_node)) if per_node.isdigit() and int(per_node) > 0 else 1
    if launcher == "slurm":
        nodes = environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or "1"
        return int(nodes) if nodes.isdigit() else 1
    return 1
