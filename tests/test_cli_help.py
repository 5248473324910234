"""`cudaload --version`, and a help text for every flag (`cudaload plan --help` had empty ones)."""

from __future__ import annotations

import argparse

import pytest

from cudaload.cli import main
from cudaload.cli.parser import build_parser
from cudaload.version import __version__


def _options(parser: argparse.ArgumentParser, command: str) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, f"{command} {name}")
        elif action.option_strings:
            found.append((f"{command} {action.option_strings[-1]}", action))
    return found


def test_every_flag_says_what_it_does() -> None:
    options = _options(build_parser(), "cudaload")
    assert len(options) > 40
    assert [name for name, action in options if not (action.help or "").strip()] == []


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"cudaload {__version__} (transformers ")
