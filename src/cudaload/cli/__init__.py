"""`cudaload doctor | plan | bench | demo | probe` (also `python -m cudaload`): runs the command the
arguments name, and turns its errors into one line and an exit status (`main`).

The parser is in `parser.py`, each command in its `*_command.py`, the printing in `output.py`."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from ..announce import fitted
from ..errors import CudaloadError
from ..upstream_imports import before_first_import
from .bench_command import bench_command
from .doctor_command import doctor_report, remeasure_report
from .launch_command import launch_command
from .output import OutputClosed, OutputFailed, emit, silence
from .parser import DEBUG_ENV, build_parser
from .plan_command import plan_command, simulates

__all__ = ["main"]

_PATH_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENOSPC, errno.EEXIST}
)
"""An OSError about a path itself (permissions, a read-only or full disk, a missing folder)."""


def _describe(exc: BaseException) -> str:
    """A foreign exception in one line: its type and the start of its message (a validation error
    names the field on its first line and the problem on the next)."""
    text = " ".join(line.strip() for line in str(exc).splitlines()[:3] if line.strip())
    return f"{type(exc).__name__}: {text if len(text) <= 300 else text[:299] + '…'}"


def _doing(args: argparse.Namespace) -> str:
    """What the command was doing, for the line that reports an unexpected error."""
    if args.command == "plan":
        return f"planning {args.model!r}"
    if args.command == "launch":
        return f"writing the launch of {args.model!r}"
    if args.command == "bench":
        return f"benchmarking {args.model!r}" if args.model else "benchmarking the default model"
    if args.command == "demo":
        return f"the demo in {args.dir!r}" if args.dir else "the demo"
    return "looking at this machine"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; the exit status: 0 done, 2 an error (one `cudaload: error: ...` line on stderr,
    no traceback unless --debug or CUDALOAD_DEBUG=1; also when the output cannot be written: stdout closed
    or a full disk), 130 Ctrl-C, 141 stdout closed early (a pipe to `head`, as a process killed by SIGPIPE
    reports it)."""
    parser = build_parser()
    if "--json" in (sys.argv[1:] if argv is None else argv):
        _usage_errors_as_json(parser)
    # A warning printed in the CLI's own words; formatwarning (not showwarning), so that a caller recording
    # warnings (pytest.warns, catch_warnings(record=True)) still gets them.
    formatwarning, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as typed: its next step repeats it
        return _run(parser, args)
    finally:
        warnings.formatwarning = formatwarning


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    debug = bool(args.debug) or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        if args.command == "doctor":
            from ..announce import announce, still_saying
            from ..capability import detect

            # torch's import and the GPU/CPU checks take seconds on a busy machine: say so first, and on a terminal
            # again after 4 s of quiet (5.5 s at load 4 on 2 cores), as plan and launch do.
            with still_saying():
                announce("cudaload.doctor", "doctor: checking this machine's GPUs, CPU and packages (a few seconds)")
                if args.remeasure:
                    remeasured = remeasure_report(None, _to_stderr) + "\n"
                report = doctor_report(detect(), args.json, args.check_hub)
            if args.remeasure:
                emit(remeasured, sys.stderr if args.json else None)
            emit(report)
        elif args.command == "probe":
            emit(remeasure_report(args.model, _to_stderr))
        elif args.command in ("plan", "launch"):
            from ..announce import still_saying

            command = plan_command if args.command == "plan" else launch_command
            # On a terminal a step quiet for 4 s says its line again (the import and a first plan: 20-38 s on a busy
            # machine, issue 46); the result is printed once that has stopped, so no line lands inside it.
            with before_first_import(lambda: _importing(args)), still_saying():
                output = command(args, parser)
            emit(output)
        elif args.command == "bench":
            return bench_command(args)
        elif args.command == "demo":
            from .. import announce as announcing
            from ..bench.rounds import ticking
            from ..demo import run_demo

            def progress(line: str) -> None:
                emit(fitted(f"[demo] {line}"), sys.stderr)

            # On a terminal a step quiet for STILL_S (the import, the dequantization, the answer's 32 tokens: 10-14 s
            # on 2 cores) says its line again with its age (`[demo] still: ...`), as plan and launch do; piped (the
            # docs' outputs, a log) the lines are the same from run to run.
            repeating = ticking(progress, every=announcing.STILL_S) if announcing.on_terminal() else None
            with repeating or contextlib.nullcontext(progress) as say:
                text = run_demo(args.dir, tiny=args.tiny, progress=say)
            emit(text)
    except OutputClosed as closed:
        silence(closed.stream)
        return 141
    except OutputFailed as failed:  # `> /dev/full`, `>&-`: the result is lost, and the status says so
        if failed.stream is not None:
            silence(failed.stream)
        where = "standard output" if failed.stream in (None, sys.stdout) else "standard error"
        _report(
            f"cudaload: error: could not write the {args.command} output to {where} ({failed.why}): it is lost. "
            "Check where the output goes (a full disk, a closed descriptor) and run it again."
        )
        return 2
    except KeyboardInterrupt:
        nothing = " before anything was measured" if args.command == "bench" else ""
        _report(f"cudaload: interrupted (Ctrl-C){nothing}")
        return 130
    except CudaloadError as exc:  # the library's message, its hints in the CLI's flags (--dtype float16)
        from ..facts.simulated import TESTED_VERSIONS
        from ..plans.layout import cli_hints

        simulated = TESTED_VERSIONS if args.command == "plan" and simulates(args) else None
        _report(f"cudaload: error: {cli_hints(str(exc), simulated)}", args, exc)
        return 2
    except OSError as exc:  # a file that cannot be read or written: the message names it
        if debug:
            raise
        hint = " (check that path and its permissions)" if exc.errno in _PATH_ERRNOS else ""
        _report(f"cudaload: error: {_doing(args)} failed: {_describe(exc)}{hint}", args, exc)
        return 2
    except Exception as exc:
        if debug:
            raise
        _report(
            f"cudaload: error: {_doing(args)} failed: {_describe(exc)}\n"
            "cudaload: cudaload did not expect this error (it is not one of its own messages): if the model and "
            f"options are right, please report it with the traceback that --debug (or {DEBUG_ENV}=1) shows.",
            args,
            exc,
        )
        return 2
    return 0


