from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cudaload.cli import main


def test_doctor_json_describes_this_machine(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.delenv("CUDALOAD_QUIET", raising=False)
    assert main(["doctor", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout stays JSON: what doctor is doing goes to stderr (issue 37)
    assert captured.err.startswith("cudaload: doctor: checking this machine's GPUs, CPU and packages")
    # The CPUs this process may run on, as the OS reports them (not only "at least one").
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert report["machine"]["cpu"]["cores"] == cores
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
    assert "Use --dtype float16" in capsys.readouterr().err  # the hint in the CLI's words
    assert main(["plan", str(tiny_models["llama"]), "--gpu", "K80"]) == 2
    assert "Known GPUs" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "cudaload", "doctor"], capture_output=True, text=True, check=True)
    assert "What you get here" in out.stdout


def test_launch_flags_plan_this_machine_under_a_launcher(tiny_models, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tiny_models["llama"])
    assert main(["plan", path, "--world-size", "4", "--strategy", "fsdp", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "device_map" not in plan["kwargs"]  # FSDP places parameters itself
    assert (
        main(
            [
                "plan",
                path,
                "--gpu",
                "A100",
                "--count",
                "2",
                "--world-size",
                "2",
                "--strategy",
                "deepspeed",
                "--zero-stage",
                "3",
                "--json",
            ]
        )
        == 0
    )
    assert "device_map" not in json.loads(capsys.readouterr().out)["kwargs"]
    assert main(["plan", path, "--gpu", "A100", "--count", "2", "--world-size", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kwargs"]["device_map"] == {"": 0}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--count", "4"], "--count needs --gpu"),
        (["--strategy", "fsdp"], "add --world-size"),
        (["--world-size", "2", "--zero-stage", "3"], "--zero-stage goes with --strategy deepspeed"),
        (["--gpu", "T4", "--with", "flash-attn"], "PKG==VERSION"),
    ],
)
def test_inconsistent_flags_are_refused(tiny_models, capsys: pytest.CaptureFixture[str], argv, message) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(tiny_models["llama"]), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_model_without_logits_is_not_called_verified(tiny_models) -> None:
    from cudaload import load

    model = load(str(tiny_models["llama"]), model_class="AutoModel")
    assert model.cudaload_plan.verified is None


def test_doctor_reports_invalid_launch_variables_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    from cudaload.capability import detect

    detect.cache_clear()
    try:
        assert main(["doctor"]) == 0
    finally:
        detect.cache_clear()
    out = capsys.readouterr().out
    assert "Launch: env rank 5/2" in out
    assert "no plan: The distributed launch variables are invalid: RANK=5 is not below WORLD_SIZE=2" in out
