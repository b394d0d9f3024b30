"""The one way minigpt reports bad user input.

A `UserError` is a mistake the user can fix (a config value, a path, a prompt, a checkpoint).
Scripts catch it and print its message as one line on stderr with exit code 2 and no traceback
(`minigpt.cli.reports_user_errors`); anything else is a bug and may raise normally. A message that tells the
user what to type quotes it with `shell_override`, so that it can be pasted as it is.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import sys
from typing import NoReturn

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad user input, or a fault of the machine the user can fix (a full disk, a folder in use). The message
    names the problem and the fix, on one line."""


class AlreadyReported(UserError):
    """A failure another process has already reported in its own line (the rank of a distributed run that
    failed first): end with exit code 2 and print nothing more."""


def exit_with_error(message: str) -> NoReturn:
    """End the process the way every script reports bad input: `error: <message>` on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT_CODE)


def unwritable_path_message(e: OSError, elsewhere: str = "hydra.run.dir=... or data.cache_dir=...") -> str:
    """One line for a folder or file that cannot be created or written: the path, the cause, its fix.
    `elsewhere`: the keys that choose another place (a training's run folder and cache by default)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free some space there, or write elsewhere: {elsewhere}"
    elif e.errno == errno.EFBIG:
        fix = f"over a file size limit: raise `ulimit -f`, or write elsewhere: {elsewhere}"
    elif e.errno == errno.ENOENT:
        fix = "was a folder deleted or moved while the command ran?"
    else:  # read-only disk, no permission, a file in the way
        fix = f"choose a writable folder: {elsewhere}"
    path = "" if e.filename is None else os.fsdecode(e.filename)  # some libraries give bytes
    return f"cannot write {path}: {e.strerror or e} ({fix})"


def shell_override(key: str, value: str) -> str:
    """`key=value` as it must be typed into a shell so that Hydra reads `value` back exactly.

    Two layers of quoting. Hydra's grammar reads spaces, `( ) [ ] { } , = '` and `${` in a value as syntax
    and allows no non-ASCII letter outside quotes; inside them (`key='value'`) it takes everything
    literally, with a quote written `\\'` (the backslashes before it, or at the end, doubled) and an
    interpolation `\\${`. The shell removes one level of quotes of its own: inside its double quotes only
    `\\ " $` and backquotes are special (and `!` in an interactive bash, so a value with one is
    single-quoted instead). A plain value needs neither.
    """
    if re.fullmatch(r"[A-Za-z0-9_./+\-]+", value):
        return f"{key}={value}"
    hydra = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", value)
    hydra = re.sub(r"(\\+)$", lambda m: m[1] * 2, hydra).replace("${", "\\${")
    quoted = f"{key}='{hydra}'"
    return shlex.quote(quoted) if "!" in quoted else '"' + re.sub(r'([\\"$`])', r"\\\1", quoted) + '"'
