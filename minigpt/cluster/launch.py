"""How `scripts/train.py` runs as one process or as one rank of many (torchrun, srun, a submitit job).

Only global rank 0 goes through Hydra's job: it composes the config, chooses (and creates) the run folder,
then hands the job (config, run folder) to the other ranks with one broadcast. They run `follow(job)`, which
the command names (scripts/train.py: train that very config in that folder), without creating folders or
writing logs of their own. If rank 0 stops before training (a bad override, `--cfg job`, `--help`), it
broadcasts "nothing to do" instead, and the others exit cleanly.

    rank 0                                  ranks > 0 (on this machine or another)
    Hydra composes, makes the run folder    wait in broadcast_object
    share((config, run folder))  ------->   follow((config, run folder))
    every rank: is the run folder visible here?  (no: one line on each such rank, and all of them stop)
    train(config, run folder)               train(config, run folder)  (errors: "[rank r] <message>", exit 2)

Who starts the processes decides where the protocol begins:
- torchrun and srun start N copies of `scripts/train.py`, whose `__main__` calls
  `Launch.run_process(hydra_main)`: only rank 0 gets as far as Hydra, and every rank ends with `os._exit`
  once it has left the process group (`leave_process` says why).
- Hydra's submitit launcher (hydra/launcher=slurm, local) unpickles the task function in every task of every
  job, after Hydra has composed that job's config in each task. `rank0_task(follow)` around the task function
  starts `Launch.run` there: task 0 goes on into the task function, the others follow it as above and drop the
  log file Hydra opened for them. A user error ends such a job as a failed result (`JobFailed`), its one line
  in the job's own log, so the launcher waits for the other jobs and then reports it in one line.

The run folder must be on a filesystem every node sees (on a cluster: the home or project filesystem),
because the other ranks read its checkpoint to resume; the check after the broadcast stops a run where it is
not, which would otherwise resume rank 0 and start the others from scratch.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from minigpt import signals
from minigpt.cluster.dist_env import DistEnv, rendezvous_defaults
from minigpt.errors import (
    USER_ERROR_EXIT_CODE,
    AlreadyReported,
    UserError,
    exit_with_error,
    shell_override,
    unwritable_path_message,
)

Job = tuple[Any, Path]  # the config rank 0 composed, and the run folder it made
Follow = Callable[[Job, DistEnv], int | None]  # ranks > 0 do the job; the stop signal that ended it, or None
R = TypeVar("R")
log = logging.getLogger(__name__)


class JobFailed(Exception):
    """A launcher's job (one setting of a sweep, in processes of its own) that ended with a user error.

    Not a UserError on purpose: Hydra keeps it as the job's result and raises it in the launching process only
    after every job is done; `Launch.run` there prints it as the sweep's one line.
    """


class Launch:
    """This process's part in a (possibly distributed) training command; `follow`: what ranks > 0 do."""

    def __init__(self, env: DistEnv, follow: Follow | None = None, in_job: bool = False) -> None:
        self.env, self.follow = env, follow
        self.in_job = in_job  # a launcher's job (submitit): its failures become JobFailed (rank0_task)
        self._shared = False  # rank 0 broadcasts exactly once, a job or None

    @classmethod
    def from_environ(cls, follow: Follow | None = None) -> Launch:
        """From the launcher's variables (torchrun, srun, submitit); a bad environment ends with one line.

        srun and submitit name no rendezvous address: the derived MASTER_ADDR/PORT are exported for torch.
        """
        try:
            env = DistEnv.from_env()
        except UserError as e:
            exit_with_error(str(e))
        if env.enabled:
            os.environ.update(rendezvous_defaults())
        return cls(env, follow)

    def run(self, rank0_main: Callable[[], R], argv: Sequence[str] = ()) -> R | None:
        """Rank 0 runs `rank0_main` (Hydra's entry point, or its task function) and returns its result; the
        others follow it. torch is imported only where a process group is needed: `--help` stays quick."""
        if self.env.enabled and {"-m", "--multirun"} & set(argv):  # every rank sees the same argv
            if not self.env.is_main:
                # rank 0 says why and fails the job; a failing exit here could make torchrun stop
                # rank 0 before it has printed its message
                sys.exit(0)
            exit_with_error(f"a Hydra multirun (-m) cannot run under {self.env.launcher}; start the sweep "
                            "with plain `python scripts/train.py -m ...` (hydra/launcher=slurm gives each "
                            "job processes of its own), or one torchrun per setting")
        _RUNNING.append(self)
        try:
            if not self.env.enabled:
                sweep = {"-m", "--multirun"} & set(argv)
                with _without_hydra_job_reports() if sweep else contextlib.nullcontext():
                    return rank0_main()
            from minigpt.cluster.distributed import process_group

            if not self.env.is_main:
                _leave_the_logs_to_rank0()
            with process_group(self.env):
                if not self.env.is_main:
                    self._follow_rank0()
                    return None
                try:
                    return rank0_main()
                finally:
                    self.share(None)  # if rank 0 stopped before training, release the waiting ranks
        except KeyboardInterrupt as e:  # a stop signal before the training loop (which handles its own)
            interrupted = e if isinstance(e, signals.Interrupted) else signals.Interrupted(signal.SIGINT)
            if self.env.is_main:  # every rank got it (torchrun forwards it): one line is enough
                print(interrupted.message(), file=sys.stderr)
            sys.exit(interrupted.exit_code)
        except JobFailed as e:  # this process launched a sweep, and a job of it failed
            exit_with_error(f"a sweep job failed: {e}; the other jobs ran to their end")
        finally:
            _RUNNING.remove(self)

    def run_process(self, rank0_main: Callable[[], object], argv: Sequence[str] = ()) -> None:
        """`run` as the whole life of this process (scripts/train.py's `__main__`, started by python, torchrun
        or srun). A rank of a distributed run then ends with `leave_process` instead of Python's shutdown."""
        signals.install_policy()
        if not self.env.enabled:
            self.run(rank0_main, argv)
            return
        code: object = None
        try:
            self.run(rank0_main, argv)
        except SystemExit as e:  # exit_with_error, Hydra's --help, Ctrl-C before training
            code = e.code
        if code is not None and not isinstance(code, int):  # what Python does with sys.exit(message)
            print(code, file=sys.stderr)
            code = 1
        leave_process(code or 0)

    def share(self, job: Job | None) -> None:
        """Rank 0: hand the config and the run folder (or None: nothing to train) to the other ranks, once."""
        if self._shared or not self.env.enabled:
            return
        from minigpt.cluster.distributed import broadcast_object

        self._shared = True
        broadcast_object(job, self.env)
        if job is not None and not self._folder_visible_everywhere(job[1]):
            raise UserError(f"the run folder {job[1]} is not visible on every node: put hydra.run.dir (or "
                            "hydra.sweep.dir) and data.cache_dir on a filesystem that all nodes share")

    def _follow_rank0(self) -> None:
        from minigpt.cluster.distributed import broadcast_object

        job = broadcast_object(None, self.env)
        if job is None:
            return
        if not self._folder_visible_everywhere(job[1]):
            sys.exit(USER_ERROR_EXIT_CODE)  # this rank, and rank 0, have said why
        try:
            stop_signal = self.follow(job, self.env)
        except AlreadyReported:
            sys.exit(USER_ERROR_EXIT_CODE)
        except UserError as e:
            exit_with_error(f"[rank {self.env.rank}] {e}")
        if stop_signal is not None:
            self.after_stop(stop_signal, "")

    def after_stop(self, signum: int, stopped: str) -> None:
        """The run stopped for `signum`, its checkpoint written (`stopped` says so): give the signal back to
        whoever owned it before training took it (submitit's handler checkpoints the job's callable, requeues
        the job and ends this process), else end with 128+N; in a launcher's job, rank 0's stop is the
        job's failure, which the sweep reports in one line."""
        signals.ignore_until_exit()
        if self.env.enabled:  # the ranks leave together: one that exits first makes torchrun stop the others
            from minigpt.cluster.distributed import barrier

            with contextlib.suppress(Exception):  # a rank lost meanwhile: nothing left to wait for
                barrier(self.env)
        try:
            signals.resend(signum)
        except Exception as e:  # e.g. submitit's "Job not requeued because: timed-out too many times"
            raise UserError(f"{stopped}; the launcher's handler of {signals.signal_name(signum)} then "
                            f"failed: {_first_line(e)}") from None
        if self.in_job and self.env.is_main:
            raise UserError(stopped)
        sys.exit(signals.exit_code(signum))

    def _folder_visible_everywhere(self, out_dir: Path) -> bool:
        """Every rank looks for rank 0's freshly made run folder; all learn whether each one found it."""
        from minigpt.cluster.distributed import any_rank

        visible = folder_visible(out_dir)
        if not visible:
            print(f"error: [rank {self.env.rank}] the run folder {out_dir} made by rank 0 does not exist on "
                  f"{socket.gethostname()}", file=sys.stderr)
        return not any_rank(not visible, self.env)

    def resume_command(self, out_dir: Path, overrides: Sequence[str]) -> str:
        """The command that continues this run, ready to paste: the same launcher and overrides (as Hydra
        received them, quoted for the shell), plus resume=auto and the run folder (quoted for Hydra too: a
        space or a non-ASCII letter in it is Hydra syntax otherwise)."""
        kept = [a for a in overrides if not a.startswith(("trainer.resume=", "hydra.run.dir="))]
        args = [*map(shlex.quote, kept), "trainer.resume=auto", shell_override("hydra.run.dir", str(out_dir))]
        return " ".join([launcher_command(self.env), *args])


