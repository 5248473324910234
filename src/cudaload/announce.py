"""Say what a long step is about to do before it starts: through the `cudaload` logger, and on stderr.

A step that may take more than ~2 s (the CPU dtype probe, a checkpoint conversion, doctor's checks)
calls `announce` first, so a terminal that stays blank says why. The line goes to the logger (an
application that configured logging sees it there, once) and, unless a handler of that logger
already writes to stderr, to stderr as `cudaload: ...` (the CLI and a script without logging
configured). `CUDALOAD_QUIET=1` (or true/yes/on) keeps stderr silent; the logger still gets the record;
0/false/no/off or unset do not, and any other value is refused (`SettingError`), as CUDALOAD_PROBE's are.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

__all__ = ["announce", "quiet"]

_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


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
        with contextlib.suppress(OSError, ValueError):  # stderr closed: the logger record is all there is
            print(f"cudaload: {message}", file=sys.stderr, flush=True)
