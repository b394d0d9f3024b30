"""When a rank of a distributed run is gone: which one, and how the others end.

A rank that is killed (SIGKILL, the OOM killer, a lost machine) says nothing; the others learn of it when
their next collective fails ("Connection closed by peer" from gloo, an NCCL error or a timeout), and a
collective that fails raises a long C++ traceback on every survivor. A rank that stops on an error of its own
(a full disk on rank 0) does the same to the others, though its own one-line error already says why.

So every rank, at the start, tells the others its host and PID, and uses the process group's store (the
rendezvous' key-value store, held by torchrun's agent or by rank 0) as a notice board:

    failed/<r>   rank r is ending on an error it reports itself       (`report_own_failure`)
    alive/<r>    rank r's collective failed and it is looking around   (`account_for_ranks`)
    seen/<r>     rank r has read the board

A survivor (`account_for_ranks`) posts alive, then waits until every other rank is accounted for: it posted
failed (its own line explains: this rank ends quietly), or alive, or its PID no longer runs on this host (it
died), for at most GRACE_SECONDS; a rank on another host that never posts stopped answering. The survivor then
ends with one line naming the lost ranks and the last intact checkpoint; the collective's traceback goes to
train.log only. A rank that reported its own failure and holds the store (rank 0, outside torchrun) waits,
after leaving the group, until the others have read the board (`wait_until_read`): the store ends with it.
Stop signals are ignored from the first failure on: torchrun sends SIGTERM to the survivors as soon as it
sees one worker die, and that must not cut their report short.
"""

from __future__ import annotations

import os
import re
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from minigpt import signals
from minigpt.checkpoint.format import read_meta
from minigpt.checkpoint.load import resolve_checkpoint
from minigpt.cluster.dist_env import DistEnv
from minigpt.data.temporaries import running
from minigpt.errors import AlreadyReported, UserError, shell_override

GRACE_SECONDS = 5.0  # how long a survivor waits for the other ranks to answer, and rank 0 for them to read
POLL_SECONDS = 0.05
# What a collective raises when a peer is gone: gloo's socket errors, NCCL's, a timeout.
PEER_FAILURE = re.compile(r"gloo|NCCL|Connection (?:closed|reset) by peer|Broken pipe|[Tt]imed? ?out|"
                          r"Socket|connect")


@dataclass
class Board:
    """This process's view of the run's ranks: who is where, and the store they share."""

    store: object | None = None
    hosts: list[tuple[str, int]] = field(default_factory=list)  # (host, PID) of every rank
    train_call: int = 0  # which train() of this process group the keys belong to (each call: the next)
    reported: bool = False  # this rank posted failed/<rank> for the current train()


BOARD = Board()


def meet(env: DistEnv) -> None:
    """Right after joining the process group: learn every rank's host and PID, keep the store."""
    from torch.distributed.distributed_c10d import _get_default_store  # no public accessor

    BOARD.store = _get_default_store()
    hosts: list[tuple[str, int] | None] = [None] * env.world_size
    dist.all_gather_object(hosts, (socket.gethostname(), os.getpid()))
    BOARD.hosts = [h for h in hosts if h is not None]