class _WithoutHydraJobReports:
    """stderr while this process launches a sweep: Hydra writes `Error executing job with overrides: [...]`
    for a failed job before it raises the job's error, and `run` prints that error as the sweep's one line,
    which names the job's log (JobFailed). Every other write passes."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if text.startswith("Error executing job with overrides:"):
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _without_hydra_job_reports():
    saved, sys.stderr = sys.stderr, _WithoutHydraJobReports(sys.stderr)
    try:
        yield
    finally:
        sys.stderr = saved


def _leave_the_logs_to_rank0() -> None:
    """Ranks > 0 log only their errors, and never into the run's log file.

    Under torchrun no logging is set up on them. In a submitit job Hydra's job ran in every task and opened
    the run's log file in each: close it here, before anything is logged.
    """
    root = logging.getLogger()
    root.setLevel(logging.ERROR)
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def leave_process(code: int) -> NoReturn:
    """End a rank of a distributed run that has left its process group: flush, then `os._exit(code)`.

    Once DDP has used a gloo process group, that group outlives `destroy_process_group`, and Python's shutdown
    can then abort a process that did everything right, which torchrun reports as a failed run
    (docs/clusters.md, "How a rank ends"). By now the checkpoints, TensorBoard events and the run lock are
    written and closed, so skipping the interpreter's shutdown loses nothing once the logs are flushed.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_RUNNING: list[Launch] = []  # the Launch whose `run` is under way in this process (at most one)


