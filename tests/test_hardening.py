"""Bad input and broken machines get a cudaload error or a recorded, warned plan: never a foreign
exception, never a silently changed setting. Facts are passed in; no mocks."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import cudaload
from cudaload import Machine, ModelConfigError, PlacementError, SettingError
from cudaload.capability.launch import read_launch
from cudaload.cli import main
from cudaload.demo import build_tiny_model
from cudaload.facts.model import any_model
from cudaload.policy import Request, decide_plan

MODEL = replace(any_model(), parameters=1_000_000, hidden_size=64, num_layers=2, vocab_size=256)


def plan_for(machine: Machine, **request):
    return decide_plan(machine, MODEL, Request(**request))


def _with_software(machine: Machine, **software: object) -> Machine:
    """`machine` with other software, and the usable-GPU fact detect() would find for it."""
    from cudaload.capability.usable_gpus import gpus_unusable

    changed = replace(machine, software=replace(machine.software, **software), source="nvml")
    return replace(changed, gpus_unusable=gpus_unusable(changed.gpus, changed.software))


def test_gpus_a_cpu_only_torch_cannot_drive_are_planned_around_loudly() -> None:
    a100 = Machine.simulated("A100")
    cpu_torch = _with_software(a100, torch_cuda=None)
    plan = plan_for(cpu_torch)
    assert plan.kwargs["device_map"] == "cpu"
    (warning,) = [w for w in plan.warnings if "CPU-only build" in w]
    assert "NVIDIA A100" in warning and "install a CUDA build of torch" in warning
    # An explicit GPU placement on that machine is refused, not passed on to fail inside torch.
    with pytest.raises(PlacementError, match="sees no CUDA GPU"):
        plan_for(cpu_torch, device_map="cuda:0")


def test_a_torch_cuda_build_newer_than_the_driver_is_planned_around() -> None:
    a100 = Machine.simulated("A100")
    old_driver = _with_software(a100, torch_cuda="12.8", driver="470.82.01")
    plan = plan_for(old_driver)
    assert plan.kwargs["device_map"] == "cpu"
    assert any("needs NVIDIA driver >= 525.60.13, and this machine has 470.82.01" in w for w in plan.warnings)
    fine = _with_software(a100, torch_cuda="12.8", driver="550.54.15")
    assert plan_for(fine).kwargs["device_map"] == "cuda:0"


def test_which_gpus_torch_can_drive_is_found_once_by_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    import cudaload.capability as capability
    from cudaload.capability.usable_gpus import gpus_unusable
    from cudaload.cli.doctor_command import doctor_report
    from test_detection import A100, FakeProbe, node

    calls: list[object] = []

    def counted(*args: object) -> str | None:
        calls.append(args)
        return gpus_unusable(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(capability, "gpus_unusable", counted)
    machine = capability.detect_uncached(env={}, probes=(lambda: FakeProbe(node(A100)),))
    assert len(calls) == 1 and len(machine.gpus) == 1
    # The planner, the policy and the CLI read the fact; none works it out again.
    plan_for(machine)
    doctor_report(machine, as_json=False)
    assert len(calls) == 1
    # A fact says so, not the software: the same machine told its GPUs are usable plans for them.
    told = replace(machine, software=replace(machine.software, torch_cuda=None), gpus_unusable=None)
    assert plan_for(told).kwargs["device_map"] == "cuda:0"


@pytest.mark.parametrize("device_map", ["cuda:5", 5, {"": 5}, torch.device("cuda", 5), {"model": "cuda:1"}])
def test_a_device_map_naming_a_gpu_this_process_does_not_see_is_refused(device_map) -> None:
    with pytest.raises(PlacementError, match=r"names cuda:\d, but this process sees 1 GPU"):
        plan_for(Machine.simulated("A100"), device_map=device_map)


@pytest.mark.parametrize("device_map", [{"": 0}, 0, "cuda", torch.device("cuda")])
def test_a_gpu_device_map_on_a_cpu_machine_is_refused(device_map) -> None:
    asked = "cuda:0, but this process sees no CUDA GPU. Use a visible device, 'cpu', or leave it unset"
    with pytest.raises(PlacementError, match=re.escape(asked)):
        plan_for(Machine.simulated(None), device_map=device_map)


DEVICES = "use 'cpu', 'disk', 'cuda:N' or an int N"


@pytest.mark.parametrize(
    ("device_map", "message"),
    [
        # what was asked, then what to pass instead
        (
            "gpu",
            f"device_map='gpu' is not a device (torch has no 'gpu' device: the first GPU is 'cuda:0', or 0): {DEVICES}",
        ),
        (-1, "device_map=-1: a GPU index is 0 or more"),
        ({"": "cuda:x"}, f"device_map['']='cuda:x' is not a device: {DEVICES}"),
        (1.5, "device_map=1.5 (float) is not a device map: pass 'auto', a device ('cpu', 'cuda:0', 0) or a dict"),
        ({}, "device_map={} places nothing: leave it unset, or map modules to devices"),
        (True, "device_map=True: a device is 'cpu', 'disk', 'cuda:N' or an int N"),
    ],
)
def test_a_malformed_device_map_is_refused(device_map, message) -> None:
    with pytest.raises(PlacementError, match=re.escape(message)):
        plan_for(Machine.simulated("A100"), device_map=device_map)


@pytest.mark.parametrize("device_map", ["cpu", "auto", {"": "cpu"}, {"model": 0, "lm_head": "cpu"}, "cuda:0", 0])
def test_valid_device_maps_are_honoured_exactly(device_map) -> None:
    plan = plan_for(Machine.simulated("A100"), device_map=device_map)
    assert plan.kwargs["device_map"] == device_map and plan.decision("device_map").source == "user"


@pytest.mark.parametrize(
    ("name", "value"), [("use_kernels", 1), ("use_kernels", "yes"), ("trust_remote_code", "False")]
)
def test_flags_must_be_real_booleans(tiny_models, name, value) -> None:
    with pytest.raises(SettingError, match=f"{name}={value!r}"):
        cudaload.plan(str(tiny_models["qwen3"]), machine=Machine.simulated(None), **{name: value})


def test_a_non_string_attention_is_a_setting_error(tiny_models) -> None:
    with pytest.raises(SettingError, match="attn_implementation=2"):
        cudaload.plan(str(tiny_models["qwen3"]), machine=Machine.simulated(None), attn_implementation=2)


@pytest.mark.parametrize("model", [None, 123, "", b"bytes"])
def test_inputs_that_are_not_models_are_refused_before_any_lookup(model) -> None:
    with pytest.raises(ModelConfigError, match="plan\\(\\)"):
        cudaload.plan(model, machine=Machine.simulated(None))


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK='-1'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "abc"}, "LOCAL_RANK='abc'"),
        ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 is not below WORLD_SIZE=2"),
    ],
)
def test_invalid_launch_variables_are_refused_with_their_names(env, problem) -> None:
    launch = read_launch(env)
    assert any(problem in p for p in launch.problems)
    with pytest.raises(PlacementError, match="launch variables are invalid"):
        plan_for(Machine.simulated("A100", count=2, launch=launch))


def test_a_valid_launch_has_no_problems() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    launch = read_launch(env)  # torchrun sets LOCAL_WORLD_SIZE too
    assert launch.problems == () and launch.local_rank == 1
    assert plan_for(Machine.simulated("A100", count=2, launch=launch)).kwargs["device_map"] == {"": 1}


@pytest.mark.parametrize("count", ["0", "-1"])
def test_cli_count_must_be_positive(count, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "x", "--gpu", "T4", "--count", count])
    assert exit_info.value.code == 2 and "at least one GPU" in capsys.readouterr().err


def test_demo_never_writes_into_a_folder_it_did_not_make(tmp_path: Path) -> None:
    theirs = tmp_path / "my-model"
    theirs.mkdir()
    (theirs / "model.safetensors").write_bytes(b"precious")
    with pytest.raises(SettingError, match="never writes into a folder it did not make"):
        build_tiny_model(theirs)
    assert (theirs / "model.safetensors").read_bytes() == b"precious"
    ours = build_tiny_model(tmp_path / "fresh")
    assert build_tiny_model(ours) == ours  # built once, then reused
    assert main(["demo", "--tiny", "--dir", str(theirs)]) == 2


def test_demo_refuses_a_folder_it_would_not_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the real model installed, --dir (the tiny model's folder) would be dropped: refused instead."""
    from cudaload import smollm2

    if smollm2.missing():
        pytest.skip(f"the real model is not installed here: {smollm2.missing()}")
    assert main(["demo", "--dir", str(tmp_path / "mine")]) == 2
    err = capsys.readouterr().err
    assert "Add --tiny" in err and "cudaload's cache" in err
    assert not (tmp_path / "mine").exists()


