"""A ZeRO plan's DeepSpeed config, planned as the `training.deepspeed` decision (no deepspeed needed to plan it),
and the loader's ZeRO-3 preconditions. What the engines make of the config: tests/test_launch_deepspeed*.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import cudaload
from cudaload.errors import MissingPackageError, PlacementError
from cudaload.loaders import zero3_loading as loading
from cudaload.policy.engine_deepspeed import deepspeed_config, zero_stage

H100x2 = cudaload.Machine.simulated("H100", count=2)


def _plan(model: Path, strategy: str) -> cudaload.LaunchFiles:
    return cudaload.launch_files(
        model, machine=H100x2, nodes=2, ranks_per_node=2, parallelism=strategy, quantize=None, script="train.py"
    )


@pytest.mark.parametrize(
    ("strategy", "stage"),
    [("deepspeed-zero1", 1), ("deepspeed-zero2", 2), ("deepspeed-zero3", 3), ("deepspeed-zero3-offload", 3)],
)
def test_the_stage_is_the_digit_after_the_name(strategy: str, stage: int) -> None:
    assert zero_stage(strategy) == stage
    assert deepspeed_config(strategy)["zero_optimization"]["stage"] == stage


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed", "deepspeed-zero"])
def test_no_stage_for_another_name(strategy: str) -> None:
    with pytest.raises(ValueError, match="not a DeepSpeed ZeRO strategy"):
        zero_stage(strategy)


@pytest.mark.parametrize("strategy", ["deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero3-offload"])
def test_the_plan_and_the_file_hold_one_config(tiny_models: dict[str, Path], strategy: str) -> None:
    """`training.deepspeed` is shown, `training_arguments()` returns it, ds_config.json holds it; Trainer fills
    every value it would otherwise disagree with ("auto"), and the reduce buckets stay DeepSpeed's defaults."""
    files = _plan(tiny_models["llama"], strategy)
    shown = files.plan.decision("training.deepspeed").value
    assert cudaload.training_arguments(files.plan)["deepspeed"] == shown == json.loads(files.files["ds_config.json"])
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        assert shown[key] == "auto"
    assert shown["bf16"] == shown["fp16"] == {"enabled": "auto"}
    assert not {"reduce_bucket_size", "allgather_bucket_size"} & set(shown["zero_optimization"])
    assert ("offload_optimizer" in shown["zero_optimization"]) == strategy.endswith("-offload")
    assert shown.get("zero_force_ds_cpu_optimizer", True) is not strategy.endswith("-offload")


def test_the_accelerate_yaml_leaves_precision_to_the_deepspeed_config(tiny_models: dict[str, Path]) -> None:
    import yaml

    config = yaml.safe_load(_plan(tiny_models["llama"], "deepspeed-zero3").files["accelerate-config.yaml"])
    assert config["distributed_type"] == "DEEPSPEED" and "mixed_precision" not in config


def test_zero3_loading_needs_a_launch_and_no_device_map(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tiny_models["llama"], "deepspeed-zero3").plan
    assert loading.zero3_loading(plan, {"WORLD_SIZE": "1"}) is None  # one process: nothing to partition over
    placed = replace(plan, kwargs={**plan.kwargs, "device_map": {"": 0}})
    with pytest.raises(PlacementError, match="ZeRO-3, which partitions the weights at load and takes no device_map"):
        loading.zero3_loading(placed, {"WORLD_SIZE": "4"})
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingPackageError, match="on this rank: install it with `pip install deepspeed`"):
        loading.zero3_loading(plan, {"WORLD_SIZE": "4"})
    assert loading.zero3_loading(_plan(tiny_models["llama"], "deepspeed-zero2").plan, {"WORLD_SIZE": "4"}) is None
