"""One signal policy for every command: what SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 do.

They are the signals a user or a scheduler sends to say "stop": Ctrl-C (SIGINT), `kill` and `torchrun`
(SIGTERM), a closed terminal or ssh session (SIGHUP), SLURM's warning before a time limit (`#SBATCH
--signal=USR1@120` or USR2) and submitit's checkpoint-and-requeue signal (SIGUSR2). Their default action
kills a Python process outright (SIGINT raises KeyboardInterrupt wherever the interpreter happens to be), so
a half-built cache folder stays on disk and up to `trainer.ckpt_every` steps of a training are lost.

Two modes, one per kind of work:

    install_policy()    every command, at start-up (`minigpt.cli.run_cli`, `cluster.launch`): a stop signal
                        raises `Interrupted` (a KeyboardInterrupt) where the program is, so every `finally`
                        and `with` on the way out runs: temporaries are removed, nothing half-written is
                        published. The script ends with one line, `interrupted by SIGTERM ...`, exit 128+N.
    GracefulStop        the training loop: a stop signal only sets a flag, the loop reads it between steps,
                        writes `checkpoints/last` and returns; the script prints the resume command and exits
                        128+N, or gives the signal to its previous owner (`resend`): under submitit that is
                        submitit's own handler, which requeues the job.

A signal the process inherited as ignored (`nohup` ignores SIGHUP, a shell's background job SIGINT) stays
ignored in both modes: whoever started the process asked for that. SIGKILL cannot be caught; checkpoints and
caches are written atomically, so even it loses only the work since the last one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by signal N: 128 + N (130 for Ctrl-C)."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived outside the training loop. A KeyboardInterrupt, so code that already tidies up
    after Ctrl-C (context managers, `finally`, process pools) does the same for SIGTERM and the others."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)

    def message(self) -> str:
        """The one line a script prints for it."""
        return f"interrupted by {signal_name(self.signum)}: stopped before the end, nothing half-written kept"


_owners: dict[int, object] = {}  # the handlers `ignore_until_exit` replaced, for `resend`


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # only it may install handlers


def install_policy() -> None:
    """Make every stop signal raise `Interrupted` (those inherited as ignored stay ignored). Idempotent."""
    if not _in_main_thread():
        return
    _owners.clear()
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _raise_interrupted)


@contextlib.contextmanager
def ignored() -> Iterator[None]:
    """Stop signals ignored inside, restored afterwards. For a process on its way out, reporting why, which
    the SIGTERM its launcher sends the survivors must not cut short; and around starting helper processes
    (a pool's workers), which inherit the ignored signals from their first line: Ctrl-C reaches the whole
    process group, and a worker would print its own KeyboardInterrupt while the parent tidies up."""
    saved = {}
    if _in_main_thread():
        for sig in STOP_SIGNALS:
            saved[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def quiet_forked_helpers() -> Iterator[None]:
    """Inside, a process forked from this one (a worker of a pool that a library starts, where `ignored`
    cannot wrap the start) ignores SIGINT and dies of the other stop signals without a word: Ctrl-C reaches
    the whole process group, and the parent alone reports it, in one line, as it takes its pool down (a
    pool's `terminate` sends SIGTERM)."""
    global _quiet_forks
    _quiet_forks += 1
    try:
        yield
    finally:
        _quiet_forks -= 1


_quiet_forks = 0  # how many `quiet_forked_helpers` blocks are open


def _quiet_the_forked_child() -> None:
    if _quiet_forks:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in STOP_SIGNALS[1:]:
            signal.signal(sig, signal.SIG_DFL)


os.register_at_fork(after_in_child=_quiet_the_forked_child)


def ignore_until_exit() -> None:
    """Ignore every stop signal from now on: for a process that is ending and reporting how (a stopped run
    printing its resume command, a rank whose peer died): torchrun sends SIGTERM to the other workers as soon
    as one exits, and their last lines must still come out. `resend` still finds the replaced handlers."""
    if _in_main_thread():
        for sig in STOP_SIGNALS:
            _owners.setdefault(sig, signal.signal(sig, signal.SIG_IGN))


def resend(signum: int) -> None:
    """Give `signum` to the handler that owned it before training took it, as if it had just arrived.

    Under submitit that is submitit's own (SIGUSR2: checkpoint the job's callable and requeue it; that
    handler ends the process itself). Our own policy handler, the default and SIG_IGN are not called: the
    caller then ends the process the plain way.
    """
    handler = _owners.get(signum, signal.getsignal(signum))
    if callable(handler) and handler is not _raise_interrupted:
        handler(signum, None)


class GracefulStop:
    """`with GracefulStop() as stop: ... if stop.requested: break` — any stop signal sets `requested`.

    Further signals while the run is finishing its step and writing the checkpoint are ignored (with a note):
    `torchrun` forwards the terminal's Ctrl-C to its workers a second time, and a half-written checkpoint is
    what we are avoiding. On exit the previous handlers come back (so `resend` finds them). Handlers can
    only be installed from the main thread; elsewhere (e.g. a test runner's worker thread) the context does
    nothing and signals keep their usual effect.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal_name(self.signum)

    def __enter__(self) -> GracefulStop:
        if _in_main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal_name(signum)
        if self.requested:
            log.warning("%s again: still finishing the step and writing the checkpoint "
                        "(SIGKILL aborts at once)", name)
            return
        self.requested, self.signum = True, signum
        log.warning("%s received: stopping after this step and writing a checkpoint", name)