def this_process() -> Launch:
    """The Launch running this process: the one whose `run` called the code asking (else a fresh one).

    Rank 0's task function (`scripts/train.py`'s main) must share through the very Launch that joined the
    process group around it. It asks for it rather than naming a global of the script: the submitit launcher
    pickles that function, with the globals it names, into jobs that run in other processes.
    """
    return _RUNNING[-1] if _RUNNING else Launch.from_environ()


def rank0_task(follow: Follow) -> Callable[[Callable[[Any], Any]], Rank0Task]:
    """`@rank0_task(follow)` over a Hydra task function (under `@reports_user_errors`): see Rank0Task."""
    return functools.partial(Rank0Task, follow=follow)


class Rank0Task:
    """A Hydra task function that trains as one run in every process a launcher runs it in: rank 0 runs it,
    the other ranks `follow` the job it shares.

    Called from this process's own `Launch.run` (torchrun, srun, plain python), the task just runs. Called by
    a Hydra launcher in a job of its own (submitit: every task of the job gets here), the job's `Launch.run`
    starts here: task 0 runs the task, the others `follow` it; a user error becomes `JobFailed`.

    A class, not a closure: submitit pickles the task function into the job, and a closure would travel with
    copies of this module's globals (the launching process's `_RUNNING`); an instance travels by reference.
    """

    def __init__(self, task: Callable[[Any], Any], follow: Follow) -> None:
        self.task, self.follow = task, follow
        functools.update_wrapper(self, task)

    def __call__(self, cfg: Any) -> Any:
        if _RUNNING:
            return self.task(cfg)
        try:
            launch = Launch.from_environ(self.follow)
            launch.in_job = True
            return launch.run(lambda: self.task(cfg))
        except (UserError, OSError) as e:
            message = unwritable_path_message(e) if isinstance(e, OSError) else str(e)
            print(f"error: {message}", file=sys.stderr)  # the one line in this job's own log
            log.error("%s", message)  # and in the job folder's log file (the console's copy goes to stdout)
            raise JobFailed(f"{message} (its log: {_job_log() or 'stderr of the job'})") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _job_log() -> str | None:
    """This task's stderr log under submitit (<folder>/<job id>_<task>_log.err), if submitit started it."""
    if "SUBMITIT_FOLDER" not in os.environ:
        return None
    try:
        import submitit

        return str(submitit.JobEnvironment().paths.stderr)
    except (ImportError, RuntimeError, KeyError):
        return None


def folder_visible(path: Path) -> bool:
    """Whether this process sees `path` as a folder (one place to fake a filesystem nodes do not share)."""
    return path.is_dir()


def launcher_command(env: DistEnv) -> str:
    """How to start scripts/train.py again with the same processes."""
    if env.launcher == "slurm":
        return f"srun --nodes={env.nodes} --ntasks={env.world_size} python scripts/train.py"
    if not env.enabled:
        return "python scripts/train.py"
    if env.nodes > 1:
        return (f"torchrun --nnodes={env.nodes} --nproc_per_node={env.world_size // env.nodes} "
                f"--node_rank=<this node> --master_addr={os.environ.get('MASTER_ADDR', '<node 0>')} "
                f"--master_port={os.environ.get('MASTER_PORT', '<port>')} scripts/train.py")
    return f"torchrun --nproc_per_node={env.world_size} scripts/train.py"
