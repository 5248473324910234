"""Every public name is documented for the API page (Google style, rendered by mkdocstrings) and
every example in those docstrings runs, offline, as written.

The examples are the reference's promises: a stale one would show readers output cudaload no
longer prints. They build their models with `cudaload.demo.build_tiny_model` (random weights, no
download) and print only what does not depend on the machine running them.
"""

from __future__ import annotations

import dataclasses
import doctest
import inspect
import io
import re
import tempfile
from typing import Any

import pytest

import cudaload

PUBLIC = sorted(name for name in cudaload.__all__ if name != "__version__")
FUNCTIONS = [name for name in PUBLIC if not inspect.isclass(getattr(cudaload, name))]
DATACLASSES = [name for name in PUBLIC if dataclasses.is_dataclass(getattr(cudaload, name))]
EXCEPTIONS = [
    name
    for name in PUBLIC
    if inspect.isclass(getattr(cudaload, name)) and issubclass(getattr(cudaload, name), (Exception, Warning))
]

# detect() reads the machine and records a failing probe instead of raising: no Raises section.
CANNOT_RAISE = {"detect"}

# Examples that import more than torch and transformers (peft) or train: seconds each.
SLOW_EXAMPLES = {"cudaload.load_for_finetune"}


def _doc(name: str) -> str:
    return inspect.getdoc(getattr(cudaload, name)) or ""


def _section(doc: str, title: str) -> str:
    """The body of a Google-style section: the indented lines after `title:`."""
    match = re.search(rf"^{title}:\n((?:[ \t]+.*\n|\n)*)", doc + "\n", re.MULTILINE)
    return match.group(1) if match else ""


def test_the_name_lists_cover_all_public_names() -> None:
    classes = set(DATACLASSES) | set(EXCEPTIONS)
    assert set(FUNCTIONS) | classes == set(PUBLIC)
    assert len(FUNCTIONS) == 10


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_docstring_has_args_returns_raises_and_an_example(name: str) -> None:
    doc = _doc(name)
    assert doc.splitlines()[0].strip(), f"{name}: no one-line summary"
    parameters = inspect.signature(getattr(cudaload, name)).parameters
    args = _section(doc, "Args")
    if parameters:
        assert args, f"{name}: no Args: section"
    for parameter in parameters.values():
        prefix = {inspect.Parameter.VAR_KEYWORD: "**", inspect.Parameter.VAR_POSITIONAL: "*"}.get(parameter.kind, "")
        assert re.search(rf"^    {re.escape(prefix + parameter.name)}:", args, re.MULTILINE), (
            f"{name}: parameter {prefix}{parameter.name} is not described under Args:"
        )
    assert _section(doc, "Returns"), f"{name}: no Returns: section"
    if name not in CANNOT_RAISE:
        raises = _section(doc, "Raises")
        assert raises, f"{name}: no Raises: section"
        for error in re.findall(r"^    (\w+)(?:, \w+)*:", raises, re.MULTILINE):
            assert error in cudaload.__all__, f"{name}: Raises: names {error}, not a public cudaload exception"
    assert ">>>" in _section(doc, "Examples"), f"{name}: no Examples: with a doctest"


@pytest.mark.parametrize("name", DATACLASSES)
def test_dataclass_docstring_lists_every_field_under_attributes(name: str) -> None:
    cls: Any = getattr(cudaload, name)
    doc = _doc(name)
    attributes = _section(doc, "Attributes")
    assert attributes, f"{name}: no Attributes: section"
    for field in dataclasses.fields(cls):
        assert re.search(rf"^    {field.name}:", attributes, re.MULTILINE), (
            f"{name}: field {field.name} is not described under Attributes:"
        )


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_exception_docstring_says_when_it_is_raised(name: str) -> None:
    doc = _doc(name)
    # The base class says it is never raised itself (its subclasses are).
    assert re.search(r"\b(Raised|Issued|Never raised)\b", doc), f"{name}: does not say which call raises it"
    assert ">>>" in _section(doc, "Examples"), f"{name}: no Examples: with a doctest"


def _collect() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder()
    found: dict[str, doctest.DocTest] = {}
    for name in PUBLIC:
        # A class's search reaches its methods (e.g. Machine.simulated).
        for test in finder.find(getattr(cudaload, name), name=f"cudaload.{name}"):
            if test.examples:
                found.setdefault(test.name, test)
    return sorted(found.values(), key=lambda t: t.name)


DOCTESTS = _collect()


def test_the_examples_are_collected() -> None:
    # Guard against a finder that silently finds nothing (and every example test "passes").
    assert len(DOCTESTS) >= 8
    assert sum(len(t.examples) for t in DOCTESTS) >= 8
    named = {t.name for t in DOCTESTS}
    assert {f"cudaload.{name}" for name in FUNCTIONS} <= named


@pytest.mark.parametrize(
    "test",
    [pytest.param(t, marks=pytest.mark.slow) if t.name in SLOW_EXAMPLES else t for t in DOCTESTS],
    ids=lambda t: t.name,
)
def test_docstring_example_runs(test: doctest.DocTest, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The examples' tempfile.mkdtemp() folders land in this test's tmp_path, not in /tmp.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = io.StringIO()
    runner = doctest.DocTestRunner(verbose=False)
    # A fresh namespace per run: the finder's globs are shared between tests of one module.
    test.globs = dict(test.globs)
    result = runner.run(test, out=report.write, clear_globs=False)
    assert result.attempted == len(test.examples)
    assert result.failed == 0, report.getvalue()
