"""Claiming a run folder: nothing in it changes until the run has passed every check.

A training can be refused for many reasons (the folder is in use, it already holds a checkpoint, the
checkpoint to resume does not fit, the data is missing, ...), most of them found only while the trainer is
being built. A refused command must leave an existing run folder byte for byte as it was, so:

    run = RunFolder(run_dir, enabled=is_rank0, record_files={...})
    run.claim()                  lock the folder (run_lock.py); None, or why not (the folder is in use)
    trainer = Trainer(...)       every check; log records meant for the folder's log file are held back
    run.accept()                 now write: the record files (the script's .hydra/ configs), then the held
    trainer.fit()                log records; from here on the log file is written as usual
    run.release()                unlock; after a refusal, drop the held records and put the lock file back

The log files are the `logging.FileHandler`s attached to the root logger whose file lies in the run folder
(scripts/train.py's Hydra logging config opens train.log there, lazily: `delay: true`). A write to one that
fails (a full disk, a folder deleted or made read-only under the run) ends the run: the handler is taken
off the logger and the OSError, naming the log file, propagates from the logging call like any other write
error, instead of logging's own traceback on stderr for every later line.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

from minigpt.errors import UserError
from minigpt.training.run_lock import RunLock


class RunFolder:
    """The run folder of this training (see the module docstring); `enabled=False` (ranks > 0): a no-op."""

    def __init__(self, path: Path, *, enabled: bool = True,
                 record_files: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.enabled = enabled
        self.record_files = dict(record_files or {})  # relative path -> text, written by accept()
        self.accepted = False
        self._lock = RunLock(self.path)
        self._held: dict[logging.FileHandler, _Holder] = {}

    def __enter__(self) -> RunFolder:
        refusal = self.claim()
        if refusal is not None:
            raise UserError(refusal)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def claim(self) -> str | None:
        """Lock the folder and hold back its log files' records; None, or why the folder is not ours."""
        if self.enabled:
            try:
                self._lock.acquire()
            except UserError as e:
                return str(e)
            for handler in self._log_handlers():
                self._held[handler] = _Holder()
                handler.addFilter(self._held[handler])
                handler.handleError = lambda record, h=handler: _log_write_failed(h, record)
        return None

    def release(self) -> None:
        """Unlock (after a refusal: drop the held log records, put the lock file back as it was)."""
        for handler, holder in self._held.items():
            handler.removeFilter(holder)
            vars(handler).pop("handleError", None)  # back to the class's own
        self._held.clear()  # after a refusal, these records never reach the folder
        self._lock.release(restore=not self.accepted)

    def accept(self) -> None:
        """The run passed every check: write the record files, then let the held log records through."""
        if not self.enabled or self.accepted:
            return
        self.accepted = True
        for name, text in self.record_files.items():
            file = self.path / name
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text)
        for handler, holder in self._held.items():
            handler.removeFilter(holder)
            for record in holder.records:
                handler.handle(record)
            holder.records.clear()

    def check(self) -> None:
        """Before each write: the folder must still be the one this run locked (FileNotFoundError if not)."""
        if self.enabled:
            self._lock.check()

    def _log_handlers(self) -> list[logging.FileHandler]:
        folder = self.path.resolve()
        return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)
                and Path(h.baseFilename).resolve().is_relative_to(folder)]


class _Holder(logging.Filter):
    """A handler filter that keeps every record for later and lets none through now."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


def _log_write_failed(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    """`handler.handleError` while the run holds the folder: a failed write ends the run (see above)."""
    error = sys.exc_info()[1]
    if not isinstance(error, OSError):
        logging.Handler.handleError(handler, record)  # a bug in formatting: logging's usual report
        return
    logging.getLogger().removeHandler(handler)
    with contextlib.suppress(OSError):  # flushing the same full disk again
        handler.close()
    raise OSError(error.errno, error.strerror, handler.baseFilename) from None
