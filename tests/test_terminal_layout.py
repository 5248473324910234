"""The text the CLI prints fits the terminal it is read in (issue 38, item 1): at 80 and 100 columns no line
is longer than the width unless it is one unbreakable word, no value is cut, reasons hang under their
column, and each report ends with its next step (the plan with the from_pretrained call it stands for,
doctor with the next command, bench with where its record is)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from cudaload.cli import main
from cudaload.plans.layout import call_lines, cli_hints, columns, terminal_width

WIDTHS = [80, 100]


def _fits(text: str, width: int) -> None:
    for line in text.splitlines():
        assert len(line) <= width or " " not in line.strip(), f"{len(line)} > {width}: {line!r}"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _run(argv: list[str], width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("width", WIDTHS)
def test_a_finetune_plan_fits_the_terminal_and_cuts_no_value(
    width: int, tiny_models, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tiny_models["qwen3"])
    plan = json.loads(_run(["plan", path, "--finetune", "--json"], width, capsys, monkeypatch))
    plan = json.loads(_run(["plan", path, "--finetune", "--json"], width, capsys, monkeypatch))  # probe cached
    text = _run(["plan", path, "--finetune"], width, capsys, monkeypatch)
    _fits(text, width)
    assert "…" not in text  # before: `{"r": 16, "lora_alpha": 32, "lora_d…`
    flat = _flat(text)
    for decision in plan["decisions"]:
        value = decision["value"] if isinstance(decision["value"], str) else json.dumps(decision["value"])
        assert _flat(value) in flat, decision["setting"]
        assert _flat(cli_hints(decision["reason"])) in flat, decision["setting"]
    # A reason's continuation lines start at its own column, under the first line's reason.
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("use_cache"))
    column = lines[first].index("training runs")
    assert lines[first + 1][:column].strip() == "" and lines[first + 1][column] != " "


@pytest.mark.parametrize("width", WIDTHS)
def test_the_plan_ends_with_the_from_pretrained_call_it_stands_for(
    width: int, tiny_models, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tiny_models["qwen3"])
    text = _run(["plan", path, "--gpu", "A100", "--with", "bitsandbytes==0.50.2", "--finetune", "--quantize", "4bit"],
                width, capsys, monkeypatch)  # fmt: skip
    _fits(text, width)
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if "from_pretrained(" in line)
    end = lines.index("", start)  # then a blank line and the next step (issue 46)
    assert lines[end + 1].startswith("Next: ")
    call = ast.parse("\n".join(line.strip() for line in lines[start:end]), mode="eval").body
    assert isinstance(call, ast.Call) and ast.literal_eval(call.args[0]) == path
    kwargs = {k.arg: k.value for k in call.keywords}
    plan = json.loads(_run(["plan", path, "--gpu", "A100", "--with", "bitsandbytes==0.50.2", "--finetune",
                            "--quantize", "4bit", "--json"], width, capsys, monkeypatch))  # fmt: skip
    assert set(kwargs) == set(plan["kwargs"])
    assert ast.literal_eval(kwargs["dtype"]) == plan["kwargs"]["dtype"]
    bnb = kwargs["quantization_config"]
    assert isinstance(bnb, ast.Call) and ast.unparse(bnb.func) == "BitsAndBytesConfig"
    assert {k.arg: ast.literal_eval(k.value) for k in bnb.keywords}["bnb_4bit_quant_type"] == "nf4"


def test_hints_speak_the_interface_they_appear_in(tiny_models, capsys, monkeypatch) -> None:
    import cudaload

    path = str(tiny_models["qwen3"])
    python = cudaload.plan(path, finetune=True).explain(width=100)
    cli = _run(["plan", path, "--finetune"], 100, capsys, monkeypatch)
    assert "pass quantize='4bit'" in _flat(python) and "--quantize" not in python
    assert "pass --quantize 4bit" in _flat(cli) and "quantize='4bit'" not in cli
    assert cli_hints("pass hub_kernels=True (or use_kernels=True) to allow Hub code") == (
        "pass --hub-kernels to allow Hub code"
    )
    assert cli_hints("pass quantize='4bit' to trade") == "pass --quantize 4bit to trade"


@pytest.mark.parametrize("width", WIDTHS)
def test_doctor_fits_and_ends_with_the_next_command(width: int, capsys, monkeypatch) -> None:
    text = _run(["doctor"], width, capsys, monkeypatch)
    _fits(text, width)
    assert _flat(text.split("\n\n")[-1]).startswith("Next: cudaload plan MODEL")


def test_the_width_comes_from_columns_or_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "73")
    assert terminal_width() == 73 and terminal_width(120) == 120
    monkeypatch.setenv("COLUMNS", "5")
    assert terminal_width() == 40  # narrower lays out for 40 and lets the terminal wrap
    monkeypatch.delenv("COLUMNS")
    assert terminal_width() == 100  # pytest's stdout is no terminal: the default


def test_columns_keep_a_long_word_whole_and_hang_reasons() -> None:
    long = "kernels-community/" + "x" * 90
    rows = [("attn_implementation", long, "a reason " * 12), ("", "x sdpa", "short")]
    lines = columns(rows, 80)
    assert long in "\n".join(lines)  # on a line of its own, whole
    _fits("\n".join(lines), 80)
    reason_lines = [line for line in lines if "a reason" in line]
    assert len(reason_lines) > 1 and len({len(line) - len(line.lstrip()) for line in reason_lines}) == 1
    call = call_lines("AutoModel.from_pretrained", "m", {"dtype": "float32", "device_map": {"": 0}}, 40)
    assert ast.parse("".join(line.strip() for line in call)) is not None


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_the_bench_report_fits_and_says_where_its_record_is(
    width: int, tiny_models, tmp_path: Path, capsys, monkeypatch
) -> None:
    from cudaload.bench import format_report, run_bench

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    result = run_bench(str(tiny_models["llama"]), quick=True, repeats=1, prompt_tokens=8, new_tokens=4)
    report = format_report(result, width)
    for line in report.splitlines():  # the generation table is the one block still wrapped as prose
        assert len(line) <= width or " " not in line.strip(), line
    rows = [line for line in report.splitlines() if line.startswith("* ")][:2]
    # The plan's medians, and its speed-ups (in a table of their own at this width).
    load = next(r for r in result["variants"] if r["is_plan"])["load_s"]
    assert f"{load:7.3f}" in rows[0] and "1.00 / 1.00" in rows[1]


@pytest.mark.slow
def test_bench_ends_with_where_its_record_and_chart_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")  # the dev extra has it: the chart is drawn by default where it can be
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run.json"
    text = _run(["bench", "--quick", "--repeats", "1", "--out", str(out)], 100, capsys, monkeypatch)
    _fits(text.split("\ngeneration:")[0], 100)
    assert text.splitlines()[-2:] == [f"written: {out}", f"written: {out.with_suffix('.png')}"]
    assert out.is_file() and out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
