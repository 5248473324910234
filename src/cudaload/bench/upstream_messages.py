"""What transformers and Python warnings say while the benchmark measures (the right-padding warning of the
default generate() variant, which pads right on purpose; deprecations of the installed release): kept off the
terminal while the run prints its progress, recorded in the result (`upstream_messages`: each message once,
with how often it was said) and printed after the table, never between its rows (issue 46 item 8)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["captured_messages", "format_messages"]


class _Keep(logging.Handler):
    """Counts each message a logger says, instead of printing it."""

    def __init__(self, counts: dict[tuple[str, str], int]) -> None:
        super().__init__(logging.WARNING)
        self.counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        key = ("transformers", record.getMessage())
        self.counts[key] = self.counts.get(key, 0) + 1


@contextlib.contextmanager
def captured_messages() -> Iterator[list[dict[str, Any]]]:
    """Within: transformers' log lines (WARNING and above) and Python warnings are recorded, not printed; the
    list yielded is filled on the way out with `{"source", "message", "count"}` (transformers' lines first, then
    the warnings)."""
    from transformers.utils import logging as transformers_logging

    # Configured now (its own stderr handler added), so that the handler swapped out below is the one it prints with.
    logger = transformers_logging.get_logger()
    counts: dict[tuple[str, str], int] = {}
    handlers, propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [_Keep(counts)], False
    messages: list[dict[str, Any]] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # each one counted, not only the first from each place
            try:
                yield messages
            finally:
                for warning in caught:
                    key = (warning.category.__name__, str(warning.message))
                    counts[key] = counts.get(key, 0) + 1
    finally:
        logger.handlers, logger.propagate = handlers, propagate
        messages += [{"source": source, "message": text, "count": n} for (source, text), n in counts.items()]


def format_messages(messages: list[dict[str, Any]]) -> list[str]:
    """The lines printed after the table: what upstream said during the run, each once with its count."""
    if not messages:
        return []
    lines = ["said during the run (by transformers or a Python warning; kept out of the table):"]
    for said in messages:
        times = f" ({said['count']} times)" if said["count"] > 1 else ""
        lines.append(f"  [{said['source']}] {said['message']}{times}")
    return lines
