"""The cache's temporary folders: named after their process, so that those of a killed one can be swept.

    .tmp-<name>-<host>-<pid>-<random>        a dataset folder being built (prepare.py renames it when done)
    .damaged-<name>-<host>-<pid>-<random>    a damaged folder moved aside while it is deleted

A process that is interrupted removes its own on the way out (minigpt/signals.py turns every stop signal
into an exception); one killed outright (SIGKILL, the OOM killer) cannot, and its half-built folder, often
tens of MB, would stay forever. So every prepare first removes the temporaries of this host whose process
is gone. Another host's (a cache on a shared filesystem) are left alone: their PIDs cannot be checked from
here, and a live job there may be building one. Temporaries of a minigpt that did not name the host yet
(`.tmp-<name>-<pid>-<random>`) are taken to be this host's.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

# <name> is always <source>-<tokenizer kind>-<12 hex digits of the fingerprint>, neither part holding a `-`
TEMPORARY = re.compile(
    r"\.(?:tmp|damaged)-\w+-\w+-[0-9a-f]{12}-(?:(?P<host>[\w.]+)-)?(?P<pid>\d+)-[0-9a-f]{8}")


def this_host() -> str:
    """This machine's name as it appears in a temporary's name (no `-`, which separates the fields)."""
    return re.sub(r"[^\w.]", "_", socket.gethostname())


def temporary_name(final: Path, kind: str) -> Path:
    """A fresh temporary folder path beside `final`; `kind` is `.tmp` or `.damaged`."""
    return final.with_name(f"{kind}-{final.name}-{this_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def remove_dead_temporaries(cache_root: Path) -> list[Path]:
    """Delete the temporary folders in `cache_root` left by processes of this host that no longer run;
    returns what was deleted."""
    root = Path(cache_root)
    dead = []
    for path in root.glob(".*-*") if root.is_dir() else []:
        match = TEMPORARY.fullmatch(path.name)
        if (match and match["host"] in (None, this_host()) and path.is_dir()
                and not running(int(match["pid"]))):
            shutil.rmtree(path, ignore_errors=True)
            dead.append(path)
    if dead:
        log.info("removed %d temporary folder(s) that killed processes left in %s", len(dead), root)
    return dead


def running(pid: int) -> bool:
    """Whether process `pid` runs on this machine (a zombie does not: it will write nothing more)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # no /proc (macOS): it answered, so it runs
        return True
    return state != "Z"