def next_train_call() -> None:
    """A new train() in the same process group (every rank calls it at the same point)."""
    BOARD.train_call += 1
    BOARD.reported = False


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that failed because another rank is gone."""
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and bool(PEER_FAILURE.search(str(error)))


def _key(kind: str, rank: int) -> str:
    return f"minigpt/{BOARD.train_call}/{kind}/{rank}"


def _posted(kind: str, rank: int) -> bool:
    return bool(BOARD.store.check([_key(kind, rank)]))


def report_own_failure(env: DistEnv) -> None:
    """This rank ends on an error it reports itself: the others, whose collectives fail next, stay quiet."""
    if not env.enabled or BOARD.store is None:
        return
    signals.ignore_until_exit()
    try:
        BOARD.store.set(_key("failed", env.rank), "1")
        BOARD.reported = True
    except Exception:  # the store is gone with its host: the others will see that
        pass


@dataclass
class Accounting:
    """What a survivor found: ranks that ended on their own error, ranks that are gone."""

    failed: list[int]
    gone: list[int]  # their process is gone from this host
    silent: list[int]  # on another host, never answered
    store_lost: bool  # the store could not be reached: its host (rank 0, outside torchrun) is gone


def account_for_ranks(env: DistEnv) -> Accounting:
    """After a collective failed on this rank: find out, within GRACE_SECONDS, what happened to the others."""
    signals.ignore_until_exit()
    others = [r for r in range(env.world_size) if r != env.rank]
    here = socket.gethostname()
    failed, gone = set(), set()
    try:
        BOARD.store.set(_key("alive", env.rank), "1")
        deadline = time.monotonic() + GRACE_SECONDS
        while True:
            for r in others:
                if _posted("failed", r):
                    failed.add(r)
                    gone.discard(r)
                elif r < len(BOARD.hosts) and BOARD.hosts[r][0] == here and not running(BOARD.hosts[r][1]):
                    gone.add(r)
            answered = {r for r in others if r in failed or r in gone or _posted("alive", r)}
            if len(answered) == len(others) or time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
        BOARD.store.set(_key("seen", env.rank), "1")
    except Exception:  # the store itself is unreachable
        return Accounting(sorted(failed), sorted(gone), [], store_lost=True)
    silent = [r for r in others if r not in answered]
    return Accounting(sorted(failed), sorted(gone), silent, store_lost=False)


def wait_until_read(env: DistEnv) -> None:
    """After leaving the group: a rank that reported its own failure keeps the store it may hold open until
    every other rank has read the board (or posted a failure of its own), for at most GRACE_SECONDS."""
    if not (env.enabled and BOARD.reported and env.is_main and BOARD.store is not None):
        return
    deadline = time.monotonic() + GRACE_SECONDS
    others = [r for r in range(env.world_size) if r != env.rank]
    try:
        while time.monotonic() < deadline:
            if all(_posted("seen", r) or _posted("failed", r) for r in others):
                return
            time.sleep(POLL_SECONDS)
    except Exception:
        return


def describe_lost(found: Accounting, env: DistEnv) -> str:
    """The ranks that are gone, in words (empty if none)."""
    parts = []
    if found.gone:
        parts.append(f"rank {_ranks(found.gone)} died (killed or crashed: its process is gone)")
    if found.silent:
        hosts = sorted({BOARD.hosts[r][0] for r in found.silent if r < len(BOARD.hosts)})
        where = ", ".join(hosts) or "another host"
        parts.append(f"rank {_ranks(found.silent)} stopped answering (on {where}: killed, crashed or cut "
                     "off)")
    if found.store_lost:
        parts.append("rank 0 is gone (its process held the run's rendezvous store, which no longer answers)")
    return "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def lost_rank_error(error: BaseException, env: DistEnv, run_dir: Path, step: int | None,
                    log_to_file: Callable[[str], None]) -> UserError:
    """The one error a survivor ends with after its collective failed with `error`: what happened to the
    other ranks, and the checkpoint to continue from; the collective's traceback goes to `log_to_file`."""
    found = account_for_ranks(env)
    lost = describe_lost(found, env)
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    log_to_file(f"a collective failed on rank {env.rank}:\n{trace}")
    if not lost:  # only ranks that failed on their own: their lines say why
        return AlreadyReported(f"rank {_ranks(found.failed)} stopped on an error of its own")
    at = f" at step {step}" if step is not None else ""
    return UserError(f"{lost}; the run stopped{at}; {last_intact_checkpoint(run_dir)}")


def last_intact_checkpoint(run_dir: Path) -> str:
    """Where `trainer.resume=auto` would continue from, in words (a checkpoint the dead rank was writing is
    a temporary folder that nothing loads)."""
    try:
        ckpt = resolve_checkpoint(run_dir)
        step = read_meta(ckpt)["step"]
    except (UserError, KeyError):
        return f"no checkpoint was written yet in {run_dir}: start the run again"
    return (f"the last intact checkpoint is {ckpt} (step {step}): continue with the same command plus "
            f"trainer.resume=auto {shell_override('hydra.run.dir', str(run_dir))}")
