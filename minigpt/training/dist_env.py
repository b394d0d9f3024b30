"""This process's place in a torchrun job, read from the environment torchrun sets (no torch needed).

`torchrun --nproc_per_node=N scripts/train.py ...` starts N copies of the script and tells each one its place
through environment variables: RANK (global), LOCAL_RANK (on this machine), WORLD_SIZE (all processes).
A plain `python scripts/train.py` sets none of them and is one process, `DistEnv()`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from minigpt.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the run: global rank, rank on this machine, number of processes."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes: logs, TensorBoard, checkpoints, the run folder."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DistEnv:
        """Read what torchrun set; a plain `python scripts/train.py` (none of it set) is one process."""
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
        if not any(n in environ for n in names):
            return cls()
        values = {}
        for n in names:
            raw = environ.get(n, "0" if n != "WORLD_SIZE" else "1")
            try:
                values[n] = int(raw)
            except ValueError:
                raise UserError(f"environment variable {n}={raw!r} is not an integer (launch with torchrun, "
                                f"which sets RANK, LOCAL_RANK and WORLD_SIZE)") from None
        env = cls(rank=values["RANK"], local_rank=values["LOCAL_RANK"], world_size=values["WORLD_SIZE"])
        if env.world_size < 1 or not 0 <= env.rank < env.world_size or env.local_rank < 0:
            raise UserError(f"inconsistent torchrun environment RANK={env.rank} LOCAL_RANK={env.local_rank} "
                            f"WORLD_SIZE={env.world_size} (launch with torchrun --nproc_per_node=N)")
        return env
