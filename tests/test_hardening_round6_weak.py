"""Hardening round 6 (issue 49), the weak cases by kind: locale, environment words, output, configs, cache.

Each ends with a cudaload error that says what to do, or a documented behaviour; each test failed before its fix.
No timing of this machine is asserted: the probe boundary (`measure_dtypes`) returns hand-made numbers."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cudaload
from cudaload import CudaloadWarning, DtypeProbe
from cudaload.announce import announce
from cudaload.capability import cache, dtype_probe
from cudaload.capability.software import layer_kernels_disabled
from cudaload.cli import main
from cudaload.errors import ModelConfigError, SettingError
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import Machine, ProbeRound

SRC = Path(cudaload.__file__).parent

# --- locale -------------------------------------------------------------------------------------------------------


def _text_opens_without_encoding(tree: ast.AST) -> list[int]:
    """Lines that open a file in text mode without `encoding=`: open()/Path.open() without a "b" mode,
    read_text()/write_text(), subprocess with text=True."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        keywords = {k.arg for k in node.keywords}
        if "encoding" in keywords:
            continue
        if name in ("read_text", "write_text"):
            found.append(node.lineno)
        elif name == "open" and not (
            isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", "") == "os"
        ):
            mode = (
                node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            if not (isinstance(mode, ast.Constant) and "b" in str(mode.value)):
                found.append(node.lineno)
        elif name in ("run", "Popen", "check_output") and "text" in keywords:
            found.append(node.lineno)
    return found


def test_every_file_cudaload_opens_as_text_names_its_encoding() -> None:
    # Before: 27 places, e.g. capability/software.py read torch's version file with the locale's encoding.
    missing = {
        str(path.relative_to(SRC)): lines
        for path in sorted(SRC.rglob("*.py"))
        if (lines := _text_opens_without_encoding(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert missing == {}


def test_the_cli_plans_this_machine_under_an_ascii_locale(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONUTF8": "0",
        "PYTHONIOENCODING": "",
        "CUDALOAD_PROBE": "0",
        "CUDALOAD_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": str(SRC.parent),
    }
    done = subprocess.run(
        [sys.executable, "-m", "cudaload", "plan", str(tiny_models["qwen3"])],
        env=env,
        capture_output=True,
        timeout=300,
    )
    # Before: "planning ... failed: UnicodeDecodeError: 'ascii' codec can't decode byte 0xe2".
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    assert b"loads as" in done.stdout and b"UnicodeDecodeError" not in done.stderr


# --- environment words ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["false", "no", "off", "0", ""])
def test_cudaload_quiet_false_does_not_silence_stderr(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDALOAD_QUIET", value)
    announce("cudaload.test", "measuring")
    assert capsys.readouterr().err == "cudaload: measuring\n"  # before: silent for false/no/off


def test_cudaload_quiet_is_validated_as_cudaload_probe_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDALOAD_QUIET", "TRUE")
    announce("cudaload.test", "measuring")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("CUDALOAD_QUIET", "banana")
    with pytest.raises(SettingError, match=r"CUDALOAD_QUIET='banana': use 1 .* or 0"):
        announce("cudaload.test", "measuring")


def test_use_hub_kernels_is_read_exactly_as_transformers_5_25_reads_it() -> None:
    # transformers 5.25 integrations/hub_kernels._kernels_enabled: os.getenv(...).lower() in (..., "y", "yes", ...).
    assert layer_kernels_disabled({"USE_HUB_KERNELS": " yes "}) == "USE_HUB_KERNELS= yes "  # before: None (stripped)
    assert layer_kernels_disabled({"USE_HUB_KERNELS": "Y"}) is None
    assert layer_kernels_disabled({"USE_HUB_KERNELS": ""}) == "USE_HUB_KERNELS="


# --- output -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["plan", "--json"], "the following arguments are required: model"),
        (["plan", "m", "--json", "--gpu", "T4", "--count", "0"], "--count 0: a simulated machine has at least one"),
    ],
)
def test_a_json_usage_error_is_json_on_stdout(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and words in err
    error = json.loads(out)["error"]  # before: stdout empty
    assert error["type"] == "UsageError" and words in error["message"]


def test_cli_warnings_are_its_own_lines_and_a_file_as_cache_names_the_setting(tiny_models: dict[str, Path]) -> None:
    env = {**os.environ, "CUDALOAD_CACHE": os.devnull, "CUDALOAD_PROBE": "0", "PYTHONPATH": str(SRC.parent)}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "cudaload", "plan", str(tiny_models["qwen3"]), "--gpu", "T4"],
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    # Before: "/.../cache.py:312: CudaloadWarning: ... (File exists): ..." and the `warnings.warn(` source line.
    assert "cudaload: warning: cudaload could not write its measurement cache in /dev/null/" in err
    assert "CUDALOAD_CACHE='/dev/null' leads to /dev/null, which is not a folder" in err
    assert "CudaloadWarning" not in err and "warnings.warn(" not in err and ".py:" not in err


def test_a_closed_stdout_is_an_error_not_a_lost_plan(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", None)  # what Python sets when it starts with descriptor 1 closed (`>&-`)
    assert main(["plan", str(tiny_models["qwen3"]), "--gpu", "T4"]) == 2  # before: 0, the plan lost
    assert "could not write the plan output to standard output (standard output is closed)" in capsys.readouterr().err


def test_a_full_disk_on_stdout_is_a_write_error_not_a_planning_failure(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with open("/dev/full", "w", encoding="utf-8") as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert main(["plan", str(tiny_models["qwen3"]), "--gpu", "T4"]) == 2
        monkeypatch.undo()
    err = capsys.readouterr().err
    assert "could not write the plan output to standard output (No space left on device)" in err
    assert "planning" not in err  # before: "planning '...' failed: OSError: [Errno 28] No space left on device"


def _probe(k: int, n: int) -> DtypeProbe:
    prefill = {"float32": 0.010, "bfloat16": 0.005, "float16": 0.010}
    decode = {"float32": 1e-3, "bfloat16": 5e-4, "float16": 1e-3}
    r = ProbeRound(
        tuple(prefill.items()), tuple(decode.items()), tuple((a, b, 1e-4) for a in DTYPES for b in DTYPES if a != b)
    )
    return DtypeProbe(
        k, n, 128, r.prefill_s, r.decode_s, r.cast_s, 2, "2026-12-06T00:00:00Z",
        rounds=(r,) * 5, confidence="quiet", conditions="by hand",
    )  # fmt: skip


def test_cudaload_probe_does_not_say_recorded_when_it_could_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "cache"
    shared.mkdir()
    shared.chmod(0o777)  # writable by others: cudaload neither reads nor writes its records there
    monkeypatch.setenv("CUDALOAD_CACHE", str(shared))
    monkeypatch.setattr(dtype_probe, "measure_dtypes", _probe)
    monkeypatch.setattr(dtype_probe, "_measured_here", {})
    with pytest.warns(CudaloadWarning, match="does not read its cache"):
        assert main(["probe"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "recorded in" not in out  # before: "recorded in <path>" after the write had failed
    assert "not recorded: " in out and "holds for this process only" in out


# --- configs ------------------------------------------------------------------------------------------------------


def _config_folder(tmp_path: Path, name: str, config: object, **changes: object) -> str:
    folder = tmp_path / name
    config.save_pretrained(folder)  # type: ignore[attr-defined]
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**data, **changes}), encoding="utf-8")
    return str(folder)


def _llama() -> object:
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, architectures=["LlamaForCausalLM"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        # Before: a raw ZeroDivisionError from LlamaConfig.validate_architecture, "please report it".
        ({"num_attention_heads": 0}, r"ZeroDivisionError.*config.json has num_attention_heads=0"),
        # Before: planned, and the model failed its first forward.
        ({"num_key_value_heads": 8}, r"num_key_value_heads=8 but num_attention_heads=4.*at most 4"),
        # Before: a raw KeyError 'banana' from the rotary embedding.
        (
            {"rope_parameters": {"rope_type": "banana", "rope_theta": 10000.0, "factor": 2.0}},
            r"RoPE rope_type 'banana', which transformers does not know \(it builds 'default', 'linear'",
        ),
    ],
)
def test_a_config_transformers_cannot_build_is_a_model_config_error(
    tmp_path: Path, changes: dict[str, object], words: str
) -> None:
    folder = _config_folder(tmp_path, "bad", _llama(), **changes)
    with pytest.raises(ModelConfigError, match=words):
        cudaload.plan(folder, machine=Machine.simulated("A100"))


HETEROGENEOUS = importlib.util.find_spec("transformers.integrations.heterogeneity") is not None


@pytest.mark.skipif(not HETEROGENEOUS, reason="per-layer configs arrived after transformers 5.22")
def test_heterogeneous_per_layer_heads_are_a_model_config_error(tmp_path: Path) -> None:
    config = {**_llama().to_dict(), "per_layer_config": {"1": {"num_attention_heads": 2, "num_key_value_heads": 1}}}  # type: ignore[attr-defined]
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    # Before: transformers' AmbiguousGlobalPerLayerAttributeError, "please report it".
    with pytest.raises(ModelConfigError, match="per_layer_config gives layers different values"):
        cudaload.plan(str(tmp_path), machine=Machine.simulated("A100"))


def _whisper() -> object:
    from transformers import WhisperConfig

    return WhisperConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=100, num_mel_bins=8, max_source_positions=16,
        max_target_positions=16, pad_token_id=1, bos_token_id=1, eos_token_id=1, decoder_start_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None, architectures=["WhisperForConditionalGeneration"],
    )  # fmt: skip


def _llava() -> object:
    from transformers import LlavaConfig

    text = {**_llama().to_dict(), "num_hidden_layers": 1}  # type: ignore[attr-defined]
    vision = dict(
        model_type="clip_vision_model", hidden_size=32, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, image_size=16, patch_size=8,
    )  # fmt: skip
    return LlavaConfig(text_config=text, vision_config=vision, architectures=["LlavaForConditionalGeneration"])


@pytest.mark.parametrize(("name", "build"), [("whisper", _whisper), ("llava", _llava)])
def test_speech_and_image_text_models_are_not_said_to_not_generate(tmp_path: Path, name: str, build: object) -> None:
    folder = _config_folder(tmp_path, name, build())  # type: ignore[operator]
    with pytest.raises(ModelConfigError) as refused:
        cudaload.plan(folder, generate=True)
    # Before: "AutoModelForImageTextToText does not generate" (false: both generate).
    assert "does not generate" not in str(refused.value)
    assert "ForConditionalGeneration generates, but cudaload plans generate()" in str(refused.value)
    assert "plan it without generate=True" in str(refused.value)


def test_a_simulated_torch_transformers_disables_is_refused() -> None:
    # Before: torch 1.0 planned with SDPA (which arrived in torch 2.0; transformers 5 needs torch >= 2.6).
    with pytest.raises(SettingError, match=r"torch 1.0.0 with transformers 5.22.2: .* older than 2.6.0"):
        Machine.simulated("A100", packages={"torch": "1.0.0", "transformers": "5.22.2"})
    assert Machine.simulated("A100", packages={"torch": "2.6.0"}).software.version("torch") == "2.6.0"


# --- cache --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["~", "~/", "HOME"])
def test_the_home_folder_itself_is_no_cache(tmp_path: Path, value: str) -> None:
    env = {"HOME": str(tmp_path), "CUDALOAD_CACHE": str(tmp_path) if value == "HOME" else value}
    # Before: the home folder itself, where cudaload made its folders among the user's files.
    with pytest.raises(SettingError, match=r"is your home folder itself .* CUDALOAD_CACHE=~/.cache/cudaload"):
        cache.cache_dir(env)
    assert cache.cache_dir({**env, "CUDALOAD_CACHE": "~/c"}) == tmp_path / "c"


def test_a_cache_cudaload_does_not_read_is_not_written_either(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As root against another user's cache (or any cache others can write): refused for reading, and before,
    # written anyway: folders (root-owned) made in it and the record planted where it is never read.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(cache, "_refused", set())
    with pytest.warns(CudaloadWarning, match="does not read its cache"):
        assert cache.write_json(shared / "probes" / "x.json", {"a": 1}) is False
    assert list(shared.iterdir()) == []


def test_a_path_longer_than_the_file_system_takes_is_said(tmp_path: Path) -> None:
    too_long = str(tmp_path / "/".join(["a" * 200] * 23))  # ~4.6k characters, over PATH_MAX
    with pytest.raises(ModelConfigError, match=r"characters, its longest name 200\) is longer than this file system"):
        cudaload.plan(too_long)  # before: "no such folder", as if a typo
    with pytest.raises(ModelConfigError, match="its longest name 300"):
        cudaload.plan(str(tmp_path / ("b" * 300)))


def test_the_bench_s_built_in_model_folder_is_checked_before_it_is_reused(tmp_path: Path) -> None:
    from cudaload.bench.models import BUILT_IN, BUILT_MARKER, resolve_model

    target = tmp_path / "qwen3-quick"
    built = Path(resolve_model(None, tmp_path, quick=True, random_weights=True).path)
    assert built == target and (target / BUILT_MARKER).is_file()
    weights = target / "model.safetensors"
    first = weights.stat().st_mtime_ns
    assert Path(resolve_model(None, tmp_path, quick=True, random_weights=True).path) == target
    assert weights.stat().st_mtime_ns == first  # the same shape, whole: reused

    # Before: any folder with a config.json was reused, whatever its shape or content.
    marker = json.loads((target / BUILT_MARKER).read_text(encoding="utf-8"))
    (target / BUILT_MARKER).write_text(json.dumps({**marker, "hidden_size": 999}), encoding="utf-8")
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 999}), encoding="utf-8")
    resolve_model(None, tmp_path, quick=True, random_weights=True)
    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    assert (config["model_type"], config["hidden_size"]) == ("qwen3", BUILT_IN["quick"].hidden_size)
    weights.unlink()  # an unfinished or damaged build: rebuilt
    resolve_model(None, tmp_path, quick=True, random_weights=True)
    assert weights.is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["qwen3-quick"]  # no staging folder left

    foreign = tmp_path / "other" / "qwen3-quick"
    foreign.mkdir(parents=True)
    (foreign / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(SettingError, match=f"cudaload did not build there \\(no {BUILT_MARKER}\\)"):
        resolve_model(None, tmp_path / "other", quick=True, random_weights=True)
    assert [p.name for p in foreign.iterdir()] == ["config.json"]
