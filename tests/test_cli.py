from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudaload.cli import main


def test_doctor_json_describes_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["machine"]["cpu"]["cores"] >= 1
    assert report["backends"]["attention_chain"][-1] == "eager"
    assert {"torch", "transformers"} <= {name for name, _ in report["machine"]["software"]["packages"]}


def test_plan_json_for_a_simulated_h100(tiny_models, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(tiny_models["qwen3"]), "--gpu", "H100", "--with", "flash-attn-3==3.0.0", "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["kwargs"]["attn_implementation"] == "flash_attention_3"
    assert plan["kwargs"]["dtype"] == "bfloat16"
    assert plan["attention_chain"] == ["flash_attention_3", "sdpa", "eager"]
    assert {d["setting"] for d in plan["decisions"]} >= {"dtype", "attn_implementation", "device_map"}


def test_plan_text_for_a_t4(tiny_models, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tiny_models["llama"]), "--gpu", "T4"]) == 0
    out = capsys.readouterr().out
    assert "float16" in out and "x flash_attention_2" in out


def test_bad_input_exits_2_with_the_library_message(tiny_models, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tiny_models["llama"]), "--gpu", "T4", "--dtype", "bfloat16"]) == 2
    assert "Use dtype='float16'" in capsys.readouterr().err
    assert main(["plan", str(tiny_models["llama"]), "--gpu", "K80"]) == 2
    assert "Known GPUs" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "cudaload", "doctor"], capture_output=True, text=True, check=True)
    assert "What you get here" in out.stdout
