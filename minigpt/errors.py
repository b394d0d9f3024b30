"""The one way minigpt reports bad user input.

A `UserError` is a mistake the user can fix (a config value, a path, a prompt, a checkpoint).
Scripts catch it and print its message as one line on stderr with exit code 2 and no traceback;
anything else is a bug and may raise normally.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad user input, or a fault of the machine the user can fix (a full disk, a folder in use). The message
    names the problem and the fix, on one line."""


def exit_with_error(message: str) -> NoReturn:
    """End the process the way every script reports bad input: `error: <message>` on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


F = TypeVar("F", bound=Callable[..., object])


def unwritable_path_message(e: OSError) -> str:
    """One line for a folder or file that cannot be created or written: the path, the cause, its fix."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space there, or write elsewhere: hydra.run.dir=... or data.cache_dir=..."
    elif e.errno == errno.EFBIG:
        fix = "over a file size limit: raise `ulimit -f`, or write elsewhere: hydra.run.dir=..."
    elif e.errno == errno.ENOENT:
        fix = "was a folder deleted or moved while the command ran?"
    else:  # read-only disk, no permission, a file in the way
        fix = "choose a writable folder: hydra.run.dir=... or data.cache_dir=..."
    path = "" if e.filename is None else os.fsdecode(e.filename)  # some libraries give bytes
    return f"cannot write {path}: {e.strerror or e} ({fix})"


def reports_user_errors(main: F) -> F:
    """Make a script's main function end a `UserError` (or an unwritable path) as one line and exit code 2.

    Put it under `@hydra.main`: the error is handled inside Hydra's job, before Hydra would print
    a report of its own ("Error executing job with overrides ...") around it.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as e:
            exit_with_error(str(e))
        except OSError as e:  # e.g. a checkpoint or data folder on a read-only or full disk
            exit_with_error(unwritable_path_message(e))

    return wrapper  # type: ignore[return-value]
