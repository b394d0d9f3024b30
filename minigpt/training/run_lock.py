"""One training per run folder: an exclusive OS lock on `<run>/train.lock`, held for the training's lifetime.

Two trainings aimed at one folder would interleave one train.log and race on `checkpoints/`. The lock is
`fcntl.flock` on a file inside the folder, so the kernel releases it when its holder ends, however it ends:
a SIGKILLed or crashed run never leaves its folder locked (its stale `train.lock` is simply taken over). The
file holds the holder's PID, so a refused process can name it. Only global rank 0 takes the lock; the ranks
of one torchrun job share the folder legitimately.

When the holder lets go, the file is removed (a finished run folder has none) or, for a run that was refused
after taking the lock, put back exactly as it was: a refused command leaves the folder byte for byte as it
found it. Removing a lock file races with a process that opened it just before: that process then holds a
lock on a file no longer in the folder. So `acquire` checks, once it holds the lock, that the file it locked
is still the one at the path, and starts over otherwise.

Where `fcntl` does not exist (Windows) there is no lock, and a warning says so.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from minigpt.errors import UserError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

LOCK_NAME = "train.lock"


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
