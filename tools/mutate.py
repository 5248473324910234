"""Mutation testing of the decision code: does the test suite notice when a rule is changed a little?

A small tool of our own (mutmut and cosmic-ray are too slow on a 2-core box and trip over the src/
layout). It parses each target file with `ast`, lists every mutant of these kinds:

- a comparison flipped at its boundary: `<` <-> `<=`, `>` <-> `>=`, `==` <-> `!=`;
- `and` <-> `or`;
- a number changed: an int n to n+1, n-1 and 2n; a float x to 2x and x/2 (a ratio or a share
  moved by +-1 is not a boundary, it is another rule);
- `not` removed;
- `return True` <-> `return False`;

draws a seeded sample of them, and for each one copies `src/` to a temporary folder, edits the copy
(never the worktree's files), and runs pytest with PYTHONPATH pointing at the copy. A mutant is
*killed* when a test fails, *survived* when they all pass, *timeout* when they run past the per-mutant
limit (3x the unmutated run of those tests, or for coverage-picked tests 3x their time in the coverage
run plus 30 s; at least 60 s; on a timeout the unmutated run is timed again, and when the machine's load
has made it slower the mutant is retried once under the new limit). Numbers inside f-strings are skipped:
they only change printed text, and on Python 3.11 `ast` gives wrong positions inside f-strings.

Which tests run for a mutant of `src/cudaload/X/Y.py`, in turn until one fails (`-x`):

1. tests/test_mutation_survivors.py in full (`-m "not distributed and not gpu"`: its load() tests are
   marked slow);
2. with `--select coverage` (the default; needs pytest-cov): the tests that ran the mutated line, found
   by running the suite once on the unmutated copy under coverage with one context per test. A line that
   only runs at import (a constant, a default argument) has no test of its own: the tests that ran any
   line of its file stand in;
3. the test files whose import lines name the module (`cudaload.X.Y`, `from cudaload.X import Y`, or
   `import cudaload.X.Y`), or any line of which names `cudaload.X.Y` (a file that checks a module's rules
   through plan() says so in its docstring), plus tests/test_policy.py (it reaches every rule through
   `decide_plan`): this finds a test that reaches the line in a subprocess, which coverage does not follow.

Stages 2 and 3 run with `-m "not slow and not distributed and not gpu"` (`--markers`: a -m replaces
pyproject's "not gpu"). `--select imports` skips stage 2 (the tool's first selection); `--fast-suite`
runs the whole suite as stage 3 (minutes per mutant here); `--tests` replaces every stage with the
pytest arguments given. So the score is a lower bound for the whole suite: a mutant only a slow test
notices counts as survived.

    python tools/mutate.py                          # 40 mutants, seed 0, policy/, planner*, loaders*, launch_*
    python tools/mutate.py --select imports         # without the coverage run (no pytest-cov needed)
    python tools/mutate.py --sample 80 --seed 3 --files 'src/cudaload/policy/precision.py'
    python tools/mutate.py --list                   # every mutant, nothing run
    python tools/mutate.py --match 'generation.py:16[01] ' --sample 99 --tests tests/test_mutation_survivors.py
    python tools/mutate.py --json results           # also file benchmarks/results/<machine>/<date>-mutation.json

Run from the repository root with the project's venv (`nox -s mutation` does). Not part of CI: it
takes tens of minutes.
"""

from __future__ import annotations

import argparse
import ast
import glob
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Globs, so the modules the issue-30 refactor splits out of these files stay covered.
DEFAULT_FILES = (
    "src/cudaload/policy/**/*.py",
    "src/cudaload/planner*.py",
    "src/cudaload/planner/**/*.py",
    "src/cudaload/loaders*.py",
    "src/cudaload/loaders/**/*.py",
    # The parallelism code outside policy/ (policy/parallelism.py and rank_sizing.py are in the first glob).
    "src/cudaload/launch/files.py",
    "src/cudaload/launch/check.py",
)
SURVIVORS = "tests/test_mutation_survivors.py"
ALWAYS = (SURVIVORS, "tests/test_policy.py")
COMPARE_FLIP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">")}
COMPARE_FLIP |= {ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}


