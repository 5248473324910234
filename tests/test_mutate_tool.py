"""tools/mutate.py, the mutation tool behind `nox -s mutation`: the mutants it lists and the tests it picks.

A score is only as true as these two: a mutant that edits the wrong bytes, or a selection that never runs
the test that would notice, reports a survivor that is not one (or hides one)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutate():
    spec = importlib.util.spec_from_file_location("cudaload_mutate_tool", ROOT / "tools" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


SOURCE = '''"""A docstring with 3 < 4 in it."""
LIMIT = 8


def fits(size, free, strict=False):
    if size < free and not strict:
        return True
    return f"{size} > {free}" == "x"
'''


def _apply(source: str, mutant) -> str:
    data = source.encode()
    return (data[: mutant.start] + mutant.new.encode() + data[mutant.end :]).decode()


def test_each_mutant_edits_only_its_operator_and_skips_docstrings_and_f_strings(mutate, tmp_path):
    path = tmp_path / "rules.py"
    path.write_text(SOURCE)
    found = {(m.line, m.kind, m.old, m.new) for m in mutate.mutants_of(path)}
    assert found == {
        (2, "number", "8", "9"),
        (2, "number", "8", "7"),
        (2, "number", "8", "16"),
        (6, "compare", "<", "<="),
        (6, "boolean", "and", "or"),
        (6, "not removed", "not ", ""),
        (7, "return", "True", "False"),
        (8, "compare", "==", "!="),
    }
    for mutant in mutate.mutants_of(path):
        mutated = _apply(SOURCE, mutant).splitlines()
        original = SOURCE.splitlines()
        changed = [i + 1 for i, (a, b) in enumerate(zip(original, mutated, strict=True)) if a != b]
        assert changed == [mutant.line], mutant.describe()
        compile("\n".join(mutated), "rules.py", "exec")  # every mutant is still Python


def test_a_context_names_the_test_function_whatever_its_parameters(mutate):
    assert mutate._test_function("tests/test_a.py::test_b[2-x::y z]|run") == "tests/test_a.py::test_b"
    assert mutate._test_function("tests/test_a.py::TestC::test_d|setup") == "tests/test_a.py::TestC::test_d"


def test_a_mutant_runs_the_tests_that_ran_its_lines_else_those_that_ran_its_file(mutate, tmp_path):
    path = tmp_path / "rules.py"
    path.write_text(SOURCE)
    mutants = {(m.line, m.kind): m for m in mutate.mutants_of(path)}
    rel = mutants[(6, "compare")].path
    covered = mutate.CoverageMap(
        lines={(rel, 6): {"tests/test_fit.py::test_small"}, (rel, 7): {"tests/test_fit.py::test_true"}},
        files={rel: {"tests/test_fit.py::test_small", "tests/test_fit.py::test_true", "tests/test_x.py::test_y"}},
        seconds={"tests/test_fit.py::test_small": 2.0, "tests/test_fit.py::test_true": 50.0},
    )
    assert covered.tests_for(mutants[(6, "compare")]) == ["tests/test_fit.py::test_small"]
    assert covered.tests_for(mutants[(7, "return")]) == ["tests/test_fit.py::test_true"]
    # LIMIT = 8 runs at import, under no test: every test that ran the file stands in.
    assert len(covered.tests_for(mutants[(2, "number")])) == 3
    # 3x the measured time plus pytest's start, never under a minute; an untimed test counts 1 s.
    assert covered.limit(["tests/test_fit.py::test_small"]) == 60.0
    assert covered.limit(["tests/test_fit.py::test_true", "tests/test_x.py::test_y"]) == 3 * 51.0 + 30


def test_the_stages_run_the_covering_tests_between_the_survivors_file_and_the_importers(mutate, tmp_path):
    args = mutate.argparse.Namespace(tests=None, markers="not slow", fast_suite=False)
    [mutant] = [m for m in mutate.mutants_of(ROOT / "src/cudaload/policy/precision.py") if m.kind == "compare"][:1]
    covered = mutate.CoverageMap(
        lines={(mutant.path, mutant.line): {"tests/test_mutation_survivors.py::test_x", "tests/test_cpu.py::test_y"}},
        files={},
        seconds={},
    )
    stages = mutate._stages(mutant, args, covered)
    assert stages[0] == ("not distributed and not gpu", [mutate.SURVIVORS], None)
    assert stages[1] == ("not slow", ["tests/test_cpu.py::test_y"], 60.0)  # the survivors' file already ran
    assert stages[2][0] == "not slow" and "tests/test_policy.py" in stages[2][1] and stages[2][2] is None
    assert [s[1] for s in mutate._stages(mutant, args, None)] == [[mutate.SURVIVORS], stages[2][1]]


def test_the_coverage_selection_without_pytest_cov_says_what_to_install(mutate, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pytest_cov", None)  # `import pytest_cov` raises ImportError
    with pytest.raises(SystemExit, match=r"pip install pytest-cov \(or --select imports\)"):
        mutate.coverage_map(tmp_path, "not slow", timeout=1)


@pytest.mark.parametrize(("unmutated_again", "verdict"), [(50.0, "killed"), (10.0, "timeout")])
def test_a_timeout_is_retried_only_when_the_unmutated_tests_got_slower(
    mutate, monkeypatch, tmp_path, capsys, unmutated_again: float, verdict: str
):
    """On a loaded machine a mutant may run past a limit set when it was idle: the unmutated tests are timed
    again, and only when they now need a longer limit is the mutant run once more under it."""
    target = "src/cudaload/policy/precision.py"
    [mutant] = [m for m in mutate.mutants_of(ROOT / target) if m.kind == "compare"][:1]

    def copy_src(into: Path) -> Path:
        (into / target).parent.mkdir(parents=True)
        (into / target).write_bytes((ROOT / target).read_bytes())
        return into

    # unmutated, mutated, unmutated again, mutated again
    runs = [("survived", 10.0, ""), ("timeout", 60.0, ""), ("survived", unmutated_again, "")]
    answers = iter([*runs, ("killed", 70.0, "FAILED tests/x.py::test_x")])
    calls: list[tuple[bool, float]] = []

    def fake_pytest(copy: Path, tests: list[str], markers: str, timeout: float):
        calls.append(((copy / target).read_bytes() != (ROOT / target).read_bytes(), timeout))
        return next(answers)

    monkeypatch.setattr(mutate, "_copy_src", copy_src)
    monkeypatch.setattr(mutate, "_pytest", fake_pytest)
    pattern = mutate.re.escape(mutant.describe())
    assert mutate.main(["--files", target, "--match", pattern, "--sample", "1", "--tests", "tests/x.py"]) == 0
    retried = [(False, 1800), (True, 60.0), (False, 1800), (True, 150.0)]  # (mutated?, limit)
    assert calls == (retried if verdict == "killed" else retried[:3])
    assert f"] {verdict:8}" in capsys.readouterr().out
