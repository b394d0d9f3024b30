"""How every export is written: into a hidden sibling first, renamed into place only when complete.

`staged_output(out, folder)` hands a writer `.<name>.tmp-<pid>` beside `out` (a folder when `folder`), and
renames it to `out` when the writer is done. So `out` is either complete or absent, whatever happens:

    the writer is refused or fails    the temporary is removed, and so are the folders made above `out`
    a write fails (a full disk, a     one line naming the file under `out` and the cause, with the same
    file size limit, a read-only      clean-up
    folder)
    `out` exists, or appears while    nothing is overwritten: the export is refused (or dropped, when a second
    writing                           export to the same `out=` finished first)

`parent_folders(out)`, the part that makes the folders above `out` and takes them away again on failure,
serves the import too (hf_import.py), whose checkpoint the checkpoint package writes atomically itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from minigpt.errors import UserError, unwritable_path_message

ELSEWHERE = "out=..."  # the key that chooses another place, for the one-line message


@contextlib.contextmanager
def staged_output(out: Path, folder: bool) -> Iterator[Path]:
    """Yield the temporary path to write the export `out` into; rename it to `out` on success. A failed
    write becomes a UserError naming the file as it would have been called under `out`."""
    out = Path(out).expanduser()
    if out.exists():
        raise UserError(f"{out} already exists; choose a new output path (nothing was overwritten)")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with parent_folders(out):
            try:
                _remove(tmp)  # what a killed export by a process of the same id left
                if folder:
                    tmp.mkdir()
                yield tmp
                _publish(tmp, out)
            finally:
                _remove(tmp)
    except OSError as e:
        raise UserError(f"nothing exported: {unwritable_path_message(_as_under(e, tmp, out), ELSEWHERE)}") \
            from None


@contextlib.contextmanager
def parent_folders(out: Path) -> Iterator[None]:
    """Make the missing folders above `out`; if the block fails, take away again those that are still
    empty (innermost first), so a failed command leaves no folder of its own behind."""
    missing, folder = [], out.parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for made in missing:
            with contextlib.suppress(OSError):
                made.rmdir()
        raise


def _as_under(e: OSError, tmp: Path, out: Path) -> OSError:
    """`e` naming the path the user gave: a file of the temporary as it would be called under `out`, and `out`
    itself where `e` names no file (a failed write to an open file does not)."""
    if e.filename is None:
        return OSError(e.errno, e.strerror, str(out))
    failed = Path(os.fsdecode(e.filename))
    if not failed.is_relative_to(tmp):
        return e
    return OSError(e.errno, e.strerror, str(out / failed.relative_to(tmp)))


def _publish(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`, unless `out` appeared while writing (another export to the same `out=`)."""
    appeared = UserError(f"{out} appeared while exporting (another export to the same out=?); nothing was "
                         "overwritten and this export was dropped")
    if tmp.is_dir():
        if out.exists():  # a rename would silently replace an empty folder
            raise appeared
        try:
            os.rename(tmp, out)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise appeared from None
            raise
        return
    try:
        os.link(tmp, out)  # unlike a rename, fails if `out` exists
    except FileExistsError:
        raise appeared from None
    except OSError:  # a filesystem without hard links: the check just before is the guard
        if out.exists():
            raise appeared from None
        os.replace(tmp, out)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()
