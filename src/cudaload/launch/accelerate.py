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


_YAML_KEYS = {
    "version": "fsdp_version",
    "reshard_after_forward": "fsdp_reshard_after_forward",
    "auto_wrap_policy": "fsdp_auto_wrap_policy",
    "cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "state_dict_type": "fsdp_state_dict_type",
    "cpu_offload": "fsdp_offload_params",
    "activation_checkpointing": "fsdp_activation_checkpointing",
}
"""The plan's `fsdp_config` keys (TrainingArguments') and the YAML's (accelerate 1.16 `ClusterConfig.fsdp_config`,
read by `launch_command` into the FSDP_* variables `FullyShardedDataParallelPlugin` reads)."""
_TP_FSDP = {
    "version": 2, "reshard_after_forward": True, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "cpu_ram_efficient_loading": True, "state_dict_type": "SHARDED_STATE_DICT", "cpu_offload": False,
    "activation_checkpointing": False,
}  # fmt: skip
"""tp+fsdp's (no TrainingArguments of its own: its ranks are sharded at load time)."""


def fsdp_yaml(planned: dict[str, Any], wrap: list[str] | None) -> dict[str, Any]:
    """The YAML's fsdp_config from the plan's `fsdp_config`: the same values under accelerate's names."""
    fsdp = {_YAML_KEYS[key]: value for key, value in planned.items() if key in _YAML_KEYS}
    classes = planned.get("transformer_layer_cls_to_wrap") or wrap
    if classes:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = ",".join(classes)
    return fsdp


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
        planned = plan.finetune.training_arguments if plan.finetune is not None else {}
        config["fsdp_config"] = fsdp_yaml(planned.get("fsdp_config") or _TP_FSDP, wrap)
        mesh = planned.get("parallelism_config")
        if mesh:  # hybrid shard: the plan's mesh, as TrainingArguments gets it
            config["parallelism_config"] = {f"parallelism_config_{key}": value for key, value in mesh.items()}
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
