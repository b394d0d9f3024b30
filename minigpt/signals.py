"""Ctrl-C and `kill` during training: finish the step, write a checkpoint, exit cleanly.

Without this, SIGINT raises KeyboardInterrupt wherever the interpreter happens to be (possibly inside an
optimizer update) and SIGTERM (what schedulers and `torchrun` send) kills the process outright: up to
`trainer.ckpt_every` steps of work lost. With it, the signal only sets a flag; the loop reads the flag between
steps, saves `checkpoints/last` and returns, and `trainer.resume=auto` continues exactly from there.

Further signals while the checkpoint is being written are ignored (with a note): `torchrun` forwards the
terminal's Ctrl-C to its workers a second time, and a half-written checkpoint is what we are avoiding. A run
that must die at once can still be sent SIGKILL; checkpoints are written atomically, so even that loses only
the steps since the last one.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """`with GracefulStop() as stop: ... if stop.requested: break` — SIGINT/SIGTERM set `requested`.

    Handlers can only be installed from the main thread; elsewhere (e.g. a test runner's worker thread) the
    context does nothing and signals keep their usual effect.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            log.warning("%s again: still finishing the step and writing the checkpoint "
                        "(SIGKILL aborts at once)", name)
            return
        self.requested, self.signal_name = True, name
        log.warning("%s received: stopping after this step and writing a checkpoint", name)
