"""How `scripts/train.py` runs as one process or as a rank of `torchrun --nproc_per_node=N`.

Only rank 0 goes through Hydra: it composes the config, chooses (and creates) the run folder, then hands the
job (config, run folder) to the other ranks with one broadcast. They train that very config in that folder
without composing anything or creating folders or log files of their own. If rank 0 stops before training
(a bad override, `--cfg job`, `--help`), it broadcasts "nothing to do" instead, and the others exit cleanly.

    rank 0                                  ranks > 0
    Hydra composes, makes the run folder    wait in broadcast_object
    share((config, run folder))  ------->   train(config, run folder)
    train(config, run folder)               (errors: "[rank r] <message>", exit 2)
"""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from minigpt.errors import USER_ERROR_EXIT_CODE, UserError, exit_with_error
from minigpt.training.config import TrainConfig
from minigpt.training.dist_env import DistEnv

Job = tuple[TrainConfig, Path]


class Launch:
    """This process's part in a (possibly distributed) training command."""

    def __init__(self, env: DistEnv) -> None:
        self.env = env
        self._shared = False  # rank 0 broadcasts exactly once, a job or None

    @classmethod
    def from_environ(cls) -> Launch:
        """From torchrun's RANK/LOCAL_RANK/WORLD_SIZE; a bad environment ends the process with one line."""
        try:
            return cls(DistEnv.from_env())
        except UserError as e:
            exit_with_error(str(e))

    def run(self, rank0_main: Callable[[], None], argv: Sequence[str]) -> None:
        """Rank 0 runs `rank0_main` (the Hydra entry point); under torchrun the others follow it.

        torch is imported only where a process group is needed, so `--help` and `--cfg job` stay quick.
        """
        if self.env.enabled and {"-m", "--multirun"} & set(argv):  # every rank sees the same argv
            if not self.env.is_main:
                sys.exit(USER_ERROR_EXIT_CODE)  # rank 0 says why
            exit_with_error("a Hydra multirun (-m) cannot run under torchrun; start one torchrun per setting")
        try:
            if not self.env.enabled:
                rank0_main()
                return
            from minigpt.training.distributed import process_group

            with process_group(self.env):
                if self.env.is_main:
                    try:
                        rank0_main()
                    finally:
                        self.share(None)  # if rank 0 stopped before training, release the waiting ranks
                else:
                    self._follow_rank0()
        except KeyboardInterrupt:  # Ctrl-C before the training loop began (it handles its own)
            print("interrupted before training started; nothing was written to checkpoints", file=sys.stderr)
            sys.exit(130)

    def share(self, job: Job | None) -> None:
        """Rank 0: hand the config and the run folder (or None: nothing to train) to the other ranks, once."""
        if not self._shared and self.env.enabled:
            from minigpt.training.distributed import broadcast_object

            self._shared = True
            broadcast_object(job, self.env)

    def _follow_rank0(self) -> None:
        from minigpt.training.distributed import broadcast_object
        from minigpt.training.trainer import train

        logging.getLogger().setLevel(logging.ERROR)  # rank 0 reports; the others only speak up when they fail
        job = broadcast_object(None, self.env)
        if job is None:
            return
        try:
            train(job[0], job[1], env=self.env)
        except UserError as e:
            exit_with_error(f"[rank {self.env.rank}] {e}")

    def resume_command(self, out_dir: Path, argv: Sequence[str]) -> str:
        """The command that continues this run: the same launcher and overrides, plus resume=auto."""
        launcher = (f"torchrun --nproc_per_node={self.env.world_size} scripts/train.py" if self.env.enabled
                    else "python scripts/train.py")
        kept = [a for a in argv if not a.startswith(("trainer.resume=", "hydra.run.dir="))]
        args = [*kept, "trainer.resume=auto", f"hydra.run.dir={out_dir}"]
        return " ".join([launcher, *map(shlex.quote, args)])
