"""The accelerate launch: a config serialized with `yaml.safe_dump` in the keys of accelerate 1.16
`commands/config/config_args.py` `ClusterConfig` (for FSDP2, `utils/dataclasses.py`
`FullyShardedDataParallelPlugin`: fsdp_version, fsdp_reshard_after_forward, fsdp_auto_wrap_policy,
fsdp_transformer_layer_cls_to_wrap, fsdp_cpu_ram_efficient_loading, fsdp_state_dict_type; hybrid shard and tensor
parallel through `parallelism_config`, `parallelism_config.py` `ParallelismConfig`), and the script that runs
`accelerate launch` with it on each node.

A CPU plan's launch: accelerate 1.16 `commands/launch.py` `launch_command` starts several processes only through
torchrun (`multi_gpu_launcher`, for MULTI_GPU, FSDP, DeepSpeed) or mpirun (`simple_launcher` with
--mpirun_hostfile); a MULTI_CPU config without mpirun starts one process. So a CPU plan keeps the torchrun
launcher, says `use_cpu: true`, and its script exports ACCELERATE_USE_CPU=true, which `multi_gpu_launcher` does
not set and `state.py` `AcceleratorState` reads: every rank's `Accelerator()` is then MULTI_CPU on gloo (measured
2026-12-06, accelerate 1.16.0, 2 ranks: without it each rank's Accelerator() ran alone, DistributedType.NO)."""

from __future__ import annotations

import json
from typing import Any

from ..plans import Plan
from .job import HERE, LAUNCH_ENV, Job, Word, shell_line
from .torchrun import deepspeed_exports

__all__ = ["accelerate_config", "accelerate_files"]

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}
DS_CONFIG = "ds_config.json"


def wrap_classes(model_class: str) -> list[str] | None:
    """The model's `_no_split_modules` (its decoder layer classes), what FSDP wraps one by one; None when
    transformers has no such class (accelerate then reads `_no_split_modules` from the model itself)."""
    import transformers

    cls = getattr(transformers, model_class, None)
    names = getattr(cls, "_no_split_modules", None)
    return [str(n) for n in names] if names else None


def accelerate_config(plan: Plan, job: Job, wrap: list[str] | None) -> dict[str, Any]:
    """The accelerate config (`ClusterConfig`'s keys) for the planned strategy."""
    strategy = job.strategy
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        # One process: accelerate 1.16 `_validate_launch_command` refuses MULTI_GPU below 2 processes.
        "distributed_type": "MULTI_GPU" if job.nodes * job.ranks > 1 else "NO",
        "mixed_precision": _DTYPES.get(plan.dtype, "no"),
        "num_machines": job.nodes,
        "num_processes": job.nodes * job.ranks,
        "machine_rank": 0,
        "main_process_port": job.port,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": not job.gpus,
    }
    # accelerate reads the YAML as is (no $VARIABLES): an address from the environment goes on the command line.
    if job.nodes > 1 and job.address_variable is None:
        config["main_process_ip"] = job.address
    if strategy.startswith("deepspeed"):
        config["distributed_type"] = "DEEPSPEED"
        # The precision is ds_config.json's ("auto": TrainingArguments' bf16/fp16): accelerate 1.16
        # `DeepSpeedPlugin._deepspeed_config_checks` refuses mixed_precision beside deepspeed_config_file.
        del config["mixed_precision"]
        # DeepSpeed picks its own accelerator (a CPU plan's script exports DS_ACCELERATOR=cpu); use_cpu would make
        # every rank's AcceleratorState MULTI_CPU, and Trainer would run DDP instead (seen: accelerate 1.16.0).
        config["use_cpu"] = False
        config["deepspeed_config"] = {
            # Read from the working directory: accelerate-launch.sh passes the one beside it
            # (--deepspeed_config_file, which wins over the YAML's: `_validate_launch_command`).
            "deepspeed_config_file": DS_CONFIG,
            "deepspeed_multinode_launcher": "standard",
        }
    elif strategy in ("fsdp", "fsdp-hybrid", "tp+fsdp"):
        config["distributed_type"] = "FSDP"
        fsdp: dict[str, Any] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_offload_params": False,
            "fsdp_activation_checkpointing": False,
        }
        if wrap:
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = ",".join(wrap)
        config["fsdp_config"] = fsdp
        if strategy == "fsdp-hybrid":
            config["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": job.nodes,
                "parallelism_config_dp_shard_size": job.ranks,
            }
        elif strategy == "tp+fsdp":
            config["parallelism_config"] = {
                "parallelism_config_dp_shard_size": job.nodes,
                "parallelism_config_tp_size": job.ranks,
            }
    return config


def accelerate_argv(job: Job) -> list[str]:
    """`accelerate launch`'s argv in accelerate-launch.sh (shell words for the config path and NODE_RANK)."""
    here = HERE[:-1]  # the folder expression, still inside its double quotes
    main = ["--main_process_ip", job.address_word()] if job.nodes > 1 and job.address_variable else []
    # The DeepSpeed config beside this script, whatever the working directory.
    ds = ["--deepspeed_config_file", Word(f'{here}/{DS_CONFIG}"')] if job.strategy.startswith("deepspeed") else []
    return [
        "accelerate", "launch", "--config_file", Word(f'{here}/accelerate-config.yaml"'), *ds,
        "--machine_rank", Word('"${NODE_RANK:-0}"'), *main, *job.command_tail(),
    ]  # fmt: skip


def _script(job: Job) -> str:
    deepspeed = job.strategy.startswith("deepspeed")
    lines = [
        "#!/usr/bin/env bash",
        f"# Run on each of the {job.nodes} node(s) with NODE_RANK set (0 on the main node).",
        "set -euo pipefail",
        f"export {LAUNCH_ENV}={shell_line([job.manifest_word(HERE)])}",
        *(
            []
            if job.gpus or deepspeed
            else ["export ACCELERATE_USE_CPU=true  # every rank's Accelerator() on the CPU (gloo)"]
        ),
        *deepspeed_exports(job.strategy, job.gpus),
        f"exec {shell_line(accelerate_argv(job))}",
        "",
    ]
    return "\n".join(lines)


def accelerate_files(plan: Plan, job: Job) -> dict[str, str]:
    """accelerate-config.yaml and accelerate-launch.sh."""
    import yaml  # PyYAML: a dependency of accelerate and transformers

    config = accelerate_config(plan, job, wrap_classes(plan.model_class))
    # The model name may hold anything: json.dumps makes it one escaped line of the comment.
    head = f"# accelerate launch --config_file this; planned by cudaload for {json.dumps(plan.model)}: {job.strategy}\n"
    return {
        "accelerate-config.yaml": head + yaml.safe_dump(config, sort_keys=False, allow_unicode=False),
        "accelerate-launch.sh": _script(job),
    }
