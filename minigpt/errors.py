"""The one way minigpt reports bad user input.

A `UserError` is a mistake the user can fix (a config value, a path, a prompt, a checkpoint).
Scripts catch it and print its message as one line on stderr with exit code 2 and no traceback;
anything else is a bug and may raise normally.
"""

from __future__ import annotations

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad user input. The message names the problem and the fix, on one line."""
