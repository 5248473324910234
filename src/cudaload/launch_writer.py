"""Write the launch of a planned training job for the engines that run it: a torchrun command per node, an
accelerate config, a DeepSpeed config and an sbatch script, plus the plan they were written from
(`cudaload-launch.json`), which `load_for_finetune()` in every launched rank compares its own plan with
(launch_check.py).

Nothing here launches or communicates: torchrun, accelerate, DeepSpeed and SLURM do. The files follow the
engines' own formats: accelerate 1.16 `commands/config/config_args.py` `ClusterConfig` (and, for FSDP2,
`utils/dataclasses.py` `FullyShardedDataParallelPlugin`: fsdp_version, fsdp_reshard_after_forward,
fsdp_auto_wrap_policy, fsdp_transformer_layer_cls_to_wrap, fsdp_cpu_ram_efficient_loading,
fsdp_state_dict_type; hybrid shard and tensor parallel through `parallelism_config`,
`parallelism_config.py` `ParallelismConfig`), DeepSpeed's JSON config (deepspeed.ai/docs/config-json:
train_micro_batch_size_per_gpu, gradient_accumulation_steps, bf16/fp16, zero_optimization.stage,
offload_optimizer) and torch 2.13 `torch.distributed.run` options.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PlacementError, SettingError
from .facts.machine import Machine
from .plans import Plan

__all__ = [
    "EMITTERS",
    "LAUNCH_ENV",
    "MANIFEST",
    "LaunchFiles",
    "launch_files",
    "launch_invariants",
]

LAUNCH_ENV = "CUDALOAD_LAUNCH"
"""The variable every launched rank gets: the path of the manifest its plan must agree with."""
MANIFEST = "cudaload-launch.json"
EMITTERS = ("torchrun", "accelerate", "deepspeed", "slurm")
INVARIANT_SETTINGS = ("parallelism", "dtype", "attn_implementation", "quantize", "lora", "use_cache")
"""Decisions every rank must share with the plan made before the launch. The device (LOCAL_RANK's) and the
TrainingArguments flags a launcher sets for its rank differ by design and are not compared."""
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}


def launch_invariants(plan: Plan) -> dict[str, Any]:
    """The decisions of `plan` a launched rank must reach too, and the quantization config it loads with."""
    values = {d.setting: d.value for d in plan.decisions if d.setting in INVARIANT_SETTINGS}
    values.setdefault("parallelism", None)
    if "quantization_config" in plan.kwargs:
        values["quantization_config"] = plan.kwargs["quantization_config"]
    read_back: dict[str, Any] = json.loads(json.dumps(values, default=str))  # as JSON has it: lists, not tuples
    return read_back


@dataclass(frozen=True)
class LaunchFiles:
    """The launch of one planned job (`launch_files()`): file name -> text, and the plan it was written from.

    Attributes:
        plan: The fine-tuning plan the files launch (its "parallelism" decision is the strategy).
        manifest: What `cudaload-launch.json` holds: the layout, the link, and the decisions every rank must
            reach too.
        files: File name -> text (scripts, configs, the manifest); `write(folder)` writes them.
    """

    plan: Plan
    manifest: Mapping[str, Any]
    files: Mapping[str, str]

    def write(self, folder: str | os.PathLike[str]) -> list[Path]:
        """Write every file into `folder` (made if missing); the scripts executable. The paths written."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files.items():
            path = out / name
            path.write_text(text, encoding="utf-8")
            if name.endswith(".sh") or name.endswith(".sbatch"):
                path.chmod(0o755)
            written.append(path)
        return written


def launch_files(
    model: Any,
    *,
    machine: Machine | None = None,
    nodes: int = 1,
    ranks_per_node: int | None = None,
    interconnect: str | None = None,
    parallelism: str | None = None,
    emit: Iterable[str] = EMITTERS,
    script: str = "train.py",
    script_args: Sequence[str] = (),
    main_address: str = "$MASTER_ADDR",
    port: int = 29500,
    manifest_path: str | None = None,
    **plan_kwargs: Any,
) -> LaunchFiles:
    """Plan the fine-tuning of `model` on `nodes` x `ranks_per_node` and write its launch for each engine.

    The plan is `cudaload.plan(model, finetune=True, nodes=..., ...)`: its `parallelism` decision picks DDP,
    FSDP2 (full or hybrid shard), DeepSpeed ZeRO or tensor parallel; the files launch that strategy, and
    `cudaload-launch.json` records the plan, which `load_for_finetune()` in every launched rank checks its
    own plan against (`LaunchMismatchError` when they differ).

    Args:
        model: A local path or Hub id, a `PretrainedConfig` or `ModelFacts` (as `plan()` takes).
        machine: One node of the job (default None: this machine; e.g. `Machine.simulated("H100", count=8)`).
        nodes: Nodes in the job (default 1).
        ranks_per_node: Processes per node (default None: one per GPU; 1 on a CPU).
        interconnect: The link between nodes (`--interconnect`; default None: "ethernet-100g").
        parallelism: "auto" (default None), "deepspeed" or one strategy, validated and kept.
        emit: Which launches to write: "torchrun" (a script per node), "accelerate" (config + script),
            "deepspeed" (ds_config.json; needs a DeepSpeed plan), "slurm" (an sbatch script). Default: all
            that apply.
        script: The training script the launch runs (default "train.py").
        script_args: Its arguments.
        main_address: Node 0's address, the rendezvous endpoint (default "$MASTER_ADDR", read by the shell).
        port: The rendezvous port (default 29500).
        manifest_path: Where the ranks read the manifest (default None: beside the launch files).
        **plan_kwargs: More `plan()` arguments (quantize, lora, seq_len, batch_size, dtype, ...).

    Returns:
        `LaunchFiles`: the plan, the manifest and every file's text; `.write(folder)` writes them.

    Raises:
        PlacementError: nothing fits the ranks, or the strategy asked for does not fit.
        SettingError: an unknown `emit`, interconnect or strategy, or "deepspeed" for a plan that is not.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> h100 = cudaload.Machine.simulated("H100", count=8)
        >>> files = cudaload.launch_files(path, machine=h100, nodes=2, emit=["torchrun"], main_address="10.0.0.1")
        >>> files.plan.decision("parallelism").value, sorted(files.files)
        ('ddp', ['cudaload-launch.json', 'torchrun-node0.sh', 'torchrun-node1.sh'])
        >>> files.files["torchrun-node1.sh"].splitlines()[-1]  # doctest: +ELLIPSIS
        'exec torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1 --master-port 29500 train.py'
    """
    from .planner import plan as make_plan

    wanted = tuple(emit)
    unknown = [e for e in wanted if e not in EMITTERS]
    if unknown or not wanted:
        raise SettingError(f"emit={wanted!r}: pass some of {list(EMITTERS)}.")
    the_plan = make_plan(
        model,
        machine=machine,
        finetune=True,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        interconnect=interconnect,
        parallelism=parallelism,
        **plan_kwargs,
    )
    section = the_plan.finetune
    assert section is not None and section.parallelism is not None  # a fine-tuning plan with a layout
    layout = section.parallelism
    strategy = layout["strategy"]
    if strategy is None:
        raise PlacementError(
            f"{the_plan.model} does not fit {layout['nodes']} x {layout['ranks_per_node']} ranks with any strategy "
            f"({the_plan.decision('parallelism').reason}). Add nodes, pass quantize='4bit', or shorten seq_len."
        )
    if "deepspeed" in wanted and not strategy.startswith("deepspeed"):
        raise SettingError(
            f"emit deepspeed, but the plan chose {strategy}: pass parallelism='deepspeed' for a DeepSpeed launch."
        )
    manifest = {
        "cudaload_launch": 1,
        "model": the_plan.model,
        "nodes": layout["nodes"],
        "ranks_per_node": layout["ranks_per_node"],
        "interconnect": layout["interconnect"] if not layout["interconnect_assumed"] else None,
        "parallelism": parallelism or "auto",
        "decisions": launch_invariants(the_plan),
    }
    where = manifest_path
    job = _Job(layout["nodes"], layout["ranks_per_node"], strategy, main_address, port, where, script, script_args)
    files: dict[str, str] = {MANIFEST: json.dumps(manifest, indent=2) + "\n"}
    if "torchrun" in wanted:
        files |= {f"torchrun-node{n}.sh": _torchrun_script(job, n) for n in range(job.nodes)}
    if "accelerate" in wanted:
        files["accelerate-config.yaml"] = _accelerate_yaml(the_plan, job, _wrap_classes(the_plan.model_class))
        files["accelerate-launch.sh"] = _accelerate_script(job)
    if "deepspeed" in wanted or strategy.startswith("deepspeed"):
        files["ds_config.json"] = json.dumps(deepspeed_config(the_plan, strategy), indent=2) + "\n"
    if "slurm" in wanted:
        files["launch.sbatch"] = _sbatch(job, gpus="no CUDA GPU" not in the_plan.machine)
    return LaunchFiles(the_plan, manifest, files)


@dataclass(frozen=True)
class _Job:
    nodes: int
    ranks: int
    strategy: str
    address: str
    port: int
    manifest: str | None
    script: str
    args: Sequence[str]

    def manifest_word(self, folder: str) -> str:
        """The manifest's path as a shell word: the one given, or `MANIFEST` in `folder` (a shell expression
        for the launch files' folder, wherever they were copied)."""
        return _quote(self.manifest) if self.manifest else f'"{folder}/{MANIFEST}"'

    def command_tail(self) -> str:
        return " ".join(shlex.quote(a) for a in (self.script, *self.args))


_HERE = '$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)'


def _quote(value: str) -> str:
    """A shell word, leaving a $VARIABLE to the shell."""
    return value if value.startswith("$") else shlex.quote(value)


def torchrun_command(job: _Job, node: int | str) -> str:
    return (
        f"torchrun --nnodes {job.nodes} --node-rank {node} --nproc-per-node {job.ranks} "
        f"--master-addr {_quote(job.address)} --master-port {job.port} {job.command_tail()}"
    )


def _torchrun_script(job: _Job, node: int) -> str:
    return (
        "#!/usr/bin/env bash\n"
        f"# Node {node} of {job.nodes}: {job.ranks} ranks, {job.strategy} (planned by cudaload; run on every node,\n"
        "# MASTER_ADDR set to node 0's address). The training script applies the strategy itself.\n"
        "set -euo pipefail\n"
        f"export {LAUNCH_ENV}={job.manifest_word(_HERE)}\n"
        f"exec {torchrun_command(job, node)}\n"
    )


def _accelerate_script(job: _Job) -> str:
    # accelerate reads the YAML as is (no $VARIABLES): an address from the environment goes on the command line.
    main = f"--main_process_ip {_quote(job.address)}" if job.nodes > 1 and job.address.startswith("$") else ""
    return (
        "#!/usr/bin/env bash\n"
        f"# Run on each of the {job.nodes} node(s) with NODE_RANK set (0 on the main node).\n"
        "set -euo pipefail\n"
        f"export {LAUNCH_ENV}={job.manifest_word(_HERE)}\n"
        f'exec accelerate launch --config_file "{_HERE}/accelerate-config.yaml" --machine_rank "${{NODE_RANK:-0}}" '
        f"{main} {job.command_tail()}\n"
    )


def _wrap_classes(model_class: str) -> list[str] | None:
    """The model's `_no_split_modules` (its decoder layer classes), what FSDP wraps one by one; None when
    transformers has no such class (accelerate then reads `_no_split_modules` from the model itself)."""
    import transformers

    cls = getattr(transformers, model_class, None)
    names = getattr(cls, "_no_split_modules", None)
    return [str(n) for n in names] if names else None


def _yaml(value: Any, indent: int = 0) -> str:
    """YAML for the nested dicts of scalars an accelerate config holds (yaml.safe_load reads it back)."""
    pad = "  " * indent
    lines = []
    for key, item in value.items():
        if isinstance(item, dict):
            lines.append(f"{pad}{key}:\n{_yaml(item, indent + 1)}")
        else:
            lines.append(f"{pad}{key}: {json.dumps(item)}")
    return "\n".join(lines)


def _accelerate_yaml(plan: Plan, job: _Job, wrap: list[str] | None) -> str:
    strategy = job.strategy
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "mixed_precision": _DTYPES.get(plan.dtype, "no"),
        "num_machines": job.nodes,
        "num_processes": job.nodes * job.ranks,
        "machine_rank": 0,
        "main_process_ip": job.address if job.nodes > 1 and not job.address.startswith("$") else None,
        "main_process_port": job.port,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if strategy.startswith("deepspeed"):
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "deepspeed_config_file": "ds_config.json",
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
    if config["main_process_ip"] is None:
        del config["main_process_ip"]
    head = f"# accelerate launch --config_file this; planned by cudaload for {plan.model}: {strategy}\n"
    return head + _yaml(config) + "\n"


def deepspeed_config(plan: Plan, strategy: str) -> dict[str, Any]:
    """A DeepSpeed JSON config for the planned ZeRO stage (keys of deepspeed.ai/docs/config-json)."""
    section = plan.finetune
    assert section is not None and section.parallelism is not None
    micro = section.parallelism["sizes"][strategy]["micro_batch"]
    stage = 2 if strategy == "deepspeed-zero2" else 3
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if strategy == "deepspeed-zero3-offload":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": plan.dtype == "bfloat16"},
        "fp16": {"enabled": plan.dtype == "float16"},
        "zero_optimization": zero,
    }


def _sbatch(job: _Job, *, gpus: bool) -> str:
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=cudaload-{job.strategy.replace('+', '-')}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={job.ranks}"] if gpus else []),
        "#SBATCH --exclusive",
        "set -euo pipefail",
        "# One torchrun per node (srun starts one task on each); node 0 is the rendezvous endpoint.",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        # sbatch runs a spooled copy of this script: the files are where it was submitted from.
        f"export {LAUNCH_ENV}={job.manifest_word('$SLURM_SUBMIT_DIR')}",
        "srun bash -c " + shlex.quote(torchrun_command(job, "$SLURM_NODEID")),
        "",
    ]
    return "\n".join(lines)
