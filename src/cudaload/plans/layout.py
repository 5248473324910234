"""Text laid out for the terminal it is read in: the width (the terminal's, COLUMNS, or a default), lines
wrapped with a hanging indent and never cut, `setting  value  reason` rows whose reasons hang under their
own column, the `from_pretrained(...)` call a plan stands for, and hints in the CLI's own words."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from ..facts.quant_methods import quantization_method

__all__ = [
    "DEFAULT_WIDTH",
    "MIN_WIDTH",
    "call_lines",
    "cli_hints",
    "columns",
    "python_literal",
    "terminal_width",
    "wrap",
]

DEFAULT_WIDTH = 100
"""The width when neither the terminal nor COLUMNS says (a pipe, a file, a notebook)."""
MIN_WIDTH = 40
"""Narrower than this, the columns would hold a word a line: lay out for this and let the terminal wrap."""
_COLUMN_CAP = 20
"""A setting or value wider than this (at 100 columns; a fifth of a wider terminal) takes its own line, so one
long name does not push every reason to the right edge."""
_MIN_REASON = 30
"""Fewer columns than this left for the reasons: they go under their row instead of beside it."""


def terminal_width(width: int | None = None) -> int:
    """`width` if given, else the terminal's (`shutil.get_terminal_size`: COLUMNS first, then stdout's
    terminal), else DEFAULT_WIDTH; never below MIN_WIDTH."""
    if width is None:
        width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
        if width <= 0:  # COLUMNS=0, or a pseudo-terminal that reports no size (some CI runners)
            width = DEFAULT_WIDTH
    return max(width, MIN_WIDTH)


def wrap(text: str, width: int, indent: str = "", hang: int = 4) -> list[str]:
    """`text` as lines of at most `width` characters (a longer word, e.g. a path, is kept whole on its own
    line): the first at `indent`, the rest `hang` characters further in."""
    if not text:
        return [indent.rstrip()]
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + " " * hang,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent.rstrip()]


def columns(rows: Sequence[tuple[str, str, str]], width: int, indent: str = "  ") -> list[str]:
    """`(name, value, reason)` rows as aligned columns within `width`: a name or value too wide for its
    column starts the next cell on a new line at that cell's column; values and reasons wrap under their
    own column, never cut; with too little room left for the reasons, each goes under its row."""
    cap = max(_COLUMN_CAP, width // 5)
    name_width = max((len(n) for n, _, _ in rows if len(n) <= cap), default=0)
    value_width = max((len(v) for _, v, _ in rows if len(v) <= cap), default=0)
    value_column = len(indent) + name_width + 2
    reason_column = value_column + value_width + 2
    if width - reason_column < _MIN_REASON:
        reason_column = len(indent) + 4
    lines: list[str] = []
    for name, value, reason in rows:
        line = indent + name
        for column, text in ((value_column, value), (reason_column, reason)):
            room = width - column
            cell = [text] if len(text) <= room else wrap(text, room, hang=0)
            fits = len(cell[0]) <= room or not line.strip()  # an unbreakable word longer than the room: alone
            if len(line.rstrip()) + 2 <= column and fits:
                line = line.ljust(column) + cell[0]
            else:
                lines.append(line.rstrip())
                line = " " * column + cell[0]
            for more in cell[1:]:
                lines.append(line.rstrip())
                line = " " * column + more
        lines.append(line.rstrip())
    return lines


def python_literal(value: Any) -> str:
    """`value` (JSON-ready) as Python source: strings in double quotes, True/False/None."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def call_lines(callee: str, model: str, kwargs: Mapping[str, Any], width: int, indent: str = "  ") -> list[str]:
    """`callee("model", key=value, ...)` as Python source, wrapped between arguments with the later lines
    hanging 4 in. A bitsandbytes quantization_config is written as the BitsAndBytesConfig it
    stands for (cudaload.from_pretrained_kwargs builds that object from the plan's JSON-ready dict); another
    method's dict as the dict."""
    arguments = [json.dumps(model)]
    for key, value in kwargs.items():
        if key == "quantization_config" and isinstance(value, Mapping) and quantization_method(value) == "bitsandbytes":
            inner = ", ".join(f"{k}={python_literal(v)}" for k, v in value.items() if k != "quant_method")
            arguments.append(f"{key}=BitsAndBytesConfig({inner})")
        else:
            arguments.append(f"{key}={python_literal(value)}")
    text = f"{callee}(" + ", ".join(arguments) + ")"
    # Broken only at the spaces after commas and colons: kwargs' strings (dtypes, devices, module names)
    # hold no spaces, so each line ends outside a string literal and the call stays valid Python.
    if len(f"{indent}{callee}({arguments[0]},") <= width:
        return wrap(text, width, indent)
    # A long model path: the path on a line of its own, not glued to the callee past the width (issue 46).
    return [f"{indent}{callee}(", *wrap(", ".join(arguments) + ")", width, indent + " " * 4, hang=0)]


_FLAGS = {
    "hub_kernels": "--hub-kernels",
    "dtype": "--dtype",
    "quantize": "--quantize",
    "attn_implementation": "--attn",
    "generate": "--generate",
    "finetune": "--finetune",
    "gguf_file": "--gguf-file",
}
_PYTHON_ARGUMENT = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(True\b|'[^']*'|\"[^\"]*\")")


def cli_hints(text: str, simulated: Mapping[str, str] | None = None) -> str:
    """`text` with the Python arguments it suggests (hub_kernels=True, dtype='float16') written as the CLI's
    flags (--hub-kernels, --dtype float16), for a hint printed by `cudaload`. For a simulated machine
    (`simulated`: versions to suggest), an install command becomes the flag that gives it the package:
    `--with PKG==VERSION`."""

    def flag(found: re.Match[str]) -> str:
        name, value = found.group(1), found.group(2)
        return _FLAGS[name] if value == "True" else f"{_FLAGS[name]} {value[1:-1]}"

    def with_flags(found: re.Match[str]) -> str:
        assert simulated is not None
        flags = []
        for spec in (found.group(1) + found.group(2)).split():
            name, _, low = re.sub(r"[<,].*", "", spec.strip("'")).partition(">=")
            flags.append(f"--with {name}=={low or simulated.get(name, 'VERSION')}")
        return " ".join(flags)

    # The CLI has no use_kernels flag: "--hub-kernels (or use_kernels=True)" names only what it can take.
    text = _PYTHON_ARGUMENT.sub(flag, text).replace("--hub-kernels (or use_kernels=True)", "--hub-kernels")
    text = text.replace("use_kernels=True", "--hub-kernels")
    if simulated is None:
        return text
    # "pip install bitsandbytes peft": a second name is taken only when it is a package (not "pip install x or").
    more = "|".join(re.escape(name) for name in simulated)
    return re.sub(rf"\bpip install[ ]('[^']+'|[A-Za-z][\w.-]*\w)((?: (?:{more})(?![\w-]|\.\w))*)", with_flags, text)
