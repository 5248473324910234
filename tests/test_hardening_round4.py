"""Hardening, round 4 (issue 28): a user's choices are applied or refused, never shown and then dropped.
Real tiny models saved locally; no mocks."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

import cudaload
from cudaload import PlacementError, SettingError
from cudaload.capability.visible import RawDevice, visible_gpus

H100 = cudaload.Machine.simulated("H100")


@pytest.mark.parametrize("value", ["no", 1, "False"])
def test_gradient_checkpointing_must_be_a_real_bool(tiny_models: dict[str, Path], value: object) -> None:
    # Before: "no" is truthy, so plan() accepted it and load_for_finetune() turned checkpointing on.
    with pytest.raises(SettingError, match=r"gradient_checkpointing=.*pass True or False"):
        cudaload.plan(tiny_models["qwen3"], machine=H100, finetune=True, gradient_checkpointing=value)


@pytest.mark.parametrize("flag", ["strict", "allow_missing_weights"])
def test_load_for_finetune_flags_must_be_real_bools(tiny_models: dict[str, Path], flag: str) -> None:
    with pytest.raises(SettingError, match=rf"{flag}='yes' \(str\)"):
        cudaload.load_for_finetune(tiny_models["qwen3"], quantize=None, **{flag: "yes"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("seq_len", -100000),
        ("seq_len", 0),
        ("batch_size", -3),
        ("batch_size", 0),
        ("batch_size", True),
        ("batch_size", 2048.5),
        ("seq_len", "2048"),
    ],
)
def test_seq_len_and_batch_size_are_positive_whole_numbers(
    tiny_models: dict[str, Path], name: str, value: object
) -> None:
    # Before: seq_len=-100000 gave a memory estimate of -33.8 GiB that "fits"; batch_size=True/2048.5 passed.
    with pytest.raises(SettingError, match=rf"{name}=.*whole number of at least 1"):
        cudaload.plan(tiny_models["qwen3"], machine=H100, finetune=True, **{name: value})


def test_plan_kwargs_are_read_only_and_the_plan_keeps_its_value(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(tiny_models["qwen3"], machine=H100, max_memory={0: "10GiB"})
    before = plan.to_json()
    # Before: this changed a frozen Plan and load() applied part of it while explain() kept the old value.
    with pytest.raises(TypeError, match="read-only"):
        plan.kwargs["dtype"] = "float16"  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        plan.kwargs["max_memory"][0] = "1GiB"
    with pytest.raises(TypeError, match="read-only"):
        plan.kwargs.update(dtype="float16")  # type: ignore[attr-defined]
    assert plan.to_json() == before
    assert json.loads(plan.to_json())["kwargs"]["max_memory"] == {"0": "10GiB"}
    for copied in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        assert copied == plan and hash(copied) == hash(plan)
    # What from_pretrained receives is a plain copy: accelerate converts max_memory's sizes in place.
    kwargs = cudaload.from_pretrained_kwargs(plan)
    kwargs["max_memory"][0] = 1
    assert plan.kwargs["max_memory"] == {0: "10GiB"}


@pytest.mark.parametrize("device_map", ["meta", {"": "meta"}, {"model": "cpu", "lm_head": "meta"}])
def test_device_map_meta_is_refused_at_plan_time(tiny_models: dict[str, Path], device_map: object) -> None:
    # Before: plan() accepted it and load() failed with a raw RuntimeError from the test forward.
    with pytest.raises(PlacementError, match="'meta' loads no weights"):
        cudaload.plan(tiny_models["qwen3"], device_map=device_map)


@pytest.mark.parametrize("device_map", ["disk", {"": "disk"}])
def test_device_map_all_on_disk_is_refused_at_plan_time(tiny_models: dict[str, Path], device_map: object) -> None:
    # Before: plan() accepted it and the load failed inside transformers.
    with pytest.raises(PlacementError, match="every weight on disk"):
        cudaload.plan(tiny_models["qwen3"], device_map=device_map)


A100 = dict(name="NVIDIA A100-SXM4-80GB", capability=(8, 0), total_memory=80 * 2**30, multiprocessors=108)


@pytest.mark.parametrize(("visible", "repeated"), [("0,0", "0"), ("1,0,1", "1"), ("GPU-0aaa0,GPU-0aaa0", "GPU-0aaa0")])
def test_a_repeated_cuda_visible_device_is_said(visible: str, repeated: str) -> None:
    raw = [
        RawDevice(nvml_index=i, uuid=f"GPU-{i}aaa{i}-0000", pci_bus_id=f"0000:{i + 1:02X}:00.0", **A100) for i in (0, 1)
    ]
    gpus, warnings = visible_gpus(raw, visible, "PCI_BUS_ID")
    # CUDA (and torch.cuda._parse_visible_devices) shows no GPU when a device repeats; before, silently.
    assert gpus == ()
    assert any(f"names device {repeated} twice" in w and "no GPU at all" in w for w in warnings)


def test_an_invalid_cuda_visible_entry_is_not_called_a_repeat() -> None:
    raw = [RawDevice(nvml_index=0, uuid="GPU-0aaa0-0000", pci_bus_id="0000:01:00.0", **A100)]
    _, warnings = visible_gpus(raw, "x,0,0", "PCI_BUS_ID")
    assert not any("twice" in w for w in warnings)
