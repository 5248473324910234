"""Say what a long step is about to do before it starts: through the `cudaload` logger, and on stderr.

A step that may take more than ~2 s (the CPU dtype probe, a checkpoint conversion, doctor's checks)
calls `announce` first, so a terminal that stays blank says why. The line goes to the logger (an
application that configured logging sees it there, once) and, unless a handler of that logger
already writes to stderr, to stderr as `cudaload: ...` (the CLI and a script without logging
configured). `CUDALOAD_QUIET=1` (or true/yes/on) keeps stderr silent; the logger still gets the record;
0/false/no/off or unset do not, and any other value is refused (`SettingError`), as CUDALOAD_PROBE's are.

Within `still_saying()` (the CLI's plan and launch), a step that stays quiet for STILL_S seconds on a terminal
says its line again with its age (`cudaload: still: ... (9 s so far)`): a busy machine spends 20-38 s in the
first import and plan (issue 46). Only on a terminal: piped or logged output (the docs' pasted outputs, a
script, the tests) is the same from run to run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

__all__ = ["announce", "fitted", "on_terminal", "quiet", "still_saying"]

_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")

STILL_S = 4.0
"""Seconds of quiet on a terminal after which `still_saying` says the last line again (under the 5 s a reader
waits before thinking a command hangs)."""

_lock = threading.Lock()
_last: list[tuple[str, float]] = []
"""The last line announce() printed on stderr, and when: what `still_saying` repeats."""
_written = [0.0]
"""When announce() or `still_saying` last wrote a line on stderr (time.monotonic())."""


def quiet() -> bool:
    """CUDALOAD_QUIET: 1/true/yes/on keeps stderr silent; unset, empty or 0/false/no/off do not.

    Raises:
        SettingError: any other value (`CUDALOAD_QUIET=false` silenced stderr before, the opposite of what it says).
    """
    value = os.environ.get("CUDALOAD_QUIET", "").strip().lower()
    if value not in _ON + _OFF:
        from .errors import SettingError

        raise SettingError(
            f"CUDALOAD_QUIET={os.environ['CUDALOAD_QUIET']!r}: use 1 (keep cudaload's progress lines off stderr) or 0 "
            "(show them, the default); also true/false, yes/no, on/off."
        )
    return value in _ON


def _stderr_handled(logger: logging.Logger, level: int) -> bool:
    """Whether a record at `level` from `logger` reaches a handler that writes to stderr."""
    if not logger.isEnabledFor(level):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            stream = getattr(handler, "stream", None)
            if level >= handler.level and stream in (sys.stderr, sys.__stderr__):
                return True
        current = current.parent if current.propagate else None
    return False


def announce(logger_name: str, message: str, level: int = logging.INFO) -> None:
    """`message` (what is about to happen, about how long, how to skip it) to the `logger_name`
    logger at `level`, and to stderr as one `cudaload: ...` line when no handler shows it there."""
    logger = logging.getLogger(logger_name)
    logger.log(level, message)
    if not quiet() and not _stderr_handled(logger, level):
        with _lock, contextlib.suppress(OSError, ValueError):  # stderr closed: the logger record is all there is
            print(fitted(f"cudaload: {message}"), file=sys.stderr, flush=True)
            _last[:] = [(message, time.monotonic())]
            _written[0] = _last[0][1]


def on_terminal() -> bool:
    """stderr is a terminal and CUDALOAD_QUIET is off: where a step that stays quiet says its line again
    (`still_saying`, the demo's progress); piped or logged output is the same from run to run."""
    return not quiet() and _is_terminal(sys.stderr)


@contextlib.contextmanager
def still_saying() -> Iterator[None]:
    """Within: on a terminal, whenever nothing was said on stderr for STILL_S seconds, the last line announce()
    printed comes again with its age, from a daemon thread, until the block ends. Nothing when stderr is not a
    terminal (a pipe, a log, a test: the output stays the same from run to run) or CUDALOAD_QUIET is on."""
    if not on_terminal():
        yield
        return
    done, began = threading.Event(), time.monotonic()

    def tick() -> None:
        while not done.wait(STILL_S / 10):
            with _lock:
                now = time.monotonic()
                if not _last or _last[0][1] < began or now - _written[0] < STILL_S:  # a line of this block only
                    continue
                message, since = _last[0]
                # "(a few seconds)" said at the start reads wrong by now: the age replaces it, kept on one line
                # (fitted() wraps at spaces and turns the no-break ones back into spaces).
                step = re.sub(r" [(][^()]*[)]$", "", message)
                line = f"cudaload: still: {step} ({now - since:.0f}\xa0s\xa0so\xa0far)"
                with contextlib.suppress(OSError, ValueError):
                    print(fitted(line), file=sys.stderr, flush=True)
                _written[0] = now

    thread = threading.Thread(target=tick, name="cudaload-still", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def fitted(line: str) -> str:
    """`line` wrapped for the terminal it is read in (COLUMNS, else stderr's terminal), continuations 6 in, a
    word never cut (the layout of plans/layout.py, which this bottom module does not import). Unchanged when
    stderr is no terminal and COLUMNS is not set: a log or a script reading the message gets it on one line."""
    if not os.environ.get("COLUMNS") and not _is_terminal(sys.stderr):
        return line
    width = shutil.get_terminal_size((100, 24)).columns
    width = max(width if width > 0 else 100, 40)
    # The label ("cudaload: error:", "[demo]") keeps its first word beside it, unless that word (a path) would push
    # the line past the width: then the word starts the next line.
    label = re.match(r"(?:\[\w+\] |(?:[\w.-]+: )+)\S*", line)
    fits = label is not None and len(label[0]) <= width
    glued = label[0].replace(" ", "\xa0") + line[label.end() :] if label is not None and fits else line
    wrapped = textwrap.wrap(glued, width, subsequent_indent=" " * 6, break_long_words=False, break_on_hyphens=False)
    return "\n".join(wrapped).replace("\xa0", " ") or line


def _is_terminal(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
