"""A newcomer's first mistakes each get one answer that leads to the fix (issue 38, item 3): a GGUF file
given as the model, a folder that is not there, 4-bit without its packages, a dtype this CPU measured
slow, a chart without matplotlib, a Hub id read online; and the tiny demo writes only into the cache."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import cudaload
from cudaload.cli import main
from cudaload.errors import MissingPackageError, ModelConfigError


def test_a_gguf_file_names_its_folder_and_gguf_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gguf = tmp_path / "SmolLM2.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")  # before: transformers read it as JSON, "is not a valid JSON file"
    with pytest.raises(ModelConfigError, match="is a GGUF file, not a model folder") as raised:
        cudaload.plan(str(gguf))
    assert f"{str(tmp_path)!r} with gguf_file='SmolLM2.Q4_1.gguf'" in str(raised.value)
    assert main(["plan", str(gguf)]) == 2
    assert "with --gguf-file SmolLM2.Q4_1.gguf" in capsys.readouterr().err  # the CLI's own flag
    (tmp_path / "notes.txt").write_text("a file")
    with pytest.raises(ModelConfigError, match="is a file, not a model folder"):
        cudaload.plan(str(tmp_path / "notes.txt"))


def test_the_cli_reads_a_gguf_file_with_gguf_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    # The flag reaches transformers: it reads the file's metadata (this one is no real GGUF file).
    assert main(["plan", str(tmp_path), "--gguf-file", "model.gguf"]) == 2
    err = capsys.readouterr().err
    assert "--gguf-file model.gguf" in err and "is not a valid JSON file" not in err


@pytest.mark.parametrize("name", ["./no-such-model", "/no/such/model", "models/qwen/base", "~/no-such-model/"])
def test_a_missing_local_folder_is_no_such_folder(name: str) -> None:
    # Before: taken for a Hub id ("Repo id must use alphanumeric chars") or fetched from the Hub.
    with pytest.raises(ModelConfigError, match="no such folder"):
        cudaload.plan(name)


def test_4bit_without_bitsandbytes_and_peft_names_both_at_once(tiny_models) -> None:
    t4 = cudaload.Machine.simulated("T4", packages={"bitsandbytes": None, "peft": None})
    with pytest.raises(MissingPackageError, match="install both with pip install bitsandbytes peft"):
        cudaload.plan(str(tiny_models["qwen3"]), machine=t4, finetune=True, quantize="4bit")
    with_peft = cudaload.Machine.simulated("T4", packages={"bitsandbytes": None, "peft": "0.21.2"})
    with pytest.raises(MissingPackageError) as raised:
        cudaload.plan(str(tiny_models["qwen3"]), machine=with_peft, finetune=True, quantize="4bit")
    assert "peft" not in str(raised.value)


def test_a_dtype_this_cpu_measured_slow_is_kept_with_its_cost(tiny_models) -> None:
    from test_probe_noise import probe_of

    probe = probe_of([1.0, 1.0, 1.0])
    slow = tuple((d, s * 3.3 if d == "float16" else s) for d, s in probe.prefill_s)  # fp16 at 0.30x fp32
    cpu = cudaload.Machine.simulated(None, dtype_probe=replace(probe, prefill_s=slow))
    planned = cudaload.plan(str(tiny_models["qwen3"]), machine=cpu, dtype="float16")
    assert planned.dtype == "float16"  # the choice is kept
    assert any("measured it slower than float32 (fp16 matmul 3.3x slower" in w for w in planned.warnings)
    fast = cudaload.plan(str(tiny_models["qwen3"]), machine=replace(cpu, dtype_probe=probe), dtype="float16")
    assert not any("slower than float32" in w for w in fast.warnings)


def test_a_chart_without_matplotlib_fails_before_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: find_spec gives None
    assert main(["bench", "--quick", "--chart", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "draws with matplotlib, which is not installed: pip install matplotlib" in err
    assert "[bench]" not in err  # nothing was measured first


def test_a_hub_id_read_online_is_said_at_once(
    tiny_models, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cudaload.capability import hub_access
    from cudaload.cli.plan_command import check_model_source

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_access, "hub_reachable", lambda timeout=3.0: (True, "answered"))
    check_model_source("Qwen/Qwen3-0.6B")
    assert "reading Qwen/Qwen3-0.6B's config from the Hugging Face Hub" in capsys.readouterr().err
    check_model_source(str(tiny_models["qwen3"]))  # a local folder: nothing to say
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_the_tiny_demo_builds_in_the_cache_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    here, cache = tmp_path / "here", tmp_path / "cache"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("CUDALOAD_CACHE", str(cache))
    assert main(["demo", "--tiny"]) == 0
    assert os.listdir(here) == []  # before: ./cudaload-demo-model, without a word
    built = cache / "models" / "tiny-qwen3-demo"
    assert (built / "config.json").is_file()
    assert f"the tiny model is in {built}" in " ".join(capsys.readouterr().out.split())  # wrapped for the terminal