@dataclass(frozen=True)
class Mutant:
    """One edit of one file: bytes [start, end) of the UTF-8 source replaced by `new`."""

    path: str  # relative to the repository root
    line: int
    start: int
    end: int
    old: str
    new: str
    kind: str

    def describe(self) -> str:
        return f"{self.path}:{self.line} {self.kind}: {self.old!r} -> {self.new!r}"


class _Positions:
    """(line, UTF-8 column) <-> byte offsets of one source file (ast's columns count bytes)."""

    def __init__(self, source: bytes) -> None:
        self.starts = [0]
        for index, byte in enumerate(source):
            if byte == ord("\n"):
                self.starts.append(index + 1)

    def start(self, node: ast.AST) -> int:
        return int(self.starts[node.lineno - 1] + node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return int(self.starts[node.end_lineno - 1] + node.end_col_offset)  # type: ignore[attr-defined]


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, f-string parts, `__all__`, annotations, TYPE_CHECKING blocks."""
    skipped: set[int] = set()

    def skip(node: ast.AST) -> None:
        skipped.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip(node)
        elif isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            skip(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            skip(node.returns)
        elif (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)) or (
            isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        ):
            skip(node)
    return skipped


def _numbers(value: int | float) -> Iterator[int | float]:
    if isinstance(value, int):
        yield from (value + 1, value - 1, value * 2)
    else:
        yield from (value * 2, value / 2)


def mutants_of(path: Path) -> list[Mutant]:
    """Every mutant of one file, in source order."""
    source = path.read_bytes()
    tree = ast.parse(source)
    pos = _Positions(source)
    skipped = _skipped_nodes(tree)
    # Relative to the repository root, where run() copies from; a file elsewhere keeps its absolute path.
    resolved = path.resolve()
    rel = str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved)
    found: list[Mutant] = []

    seen: set[tuple[int, int, str]] = set()

    def add(node: ast.AST, start: int, end: int, new: str, kind: str) -> None:
        old = source[start:end].decode()
        if old != new and (start, end, new) not in seen:  # 1 + 1 == 1 * 2: one mutant
            seen.add((start, end, new))
            found.append(Mutant(rel, node.lineno, start, end, old, new, kind))  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Compare):
            lefts = [node.left, *node.comparators[:-1]]
            for op, left, right in zip(node.ops, lefts, node.comparators, strict=True):
                if type(op) not in COMPARE_FLIP:
                    continue
                text, flipped = COMPARE_FLIP[type(op)]
                gap_start, gap_end = pos.end(left), pos.start(right)
                # The gap between the operands holds the operator (and maybe parentheses and spaces).
                match = re.search(r"(<=|>=|==|!=|<|>)", source[gap_start:gap_end].decode())
                if match and match.group(1) == text:
                    start = gap_start + len(source[gap_start:gap_end].decode()[: match.start(1)].encode())
                    add(node, start, start + len(text), flipped, "compare")
        elif isinstance(node, ast.BoolOp):
            word, other = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            for left, right in zip(node.values, node.values[1:], strict=False):
                gap_start, gap_end = pos.end(left), pos.start(right)
                gap = source[gap_start:gap_end].decode()
                match = re.search(rf"\b{word}\b", gap)
                if match:
                    start = gap_start + len(gap[: match.start()].encode())
                    add(node, start, start + len(word), other, "boolean")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            # Only the keyword and its spaces: a parenthesised operand keeps its "(".
            keyword = re.match(rb"not\s*", source[pos.start(node) :])
            if keyword:
                add(node, pos.start(node), pos.start(node) + keyword.end(), "", "not removed")
        elif (
            isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool)
        ):
            value = node.value
            add(value, pos.start(value), pos.end(value), str(not value.value), "return")
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        ):
            for number in _numbers(node.value):
                add(node, pos.start(node), pos.end(node), repr(number), "number")
    found.sort(key=lambda m: (m.line, m.start, m.new))
    return found


def target_files(patterns: list[str]) -> list[Path]:
    files = {Path(p).resolve() for pattern in patterns for p in glob.glob(str(ROOT / pattern), recursive=True)}
    return sorted(p for p in files if p.suffix == ".py")


def module_of(path: str) -> str:
    """ "src/cudaload/policy/precision.py" -> "cudaload.policy.precision" (a package's __init__ -> the package)."""
    parts = Path(path).with_suffix("").parts[1:]  # drop "src"
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tests_for(path: str) -> list[str]:
    """The test files whose import lines name the module of `path`, plus ALWAYS."""
    module = module_of(path)
    package, _, leaf = module.rpartition(".")
    patterns = [rf"\b{re.escape(module)}\b"]
    if package:
        patterns.append(rf"^\s*from\s+{re.escape(package)}\s+import\s+.*\b{re.escape(leaf)}\b")
    wanted = re.compile("|".join(f"(?:{p})" for p in patterns), re.MULTILINE)
    chosen = set()
    for test in sorted((ROOT / "tests").glob("test_*.py")):
        imports = "\n".join(
            line for line in test.read_text().splitlines() if re.match(r"\s*(from|import)\s", line) or module in line
        )
        if wanted.search(imports):
            chosen.add(str(test.relative_to(ROOT)))
    chosen.update(t for t in ALWAYS if (ROOT / t).exists())
    return sorted(chosen)


def _copy_env(copy: Path) -> dict[str, str]:
    """The environment every pytest run of the tool gets: Python imports cudaload from the copy, writes no
    bytecode beside it, and never reaches the Hub."""
    return {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1"}


def _test_function(context: str) -> str:
    """A pytest-cov context ("tests/test_x.py::test_y[param]|run") -> the test function's node id: a
    parametrised test runs with all its parameters (a parameter may hold "::" or spaces)."""
    return re.sub(r"\[.*\]$", "", context.rsplit("|", 1)[0])


@dataclass
class CoverageMap:
    """Which tests ran each line of the target files in one coverage run of the unmutated copy."""

    lines: dict[tuple[str, int], set[str]]  # (path relative to the root, line) -> test functions
    files: dict[str, set[str]]  # path -> every test function that ran a line of it
    seconds: dict[str, float]  # test function -> its setup, call and teardown, summed over parameters
    root: Path = ROOT  # where the measured source is read: the copy (the worktree may change meanwhile)

    def tests_for(self, mutant: Mutant) -> list[str]:
        """The tests that ran the mutated lines (from the node's first line to the edited one); for a
        line that only runs at import, the tests that ran its file."""
        edit_line = (self.root / mutant.path).read_bytes()[: mutant.start].count(b"\n") + 1
        chosen: set[str] = set()
        for line in range(min(mutant.line, edit_line), max(mutant.line, edit_line) + 1):
            chosen |= self.lines.get((mutant.path, line), set())
        return sorted(chosen or self.files.get(mutant.path, set()))

    def limit(self, tests: list[str]) -> float:
        """Seconds a mutant may take on `tests`: 3x their time under coverage (which runs slower), plus
        pytest's start, and at least 60 s."""
        return max(60.0, 3 * sum(self.seconds.get(t, 1.0) for t in tests) + 30)


def coverage_map(copy: Path, markers: str, timeout: float) -> CoverageMap:
    """Run the suite (`-m markers`) once on the unmutated copy under pytest-cov with one context per test."""
    try:
        import coverage
        import pytest_cov  # noqa: F401  (only to say what is missing before a long run)
    except ImportError:
        sys.exit("--select coverage needs coverage and pytest-cov: pip install pytest-cov (or --select imports)")
    data_file = copy / ".coverage-mutate"
    package = copy / "src" / "cudaload"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", markers, f"--cov={package}"]
    command += ["--cov-context=test", "--cov-report=", "--durations=0", "--durations-min=0", "tests"]
    env = {**_copy_env(copy), "COVERAGE_FILE": str(data_file)}
    print(f"coverage run of the suite (-m {markers!r}) on the unmutated copy ...", flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-15:])
        sys.exit(f"the unmutated code fails the suite under coverage (exit {done.returncode}):\n{tail}")
    seconds: dict[str, float] = {}
    for match in re.finditer(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S.*?)\s*$", done.stdout, re.MULTILINE):
        test = _test_function(match.group(2))
        seconds[test] = seconds.get(test, 0.0) + float(match.group(1))
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    lines: dict[tuple[str, int], set[str]] = {}
    files: dict[str, set[str]] = {}
    for measured in data.measured_files():
        path = str(Path(measured).relative_to(copy))
        for line, contexts in (data.contexts_by_lineno(measured) or {}).items():
            tests = {_test_function(c) for c in contexts if c}
            if tests:
                lines[(path, line)] = tests
                files.setdefault(path, set()).update(tests)
    print(
        f"coverage run: {len(seconds)} test functions, {len(lines)} lines with a test, "
        f"{time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return CoverageMap(lines, files, seconds, root=copy)


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed, survived, timeout
    seconds: float
    failed: str  # the first failing test, when killed


def _pytest(copy: Path, tests: list[str], markers: str, timeout: float) -> tuple[str, float, str]:
    env = _copy_env(copy)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", markers, *tests]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - started, ""
    seconds = time.perf_counter() - started
    if done.returncode == 0:
        return "survived", seconds, ""
    if done.returncode == 5:  # nothing collected: treat as not covered, never as killed
        return "survived", seconds, "no tests collected"
    failed = next((line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
    last = done.stdout.strip().splitlines()[-1:]
    return "killed", seconds, failed or (last[0] if last else f"exit {done.returncode}")


def _copy_src(into: Path) -> Path:
    shutil.copytree(ROOT / "src", into / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # Some tests find repository files from the package's path (docs/how-it-works.md, pyproject.toml):
    # the rest of the repository is linked beside the copy, read-only in spirit, never edited.
    for entry in ROOT.iterdir():
        if entry.name not in ("src", ".git"):
            (into / entry.name).symlink_to(entry)
    probe = subprocess.run(
        [sys.executable, "-c", "import cudaload; print(cudaload.__file__)"],
        env=_copy_env(into),
        capture_output=True,
        text=True,
        check=True,
    )
    if not probe.stdout.strip().startswith(str(into)):
        sys.exit(f"the copy is not what Python imports (cudaload from {probe.stdout.strip()}): check PYTHONPATH")
    return into


def _stages(
    mutant: Mutant, args: argparse.Namespace, covered: CoverageMap | None
) -> list[tuple[str, list[str], float | None]]:
    """(pytest -m, tests, time limit or None to measure it) run in turn for a mutant until one fails:
    SURVIVORS in full (its tests that load a tiny model are marked slow), the tests that ran the mutated
    line (`--select coverage`), then the mapped files (or the whole suite) without the slow ones."""
    if args.tests:
        return [(args.markers, list(args.tests), None)]
    stages: list[tuple[str, list[str], float | None]] = []
    if (ROOT / SURVIVORS).exists():
        stages.append(("not distributed and not gpu", [SURVIVORS], None))
    if covered is not None:
        ran = [t for t in covered.tests_for(mutant) if not t.startswith(SURVIVORS)]
        if ran:
            stages.append((args.markers, ran, covered.limit(ran)))
    rest = ["tests"] if args.fast_suite else [t for t in tests_for(mutant.path) if t != SURVIVORS]
    return [*stages, (args.markers, rest, None)] if rest else stages


def run(args: argparse.Namespace) -> int:
    files = target_files(args.files)
    every = [m for f in files for m in mutants_of(f) if re.search(args.match, m.describe())]
    if args.list:
        for m in every:
            print(m.describe())
        print(f"{len(every)} mutants in {len(files)} files")
        return 0
    sample = sorted(
        random.Random(args.seed).sample(every, min(args.sample, len(every))), key=lambda m: (m.path, m.line)
    )
    print(f"{len(sample)} of {len(every)} mutants (seed {args.seed}) in {len(files)} files", flush=True)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="cudaload-mutate-") as tmp:
        copy = _copy_src(Path(tmp))
        covered = None
        if args.select == "coverage" and not args.tests:
            covered = coverage_map(copy, args.markers, timeout=args.baseline_timeout)
        limits: dict[tuple[str, ...], float] = {}
        for number, mutant in enumerate(sample, 1):
            status, seconds, failed = "survived", 0.0, ""
            for markers, tests, limit in _stages(mutant, args, covered):
                key = (markers, *tests)
                if limit is not None:  # the coverage run passed these tests and timed them
                    limits[key] = limit
                if key not in limits:  # the unmutated copy must pass these tests; its time sets the limit
                    base, took, why = _pytest(copy, tests, markers, timeout=args.baseline_timeout)
                    if base != "survived":
                        sys.exit(f"the unmutated code fails {' '.join(tests)}: {why or base}")
                    limits[key] = max(60.0, 3 * took)
                target = copy / mutant.path
                original = target.read_bytes()
                target.write_bytes(original[: mutant.start] + mutant.new.encode() + original[mutant.end :])
                try:
                    status, took, failed = _pytest(copy, tests, markers, timeout=limits[key])
                    if status == "timeout":
                        # On a shared machine the limit may be the load's, not the mutant's: time the
                        # unmutated copy again, and when it now needs more, retry the mutant once with that.
                        target.write_bytes(original)
                        base, again, _ = _pytest(copy, tests, markers, timeout=args.baseline_timeout)
                        if base == "survived" and max(60.0, 3 * again) > limits[key]:
                            limits[key] = max(60.0, 3 * again)
                            target.write_bytes(original[: mutant.start] + mutant.new.encode() + original[mutant.end :])
                            status, took, failed = _pytest(copy, tests, markers, timeout=limits[key])
                finally:
                    target.write_bytes(original)
                seconds += took
                if status != "survived":
                    break
            outcomes.append(Outcome(mutant, status, round(seconds, 1), failed))
            print(f"[{number}/{len(sample)}] {status:8} {seconds:6.1f}s {mutant.describe()}", flush=True)
    return _report(outcomes, args)


def _report(outcomes: list[Outcome], args: argparse.Namespace) -> int:
    by_file: dict[str, dict[str, int]] = {}
    for o in outcomes:
        row = by_file.setdefault(o.mutant.path, {"mutants": 0, "killed": 0, "survived": 0, "timeout": 0})
        row["mutants"] += 1
        row[o.status] += 1
    print(f"\n{'file':48} {'mutants':>7} {'killed':>6} {'survived':>8} {'timeout':>7}")
    for path, row in sorted(by_file.items()):
        print(f"{path:48} {row['mutants']:7} {row['killed']:6} {row['survived']:8} {row['timeout']:7}")
    killed = sum(o.status in ("killed", "timeout") for o in outcomes)  # a mutant that hangs is noticed
    score = killed / len(outcomes) if outcomes else 0.0
    print(f"\nscore: {killed}/{len(outcomes)} killed or timed out = {score:.0%}")
    for o in outcomes:
        if o.status == "survived":
            print(f"  survived: {o.mutant.describe()}")
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        result = {
            "command": " ".join(["python", "tools/mutate.py", *sys.argv[1:]]),
            "seed": args.seed,
            "select": "tests" if args.tests else args.select,
            "sample": len(outcomes),
            "score": round(score, 3),
            "files": by_file,
            "mutants": [
                {**asdict(o.mutant), **{k: v for k, v in asdict(o).items() if k != "mutant"}} for o in outcomes
            ],
        }
        # Led by the machine and the versions, as every benchmark record (bench/environment.py).
        target = write_benchmark_record(args.json, ROOT / "benchmarks" / "results", "mutation", result)
        print(f"written: {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), help="globs relative to the repo root")
    parser.add_argument("--sample", type=int, default=40, help="how many mutants to run (default 40)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--tests", nargs="+", help="run these pytest arguments for every mutant instead")
    parser.add_argument(
        "--markers",
        default="not slow and not distributed and not gpu",
        help="pytest -m for the mapped tests (or --tests)",
    )
    parser.add_argument(
        "--fast-suite",
        action="store_true",
        help="after SURVIVORS, the whole suite (with --markers) instead of the mapped files",
    )
    parser.add_argument(
        "--select",
        choices=("coverage", "imports"),
        default="coverage",
        help="coverage: also run the tests that ran the mutated line (one coverage run first; needs "
        "pytest-cov); imports: only the files that import the module",
    )
    parser.add_argument(
        "--baseline-timeout", type=float, default=1800, help="seconds an unmutated run (or the coverage run) may take"
    )
    parser.add_argument("--match", default="", help="only mutants whose description matches this regex")
    parser.add_argument("--list", action="store_true", help="list every mutant and stop")
    parser.add_argument(
        "--json", help="write the outcome here ('results': benchmarks/results/<machine>/<date>-mutation.json)"
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
