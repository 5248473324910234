"""Every command fits the terminal and is never silent (issue 46 items 4 and 8): at 80 and 100 columns no line
is longer than the width unless it is one word that cannot be broken (announcements, error and warning lines,
argparse's usage errors and help, `[bench]` lines, the bench's generation table, the `applied:` block, a long
path in `loads as`); a command says what it waits on before its first import of transformers; a missing local
path is said before that import, never read as a Hub id; what transformers says during a bench goes after its
table and into its record; the CLI's plan shows the generation block `model.cudaload_plan.explain()` shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from cudaload.cli import main

ROOT = Path(__file__).parents[1]
WIDTHS = [80, 100]


def _too_long(text: str, width: int) -> list[str]:
    """The lines longer than `width` that are more than one word (a path alone on its line may stick out)."""
    return [line for line in text.splitlines() if len(line) > width and len(line.split()) > 1]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exited:  # --help, and argparse's usage errors
        status = int(exited.code or 0)
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.fixture
def long_path(tiny_models: dict[str, Path], tmp_path: Path) -> str:
    """The tiny Qwen3 in a folder whose path is longer than a terminal line (a model under a deep project tree)."""
    folder = tmp_path / ("a-project-folder-with-a-long-name-" * 3) / "checkpoints" / "qwen3-tiny"
    shutil.copytree(tiny_models["qwen3"], folder)
    return str(folder)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_command_fits_the_terminal_but_for_one_unbreakable_word(
    width: int,
    long_path: str,
    tiny_models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.chdir(tmp_path)  # short relative output folders: a command to copy is never wrapped
    path = str(tiny_models["qwen3"])
    layout = ["--gpu", "H100", "--count", "8", "--nodes", "2"]
    commands: list[tuple[list[str], int]] = [
        (["plan", long_path], 0),  # before: `loads as` glued the path to from_pretrained( (140 columns)
        (["plan", long_path, "--finetune"], 0),
        (["plan", path, "--finetune", *layout], 0),
        (["launch", path, *layout, "--out", "job"], 0),
        (["plan", path, "--gpu", "A100,,T4"], 2),  # argparse's usage error: before, one line of 178 columns
        (["plan", "./no/such/model/folder"], 2),
        (["plan", path, "--gpu", "A10G", "--finetune", "--quantize", "4bit"], 2),
        (["demo", "--tiny", "--dir", "tiny"], 0),
        (["demo", "--tiny", "--dir", "tiny"], 0),  # the test forward proven: before, a `verified:` line of 172
    ]
    commands += [([*command, "--help"], 0) for command in (["plan"], ["launch"], ["bench"], ["demo"], ["doctor"])]
    commands.append((["--help"], 0))
    for argv, status in commands:
        got, text = _run(argv, capsys)
        assert got == status, (argv, text[-2000:])
        assert _too_long(text, width) == [], argv
    # A warning in the CLI's own words fits too: a config.json whose dtype is not the weights'.
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_models["qwen3"], mixed)
    config = json.loads((mixed / "config.json").read_text())
    (mixed / "config.json").write_text(json.dumps({**config, "dtype": "float16"}))

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))  # as Python prints it

    with warnings.catch_warnings():  # printed, as outside pytest (which records warnings)
        warnings.simplefilter("always")
        warnings.showwarning = show
        got, text = _run(["plan", str(mixed)], capsys)
    flat = " ".join(text.split())
    assert got == 0 and "cudaload: warning: '" in flat and "safetensors weights are stored in" in flat
    assert _too_long(text, width) == []  # before: the warning on one line of 400 columns


def test_the_plan_shows_the_generation_block_the_loaded_model_explains(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cudaload

    monkeypatch.setenv("COLUMNS", "100")
    path = str(tiny_models["qwen3"])
    assert main(["plan", path]) == 0
    cli = capsys.readouterr().out
    model: Any = cudaload.load(path)
    applied = model.cudaload_plan.explain()  # at COLUMNS, as the CLI's
    block = applied[applied.index("  generation (context") : applied.index("  loads as")]
    assert block.count("generation.") >= 5
    assert block in cli  # before: the CLI planned no generation, the loaded model's explanation had 25 lines of it
    assert main(["plan", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["generation"] == model.cudaload_plan.plan.generation.to_dict()


ERROR = "RuntimeError: " + "the offloaded static cache needs a CUDA device; " * 3


def test_the_bench_generation_table_fits_and_keeps_each_number(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudaload.bench.report import format_generation

    def row(name: str, cache: str | None, padding: str, ok: bool = True) -> dict[str, Any]:
        return {
            "name": name,
            "is_plan": name == "plan",
            "is_default": False,
            "generate_kwargs": {"cache_implementation": cache} if cache else {},
            "padding_side": padding,
            "ok": ok,
            "error": None if ok else ERROR,
            "decode_tokens_per_s": 334.5,
            "generate_s": 0.111,
            "peak_memory_bytes": 11 * 2**20,
            "kv_cache_bytes": 0.15 * 2**20,
            "matches_unpadded": 2,
            "sequences": 2,
            "speedup_over_default": {"decode": 2.23, "generate": 1.92},
            "memory_over_default": 1.0,
        }

    section = {
        "batch": 2,
        "prompt_lengths": [48, 64],
        "new_tokens": 16,
        "plan": {"generate_kwargs": {}, "padding_side": "left"},
        "variants": [
            row("plan", None, "left"),
            row("default generate()", None, "right"),
            row("offloaded static cache", "offloaded_static", "left", ok=False),
        ],
        "kv_cache_bytes_planned": 0.15 * 2**20,
        "matches_unpadded": "sequences whose greedy continuation equals generating that prompt alone, unpadded",
    }
    for width in WIDTHS:
        monkeypatch.setenv("COLUMNS", str(width))  # the terminal's width, as format_report lays out the rest
        table = format_generation(section)
        assert _too_long(table, width) == [], table  # before: rows of 128 columns, wrapped mid-row as prose
        rows = [line for line in table.splitlines() if line.startswith(("* plan", "  default generate()"))]
        assert any("334.5" in r and "0.111" in r and "2/2" in r for r in rows)  # a row's numbers on one line
        assert any("2.23 / 1.92 / 1.00" in r for r in rows)  # its ratios over default, beside its label
        assert " ".join(ERROR.split()) in " ".join(table.split())  # the whole error, wrapped under its column


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_progress_lines_fit(width: int, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    seen: list[str] = []

    def run_bench(model: Any, *, log: Any, **kwargs: Any) -> dict[str, Any]:
        log("   5.1s  skipped float16/sdpa: fp16 is never planned on a CPU (policy/precision.py: overflow risk); "
            "`--all-variants` times it")  # fmt: skip
        seen.append("ran")
        raise KeyboardInterrupt

    monkeypatch.setattr("cudaload.bench.run_bench", run_bench)
    assert main(["bench", "--quick"]) == 130 and seen == ["ran"]
    err = capsys.readouterr().err
    assert "[bench]    5.1s  skipped float16/sdpa" in err
    assert _too_long(err, width) == []  # before: 133 columns


@pytest.mark.slow
def test_what_transformers_says_during_a_bench_goes_after_the_table_and_into_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from cudaload.bench import format_report, run_bench

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    result = run_bench(quick=True, repeats=1, prompt_tokens=8, new_tokens=4, log=print)
    err = capfd.readouterr().err
    # The default generate() variant pads right on purpose: transformers warns, and before, the warning was
    # printed between the run's lines (and, on a terminal, among the table's rows).
    assert "right-padding was detected" not in err
    said = result["upstream_messages"]
    padding = [m for m in said if "right-padding was detected" in m["message"]]
    assert padding and padding[0]["source"] == "transformers" and padding[0]["count"] >= 1
    report = format_report(result, 100)
    last_row = report.index("KV cache the plan estimates")
    assert report.index("right-padding was detected") > last_row  # after the tables, never between rows


def _stderr_of(argv: list[str], cwd: Path) -> str:
    """`cudaload ARGV` in a fresh interpreter with `-X importtime`: its stderr holds the progress lines and
    each import as it finishes, in the order they happened."""
    env = {**os.environ, "CUDALOAD_PROBE": "0", "PYTHONPATH": str(ROOT / "src")}
    env.pop("COLUMNS", None)  # each message on one line (stderr is a pipe)
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cudaload", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    return run.stderr


def _first_heavy_import(lines: list[str]) -> int:
    for i, line in enumerate(lines):
        if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip().split(".")[0] in (
            "torch",
            "transformers",
        ):
            return i
    raise AssertionError("neither torch nor transformers was imported")


def test_each_slow_command_says_what_it_waits_on_before_importing_transformers(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    path = str(tiny_models["qwen3"])
    (tmp_path / "model.gguf").write_bytes(b"GGUF")  # not a real GGUF file: transformers reads it, and says so
    (tmp_path / "no-config").mkdir()
    cases = [
        ["plan", path, "--finetune"],
        ["launch", path, "--gpu", "H100", "--count", "8", "--nodes", "2", "--out", str(tmp_path / "job")],
        ["plan", str(tmp_path), "--gguf-file", "model.gguf"],
        ["plan", str(tmp_path / "no-config")],  # a wrong path: a folder with no config.json
    ]
    for argv in cases:
        lines = _stderr_of(argv, tmp_path).splitlines()
        said = [i for i, line in enumerate(lines) if "importing transformers and torch" in line]
        # Before: nothing on the terminal until the plan or the error, 7-14 s on a busy 2-core machine.
        assert said and said[0] < _first_heavy_import(lines), (argv, lines[-5:])
        assert lines[said[0]].startswith("cudaload: ")


@pytest.mark.parametrize("name", ["./no-such-model", "/no/such/model", "~/no-such-model", "models/qwen3/base"])
def test_a_missing_local_folder_is_said_before_transformers_is_imported(name: str, tmp_path: Path) -> None:
    code = (
        "import sys; from cudaload.cli import main; "
        f"rc = [main(['plan', {name!r}]), main(['launch', {name!r}, '--out', 'job'])]; "
        "print(*rc, 'transformers' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    # Before: launch imported transformers first (4-14 s); `models/qwen3/base` was taken for a Hub id.
    assert run.stdout.split() == ["2", "2", "False"], run.stderr
    assert run.stderr.count("no such file or folder") == 2 and "Hugging Face Hub" not in run.stderr
