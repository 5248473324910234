"""The CLI's output: each line printed and flushed at once, and a closed pipe (`cudaload plan ... | head -1`)
told apart from other errors (`OutputClosed`) and silenced on the way out."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["OutputClosed", "emit", "silence"]


class OutputClosed(Exception):
    """stdout or stderr is a pipe whose reader has gone (`cudaload plan ... | head -1`)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.stream = stream


def emit(text: str, stream: Any = None) -> None:
    """Print `text` and flush, so that a closed pipe shows here, where it can be told apart from a
    broken pipe to a child process."""
    stream = stream or sys.stdout
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError as exc:
        raise OutputClosed(stream) from exc


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
