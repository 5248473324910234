"""FSDP2 planned as the engine takes it: `fsdp` / `fsdp_config` (and hybrid shard's `parallelism_config`) in the
plan's TrainingArguments, parsed by transformers' own TrainingArguments, and the accelerate YAML written from the
same values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import cudaload

H100 = cudaload.Machine.simulated("H100", count=8)
# TrainingArguments on this CPU machine refuses the H100 plan's bf16/tf32 and the fused optimizer: those flags are
# not what is tested here.
ON_CPU = {"bf16": False, "tf32": False, "optim": "adamw_torch", "use_cpu": True}


def _plan(model: Path, strategy: str) -> cudaload.Plan:
    return cudaload.plan(str(model), machine=H100, finetune=True, nodes=2, parallelism=strategy, quantize=None)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp-hybrid"])
def test_fsdp_plans_carry_the_engine_settings_transformers_parses(
    tiny_models: dict[str, Path], tmp_path: Path, strategy: str
) -> None:
    from transformers import TrainingArguments

    plan = _plan(tiny_models["llama"], strategy)
    assert plan.decision("parallelism").value == strategy
    args = cudaload.training_arguments(plan, output_dir=str(tmp_path), **ON_CPU)
    assert args["fsdp"] is True
    assert args["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    assert plan.decision("training.fsdp_config").value == args["fsdp_config"]
    parsed = TrainingArguments(**args)
    assert parsed.fsdp_plugin_args == {
        "fsdp_version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_cls_names_to_wrap": "LlamaDecoderLayer",
        "cpu_ram_efficient_loading": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        "activation_checkpointing": False,
        "reshard_after_forward": True,
    }
    # TrainingArguments normalizes the dict it is given in place: the plan's own stays as planned.
    assert "min_num_params" not in plan.finetune.training_arguments["fsdp_config"]
    mesh = parsed.parallelism_config
    if strategy == "fsdp-hybrid":
        assert (mesh.dp_replicate_size, mesh.dp_shard_size) == (2, 8)
    else:
        assert mesh is None


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp-hybrid"])
def test_the_accelerate_yaml_is_written_from_the_plans_values(tiny_models: dict[str, Path], strategy: str) -> None:
    files = cudaload.launch_files(
        str(tiny_models["qwen3"]), machine=H100, nodes=2, parallelism=strategy, quantize=None, emit=["accelerate"]
    )
    config = yaml.safe_load(files.files["accelerate-config.yaml"])
    planned = files.plan.finetune.training_arguments
    fsdp = planned["fsdp_config"]
    assert config["fsdp_config"] == {
        "fsdp_version": fsdp["version"],
        "fsdp_reshard_after_forward": fsdp["reshard_after_forward"],
        "fsdp_auto_wrap_policy": fsdp["auto_wrap_policy"],
        "fsdp_cpu_ram_efficient_loading": fsdp["cpu_ram_efficient_loading"],
        "fsdp_state_dict_type": fsdp["state_dict_type"],
        "fsdp_offload_params": fsdp["cpu_offload"],
        "fsdp_activation_checkpointing": fsdp["activation_checkpointing"],
        "fsdp_transformer_layer_cls_to_wrap": "Qwen3DecoderLayer",
    }
    if strategy == "fsdp-hybrid":
        assert config["parallelism_config"] == {
            "parallelism_config_dp_replicate_size": planned["parallelism_config"]["dp_replicate_size"],
            "parallelism_config_dp_shard_size": planned["parallelism_config"]["dp_shard_size"],
        }
    else:
        assert "parallelism_config" not in config


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp-hybrid"])
def test_a_torchrun_rank_of_an_fsdp_plan_loads_as_fsdp_loads(tiny_models: dict[str, Path], strategy: str) -> None:
    """torchrun names no engine (its "ddp" is a default): the plan's strategy places the rank, so an FSDP rank
    gets no device_map and no DDP flags, where it got the whole model on its GPU (`{"": LOCAL_RANK}`)."""
    launch = cudaload.Launch(
        launcher="torchrun", rank=3, local_rank=1, world_size=4, local_world_size=2, strategy="ddp"
    )
    machine = cudaload.Machine.simulated("H100", count=2, launch=launch)
    plan = cudaload.plan(str(tiny_models["llama"]), machine=machine, finetune=True, parallelism=strategy, quantize=None)
    assert plan.decision("parallelism").value == strategy
    assert plan.decision("device_map").value is None and "device_map" not in plan.kwargs
    assert "ddp_find_unused_parameters" not in plan.finetune.training_arguments
    assert plan.finetune.training_arguments["fsdp"] is True


def test_an_fsdp_rank_is_told_every_rank_reads_a_whole_copy_unless_load_for_finetune_loads_it() -> None:
    """transformers 5.22-5.25 reads the whole checkpoint on every FSDP rank, cpu_ram_efficient_loading included:
    creating TrainingArguments before loading (the old advice) changes nothing, so it is not given; what does is
    load_for_finetune(), whose ranks other than rank 0 read no weights (loaders/fsdp_loading.py)."""
    from cudaload.facts.model import reference_model  # a 16-bit model of billions of parameters

    launch = cudaload.Launch(
        launcher="accelerate", rank=0, local_rank=0, world_size=8, local_world_size=8, strategy="fsdp"
    )
    machine = cudaload.Machine.simulated("H100", count=8, launch=launch, cpu_memory_gib=16)
    plan = cudaload.plan(reference_model(), machine=machine)
    assert plan.decision("device_map").value is None
    (note,) = [w for w in plan.warnings if "CPU RAM" in w]
    assert "reads the whole checkpoint on every rank" in note and "Create TrainingArguments" not in note
    assert "unless loaded by load_for_finetune() (which builds the other ranks' model on the meta device)" in note
