"""Writing to a stream whose reader may leave early: `python scripts/generate.py ... | head -2`.

A reader that stops reading (head, `less` after q) closes its end of the pipe, and the next write fails with
BrokenPipeError. That is no fault to report: Unix tools end quietly then. Here the first failed write switches
the output off, and every later write is dropped; generation goes on to the end, so the samples saved in the
run folder are complete, and the command exits 0.

The stream's file descriptor is also pointed at /dev/null: the text stream still holds the unwritten bytes,
and the interpreter flushes every stream on exit, which would otherwise fail again and print "Exception
ignored ... BrokenPipeError" after all.
"""

from __future__ import annotations

import io
import os
from typing import TextIO


class ClosableOutput:
    """`write(text)` to `stream`, flushed at once (streamed tokens should appear as they come); after the
    reader has gone, nothing (`reader_gone` tells)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.reader_gone = False

    def write(self, text: str) -> None:
        if self.reader_gone or not text:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:
            self.reader_gone = True
            _discard_from_now_on(self.stream)


def _discard_from_now_on(stream: TextIO) -> None:
    """Point `stream`'s file descriptor at /dev/null (streams without one, such as StringIO, need nothing)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