def test_doctor_flags_gpus_this_torch_cannot_use() -> None:
    from cudaload.cli.doctor_command import doctor_report

    cpu_torch = _with_software(Machine.simulated("A100"), torch_cuda=None)
    report = doctor_report(cpu_torch, as_json=False)
    warnings = " ".join(report.split("Warnings:")[1].split())  # as read, whatever the terminal wrapped
    assert "CPU-only build: planned for the CPU" in warnings
    assert "attention: sdpa -> eager" in report  # what you get here is the CPU's, not the A100's


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_broken_checkpoints_are_load_errors_that_name_the_cause(tiny_models, tmp_path: Path) -> None:
    from cudaload import LoadFailedError

    no_weights = _copy(tiny_models["llama"], tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(LoadFailedError, match=r"a config\.json without weights"):
        cudaload.load(str(no_weights))

    truncated = _copy(tiny_models["llama"], tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(LoadFailedError, match="truncated or corrupt"):
        cudaload.load(str(truncated))

    import json

    mismatch = _copy(tiny_models["llama"], tmp_path / "mismatch")
    config = json.loads((mismatch / "config.json").read_text())
    (mismatch / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(LoadFailedError, match=r"shapes disagree with its config\.json"):
        cudaload.load(str(mismatch))


RANK = "the LoRA rank is a positive integer (e.g. 8, 16, 64)"


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"r": 0}, f"lora r=0: {RANK}"),
        ({"r": "8"}, f"lora r='8': {RANK}"),
        ({"r": True}, f"lora r=True: {RANK}"),
        ({"lora_alpha": -1}, "lora lora_alpha=-1: a positive number"),
        ({"lora_dropout": 1.5}, "lora lora_dropout=1.5: a probability in [0, 1)"),
        ({"lora_dropout": "0.1"}, "lora lora_dropout='0.1': a probability in [0, 1)"),
        (["r", 8], "lora=['r', 8]: pass a dict of LoraConfig arguments"),
    ],
)
def test_lora_numbers_are_checked_before_the_base_model_loads(tiny_models, lora, message) -> None:
    from cudaload import FinetuneConfigError

    with pytest.raises(FinetuneConfigError, match=re.escape(message)):
        cudaload.plan(str(tiny_models["qwen3"]), machine=Machine.simulated(None), finetune=True, lora=lora)


