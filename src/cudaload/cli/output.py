"""The CLI's output: each line printed and flushed at once, and a closed pipe (`cudaload plan ... | head -1`)
told apart from other errors (`OutputClosed`) and silenced on the way out."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["OutputClosed", "OutputFailed", "emit", "silence"]


class OutputClosed(Exception):
    """stdout or stderr is a pipe whose reader has gone (`cudaload plan ... | head -1`)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.stream = stream


class OutputFailed(Exception):
    """stdout (or stderr) cannot be written: closed when cudaload started (`cudaload plan M >&-`, and then
    `sys.stdout` is None), or the write fails (`> /dev/full`: ENOSPC). The result is lost, so the exit status
    must say so; it is not an error of what the command was doing."""

    def __init__(self, stream: Any, why: str) -> None:
        super().__init__(why)
        self.stream = stream
        self.why = why


def emit(text: str, stream: Any = None) -> None:
    """Print `text` and flush, so that a closed pipe shows here, where it can be told apart from a
    broken pipe to a child process, and a stream that cannot be written (closed, a full disk) is told
    apart from an error of the command."""
    stream = stream if stream is not None else sys.stdout
    if stream is None:  # the interpreter started with that descriptor closed
        raise OutputFailed(None, "standard output is closed")
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError as exc:
        raise OutputClosed(stream) from exc
    except (OSError, ValueError) as exc:  # ENOSPC, EIO, EBADF; ValueError: a closed file object
        raise OutputFailed(stream, getattr(exc, "strerror", None) or str(exc)) from exc


def silence(stream: Any) -> None:
    """Point a closed stream's file descriptor at /dev/null, so that the interpreter's last flush of
    what is still buffered does not print a BrokenPipeError on the way out."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not a real file (e.g. captured by pytest)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
