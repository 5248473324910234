"""Developer sessions. CI runs .ci/run (the same install and test command as the README)."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "tests_newest", "lint", "typecheck", "docs"]
nox.options.default_venv_backend = "venv"

INSTALL = ("-c", "constraints/tested.txt", "-e", ".[dev,finetune,kernels]")


def _install(session: nox.Session) -> None:
    # torch first and exactly: 2.13.0 is a CPU wheel here; a looser pin pulls a CUDA build.
    session.install("torch==2.13.0")
    session.install(*INSTALL)


@nox.session
def tests(session: nox.Session) -> None:
    _install(session)
    session.run("pytest", *session.posargs, env={"HF_HUB_OFFLINE": "1"})


@nox.session
def tests_newest(session: nox.Session) -> None:
    """The suite on the newest releases the registry resolves (no constraints file): what users get."""
    session.install("torch==2.13.0")
    session.install("-e", ".[dev,finetune,kernels]")
    session.run("pytest", *session.posargs, env={"HF_HUB_OFFLINE": "1"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "benchmarks", "tools")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "tools")


@nox.session
def typecheck(session: nox.Session) -> None:
    _install(session)
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    session.install("-c", "constraints/tested.txt", "mkdocs", "mkdocs-material", "mkdocstrings[python]")
    session.run("mkdocs", "build", "--strict", "-d", "site")


@nox.session
def gpu(session: nox.Session) -> None:
    """The GPU-marked tests; run on a machine with a CUDA GPU."""
    _install(session)
    session.run("pytest", "-m", "gpu", *session.posargs, env={"HF_HUB_OFFLINE": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks; results go to benchmarks/results/."""
    _install(session)
    session.run("python", "benchmarks/cpu_dtype.py", *session.posargs, env={"HF_HUB_OFFLINE": "1"})
