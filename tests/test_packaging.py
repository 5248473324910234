"""The package ships on its own (issue 38, item 2): a licence that matches the metadata, classifiers and an
author, no link to a repository or site that does not exist, a long description (the README) that reads
right for someone who installs the wheel, and an sdist that carries what its tests import. `.ci/run`
builds the sdist and the wheel and installs the wheel in a fresh venv; these are the checks that need no
build."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
README = (ROOT / "README.md").read_text()


def test_the_licence_is_the_apache_2_text_the_metadata_names() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190  # the full text


def test_the_metadata_has_an_author_and_classifiers_and_no_urls() -> None:
    assert PROJECT["authors"] and all(a.get("name") for a in PROJECT["authors"])
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and any(c.startswith("Development Status ::") for c in classifiers)
    assert not any(c.startswith("License ::") for c in classifiers)  # PEP 639: the license expression says it
    assert "urls" not in PROJECT  # no public repository or site is known


def test_the_long_description_reads_right_for_a_wheel_user() -> None:
    assert PROJECT["readme"] == "README.md"
    # No relative link (it breaks on a package index's page) and no link to something that does not exist.
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert all(re.match(r"https?://", link) for link in links), links
    assert "github.com/cudaload" not in README
    # The wheel user's two commands come first; the clone's (with the constraints file) under Development.
    install, development = README.index("## Install"), README.index("## Development")
    assert install < README.index("cudaload-0.1.0-py3-none-any.whl[") < development
    assert README.index("-c constraints/tested.txt") > development
    assert PROJECT["version"] == "0.1.0"  # the wheel's file name above names it


def test_the_sdist_carries_what_its_tests_import() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text()
    imported = {"conftest.py", "model_shapes.py"}
    assert imported <= {p.name for p in (ROOT / "tests").glob("*.py")}
    assert all(f"tests/{name}" in manifest for name in imported)
    assert "recursive-include tests/distributed *.py" in manifest
