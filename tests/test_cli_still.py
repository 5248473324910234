"""On a terminal, `cudaload plan` and `launch` never stay silent for more than ~5 s: a step quiet for STILL_S
seconds says its line again with its age. Piped, the output is the same from run to run (issue 46, item 4)."""

from __future__ import annotations

import argparse
import io
import os
import pty
import re
import select
import sys
import time

import pytest

import cudaload.announce as announce_module
import cudaload.cli as cli
from cudaload.announce import announce


def _slow_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """A command whose step stays quiet for a while after its progress line (the import, a first plan)."""
    announce(
        "cudaload.cli", f"{args.command} {args.model}: importing transformers and torch to read it (a few seconds)"
    )
    time.sleep(1.2)
    return "the result"


def _read_all(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's side is closed and everything it wrote was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


@pytest.mark.parametrize("command", ["plan", "launch"])
def test_a_quiet_step_says_its_line_again_on_a_terminal_and_never_in_a_pipe(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CUDALOAD_QUIET", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(announce_module, "STILL_S", 0.3, raising=False)
    monkeypatch.setattr(cli, f"{command}_command", _slow_command)
    argv = [command, "./tiny"] + (["--nodes", "1"] if command == "launch" else [])

    controller, terminal_fd = pty.openpty()
    try:
        with os.fdopen(terminal_fd, "w", buffering=1, closefd=True) as terminal:
            monkeypatch.setattr(sys, "stderr", terminal)
            assert cli.main(argv) == 0
            monkeypatch.setattr(sys, "stderr", sys.__stderr__)
        said = _read_all(controller).replace("\r\n", "\n")
    finally:
        os.close(controller)
    assert capsys.readouterr().out == "the result\n"
    lines = said.splitlines()
    assert lines[0] == f"cudaload: {command} ./tiny: importing transformers and torch to read it (a few seconds)"
    again = [line for line in lines[1:] if line.startswith("cudaload: still: ")]
    assert again and len(again) == len(lines) - 1, said  # quiet 1.2 s, said again every 0.3 s: 2-4 times
    for line in again:
        assert re.fullmatch(
            rf"cudaload: still: {command} \./tiny: importing transformers and torch to read it \(\d+ s so far\)", line
        ), line

    piped = io.StringIO()  # no terminal: the docs' outputs, a script, a log
    monkeypatch.setattr(sys, "stderr", piped)
    assert cli.main(argv) == 0
    assert piped.getvalue() == lines[0] + "\n"
    assert capsys.readouterr().out == "the result\n"


def _slow_demo(folder: object, *, tiny: bool, progress: object) -> str:
    """The demo's steps: a progress line, then a long quiet step (the first import, the answer's tokens)."""
    progress("planning and loading the tiny model (the first import of torch takes seconds)")  # type: ignore[operator]
    time.sleep(1.2)
    return "the answer"


def test_the_demo_says_a_quiet_step_again_on_a_terminal_and_never_in_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cudaload.demo

    monkeypatch.delenv("CUDALOAD_QUIET", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(announce_module, "STILL_S", 0.3, raising=False)
    monkeypatch.setattr(cudaload.demo, "run_demo", _slow_demo)

    controller, terminal_fd = pty.openpty()
    try:
        with os.fdopen(terminal_fd, "w", buffering=1, closefd=True) as terminal:
            monkeypatch.setattr(sys, "stderr", terminal)
            assert cli.main(["demo", "--tiny"]) == 0
            monkeypatch.setattr(sys, "stderr", sys.__stderr__)
        said = _read_all(controller).replace("\r\n", "\n")
    finally:
        os.close(controller)
    assert capsys.readouterr().out == "the answer\n"
    first = said.splitlines()[0]
    assert first == "[demo] planning and loading the tiny model (the first import of torch takes seconds)"
    again = " ".join(said.split()).split("[demo] still: ")[1:]  # each as read, however the terminal wrapped it
    assert again, said  # quiet 1.2 s, said again every ~0.24 s
    for line in again:
        assert re.fullmatch(
            r"planning and loading the tiny model \(the first import of torch takes seconds\) \(\d+ s so far\) ?",
            line,
        ), line

    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    assert cli.main(["demo", "--tiny"]) == 0
    assert piped.getvalue() == first + "\n"
    assert capsys.readouterr().out == "the answer\n"


def test_doctor_says_its_line_again_on_a_terminal_and_never_in_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def slow_report(machine: object, as_json: bool, check_hub: bool) -> str:
        time.sleep(1.2)  # torch's import and the probe, on a busy machine
        return "the report"

    monkeypatch.delenv("CUDALOAD_QUIET", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(announce_module, "STILL_S", 0.3, raising=False)
    monkeypatch.setattr(cli, "doctor_report", slow_report)

    controller, terminal_fd = pty.openpty()
    try:
        with os.fdopen(terminal_fd, "w", buffering=1, closefd=True) as terminal:
            monkeypatch.setattr(sys, "stderr", terminal)
            assert cli.main(["doctor"]) == 0
            monkeypatch.setattr(sys, "stderr", sys.__stderr__)
        said = _read_all(controller).replace("\r\n", "\n").splitlines()
    finally:
        os.close(controller)
    assert capsys.readouterr().out == "the report\n"
    first = "cudaload: doctor: checking this machine's GPUs, CPU and packages (a few seconds)"
    assert said[0] == first
    assert len(said) > 1 and all(
        re.fullmatch(r"cudaload: still: doctor: checking this machine's GPUs, CPU and packages \(\d+ s so far\)", line)
        for line in said[1:]
    ), said

    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    assert cli.main(["doctor"]) == 0
    assert piped.getvalue() == first + "\n"
    assert capsys.readouterr().out == "the report\n"
