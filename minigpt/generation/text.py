"""Between text and token ids: reading and encoding prompts, and decoding a stream as it grows.

Prompt rule: a prompt is a non-empty string. An *empty* prompt means an unconditional sample and
starts from the end-of-text token (the separator the model saw between documents, i.e. "the start
of a new document"). A tokenizer without one cannot do that, so there an empty prompt is an
error. Interactive mode needs text on every turn (an empty line ends the session).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minigpt.errors import UserError

# The replacement character a byte-level decoder emits for an incomplete UTF-8 sequence.
REPLACEMENT = "\ufffd"


def read_prompt(prompt: str, prompt_file: str | None) -> str:
    """The prompt text: `prompt` with its escapes turned into characters (`unescape`), or the contents of
    `prompt_file` exactly as they are (which must exist and be non-empty)."""
    if not prompt_file:
        return unescape(prompt)
    path = Path(prompt_file).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"prompt_file={prompt_file!r} does not exist (check the path)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"prompt_file={prompt_file!r} cannot be read as UTF-8 text ({e})") from None
    if not text:
        raise UserError(f"prompt_file={prompt_file!r} is empty (put the prompt in it, or use prompt=...)")
    return text


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text`; an empty text starts from the end-of-text token (see the module doc)."""
    if not text:
        eot = getattr(tokenizer, "eot_id", None)
        if eot is None:
            raise UserError(
                f"an empty prompt needs an end-of-text token to start from, and the {tokenizer.name} "
                "tokenizer has none; give prompt=... or prompt_file=..."
            )
        return [eot]
    try:
        ids = tokenizer.encode(text)
    except UserError:
        raise
    except (KeyError, ValueError) as e:  # e.g. a character outside a `char` tokenizer's alphabet
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"the prompt cannot be encoded with the checkpoint's {tokenizer.name} tokenizer ({reason}); "
            "use only text the tokenizer knows"
        ) from None
    if not ids:
        raise UserError("the prompt encodes to no tokens; give a non-empty prompt")
    return list(ids)


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """Turn the two-character sequences \\n, \\t and \\\\ into a newline, a tab and a backslash.

    Hydra keeps backslashes literally, so `stop=["\\n\\n"]` or `prompt='import os\\n\\ndef '` on a command
    line arrives with backslash-n pairs, not line breaks; stop strings and prompts are about line breaks far
    more often than about backslashes, so both are unescaped. A literal backslash is written twice
    (`prompt='print("\\\\n")'` is the text `print("\\n")`); any other backslash (`\\d`, `\\x`) is kept as
    it is. Prompt files are read as they are.
    """
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


class TextStream:
    """Turns a growing list of token ids into text pieces, each printed once, as they become final.

    Two things can make the tail of the decoded text provisional: a multi-byte character split
    across tokens (it decodes to the replacement character until its last byte arrives), and the
    first characters of a stop string (they must not be printed if the stop string completes).
    """

    def __init__(self, decode: Callable[[list[int]], str], holdback: int = 0):
        self.decode = decode
        self.holdback = holdback
        self.ids: list[int] = []
        self.emitted = 0  # characters already handed out

    def push(self, token: int) -> str:
        """Add a token; return the newly final text (often the token's own text, sometimes "")."""
        self.ids.append(token)
        text = self.decode(self.ids).rstrip(REPLACEMENT)
        stable = len(text) - self.holdback
        if stable <= self.emitted:
            return ""
        piece = text[self.emitted : stable]
        self.emitted = stable
        return piece

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` (the full, stop-string-cut text) not yet handed out."""
        piece = final_text[self.emitted :]
        self.emitted = max(self.emitted, len(final_text))
        return piece