A_DICT = "pass a dict of device -> size, e.g. {0: '20GiB', 'cpu': '64GiB'}"
A_SIZE = "a size is a number of bytes or a string like '20GiB' or '500MB'"


@pytest.mark.parametrize(
    ("max_memory", "message"),
    [
        ({}, f"max_memory={{}}: {A_DICT}"),
        ("20GiB", f"max_memory='20GiB': {A_DICT}"),
        ({0: "lots"}, f"max_memory[0]='lots': {A_SIZE}"),
        ({0: -5}, f"max_memory[0]=-5: {A_SIZE}"),
        ({5: "10GiB"}, "max_memory key=5 names cuda:5, but this process sees 1 GPU(s) (cuda:0..cuda:0). Use a visible"),
        ({"gpu": "1GiB"}, "max_memory key='gpu' is not a device"),
    ],
)
def test_malformed_max_memory_is_refused(max_memory, message) -> None:
    with pytest.raises(PlacementError, match=re.escape(message)):
        plan_for(Machine.simulated("A100"), max_memory=max_memory)


def test_valid_max_memory_is_honoured() -> None:
    plan = plan_for(Machine.simulated("A100"), max_memory={0: "20GiB", "cpu": 2**34})
    assert plan.kwargs["max_memory"] == {0: "20GiB", "cpu": 2**34}


