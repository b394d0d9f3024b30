"""Claiming a run folder: nothing in it changes until the run has passed every check.

A training can be refused for many reasons (the folder is in use, it already holds a checkpoint, the
checkpoint to resume does not fit, the data is missing, ...), most of them found only while the trainer is
being built. A refused command must leave an existing run folder byte for byte as it was, so:

    run = RunFolder(run_dir, enabled=is_rank0, record_files={...})
    run.claim()                  lock the folder (RunLock, below); None, or why not (the folder is in use)
    trainer = Trainer(...)       every check; log records meant for the folder's log file are held back
    run.accept()                 now write: the record files (the script's .hydra/ configs), then the held
    trainer.fit()                log records; from here on the log file is written as usual
    run.release()                unlock; after a refusal, drop the held records and put the lock file back

The log files are the `logging.FileHandler`s attached to the root logger whose file lies in the run folder
(scripts/train.py's Hydra logging config opens train.log there, lazily: `delay: true`). A write to one that
fails (a full disk, a folder deleted or made read-only under the run) ends the run: the handler is taken
off the logger and the OSError, naming the log file, propagates from the logging call like any other write
error, instead of logging's own traceback on stderr for every later line.


**The lock.** Two trainings aimed at one folder would interleave one train.log and race on `checkpoints/`.
`RunLock` is `fcntl.flock` on `<run>/train.lock`, so the kernel releases it when its holder ends, however it
ends: a SIGKILLed or crashed run never leaves its folder locked (its stale `train.lock` is simply taken
over). The file holds the holder's PID, so a refused process can name it. Only global rank 0 takes the lock;
the ranks of one torchrun job share the folder legitimately. When the holder lets go, the file is removed (a
finished run folder has none) or, for a run that was refused after taking the lock, put back exactly as it
was. Removing a lock file races with a process that opened it just before: that process then holds a lock on
a file no longer in the folder, so `acquire` checks, once it holds the lock, that the file it locked is still
the one at the path, and starts over otherwise. Where `fcntl` does not exist (Windows) there is no lock, and
a warning says so.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from pathlib import Path

from minigpt.errors import UserError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

LOCK_NAME = "train.lock"


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

    def log_to_file(self, text: str) -> None:
        """Write `text` into the run's log files only (not the console): a traceback for the record."""
        record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, "%s", (text,), None)
        for handler in self._log_handlers():
            handler.handle(record)

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


# -------------------------------------------------------------------------------------------------- the lock


class RunLock:
    """Between `acquire()` and `release()`, this process is the only training in the folder."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None
        self._previous: bytes | None = None  # the file's content before we took it; None: it did not exist
        self._made: list[Path] = []  # the folders `acquire` created, outermost first

    def acquire(self) -> None:
        """Take the lock, or raise a UserError naming the process that holds it."""
        if fcntl is None:
            log.warning("no file locks on this platform: nothing stops a second training in %s",
                        self.path.parent)
            return
        self._made = _missing_folders(self.path.parent)  # a refused run removes them again
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            existed = self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise UserError(
                    f"{self.path.parent} is in use by another training (PID {holder}, holding {self.path}); "
                    "wait for it to finish, stop it, or choose another hydra.run.dir"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the previous holder removed the file after we opened it: lock the one there now
        self._fd, self._previous = fd, _read(fd) if existed else None
        _overwrite(fd, f"{os.getpid()}\n".encode())

    def release(self, restore: bool) -> None:
        """Let go. `restore`: put the file back as it was before `acquire` (a refused run); else remove it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if restore and self._previous is not None:
                _overwrite(fd, self._previous)
            elif _same_file(fd, self.path):
                self.path.unlink()  # while still holding the lock: nobody else can be using this file
            if restore:
                for folder in reversed(self._made):  # a refused run leaves no empty folder of its own making
                    folder.rmdir()
        except OSError:  # deleted or unwritable under the run, or no longer empty: nothing (more) to tidy
            pass
        finally:
            os.close(fd)  # releases the flock

    def check(self) -> None:
        """Raise FileNotFoundError if the run folder was deleted or replaced since the lock was taken."""
        if self._fd is not None and not _same_file(self._fd, self.path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.path.parent))


def _missing_folders(folder: Path) -> list[Path]:
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _overwrite(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)