def _usage_errors_as_json(parser: argparse.ArgumentParser) -> None:
    """With --json a usage error (argparse's, or a command's `parser.error`) also prints a JSON object on stdout,
    as every other error does (`_report`): a script that parses stdout reads the error instead of nothing."""
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.extend(action.choices.values())
    for one in parsers:

        def error(message: str, _one: argparse.ArgumentParser = one, _error: Any = one.error) -> NoReturn:
            with contextlib.suppress(OutputClosed, OutputFailed):
                emit(json.dumps({"error": {"type": "UsageError", "message": f"{_one.prog}: {message}"}}, indent=2))
            _error(message)
            raise AssertionError("argparse's error() returns only by exiting")  # pragma: no cover

        one.error = error  # type: ignore[method-assign]


def _format_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """A warning as the CLI's own line, `cudaload: warning: ...`: not Python's raw format with the file, line
    number and source line of the `warnings.warn` call (which mean nothing to a command-line user)."""
    kind = "" if category.__name__ == "CudaloadWarning" else f"{category.__name__}: "
    return "\n".join(fitted(line) for line in f"cudaload: warning: {kind}{message}".splitlines()) + "\n"


def _importing(args: argparse.Namespace) -> None:
    """The line said before a command's first import of transformers and torch: seconds of CPU, 7-14 s on a busy
    machine, when the terminal would otherwise stay blank (issue 46)."""
    from ..announce import announce

    announce("cudaload.cli", f"{_doing(args)}: importing transformers and torch to read it (a few seconds)")


def _to_stderr(line: str) -> None:
    """A progress line (`cudaload probe` waiting on another process's lock) where it does not mix with the output."""
    emit(f"cudaload: {line}", sys.stderr)


def _report(message: str, args: argparse.Namespace | None = None, exc: BaseException | None = None) -> None:
    """The error line on stderr; with --json also a JSON object on stdout, so a script that parses stdout
    reads the error instead of nothing. Nothing more to do when a stream is a closed pipe."""
    try:
        emit("\n".join(fitted(line) for line in message.splitlines()), sys.stderr)
        if exc is not None and getattr(args, "json", False):
            text = message.removeprefix("cudaload: error: ")
            emit(json.dumps({"error": {"type": type(exc).__name__, "message": text}}, indent=2))
    except OutputClosed as closed:
        silence(closed.stream)
    except OutputFailed:  # the output cannot be written either: the exit status is all there is
        pass