def test_doctor_json_has_lists_not_python_reprs() -> None:
    import json

    from cudaload.cli.doctor_command import doctor_report

    report = json.loads(doctor_report(Machine.simulated(None, cpu_flags=("avx2", "avx512f")), as_json=True))
    assert report["machine"]["cpu"]["flags"] == ["avx2", "avx512f"]
    assert "frozenset" not in json.dumps(report)


def test_nan_weights_are_not_blamed_on_attention(tiny_models, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from cudaload import LoadFailedError

    broken = _copy(tiny_models["llama"], tmp_path / "nan")
    weights = load_file(broken / "model.safetensors")
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], float("nan"))
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LoadFailedError, match=r"every attention option .* gave non-finite logits .* not attention"):
        cudaload.load(str(broken))


def test_an_nvml_binding_failing_with_a_foreign_error_is_a_note_not_a_crash() -> None:
    from cudaload.capability.gpus import probe_gpus

    class Broken:
        name = "nvml"

        def __init__(self) -> None:
            raise OSError("libnvidia-ml.so.1: wrong ELF class")

    report = probe_gpus({}, [Broken])
    assert report.gpus == () and "failed unexpectedly: OSError: libnvidia-ml.so.1" in report.notes[0]


def test_malformed_cli_versions_are_usage_errors(capsys) -> None:
    for spec in ("flash-attn==abc", "==2.8.3", "flash-attn"):
        with pytest.raises(SystemExit) as exit_info:
            main(["plan", "x", "--gpu", "A100", "--with", spec])
        assert exit_info.value.code == 2 and "--with" in capsys.readouterr().err


def test_messages_describe_the_real_cause(tiny_models, tmp_path: Path) -> None:
    from cudaload import DtypeUnsupportedError

    # dtype="auto" on a T4 with a bf16 checkpoint: say "auto", not "bfloat16 was asked".
    with pytest.raises(DtypeUnsupportedError, match="dtype='auto' means the checkpoint's bfloat16"):
        cudaload.plan(str(tiny_models["qwen3"]), machine=Machine.simulated("T4"), dtype="auto")
    # A local folder with a broken config.json is not "offline or a wrong id".
    folder = tmp_path / "bad-config"
    folder.mkdir()
    (folder / "config.json").write_text("")
    with pytest.raises(
        ModelConfigError,
        match=re.escape(f"'{folder}' is a local folder, but its config.json is missing or unreadable: ")
        + r"[\s\S]*"
        + re.escape("Save the model there with save_pretrained(), or pass the folder that holds config.json."),
    ) as info:
        cudaload.plan(str(folder), machine=Machine.simulated(None))
    assert "offline" not in str(info.value)


def test_a_gptq_checkpoint_without_its_package_names_the_package(tiny_models, tmp_path: Path) -> None:
    import json

    from cudaload import LoadFailedError

    gptq = _copy(tiny_models["llama"], tmp_path / "gptq")
    config = json.loads((gptq / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
    (gptq / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadFailedError, match=r"requires optimum .* needs a package that is not installed"):
        cudaload.load(str(gptq))
