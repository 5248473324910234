"""The TrainingArguments a parallel job's engine needs, from the plan's `parallelism` decision: the micro-batch
each rank was sized for, and each engine's own settings (FSDP2's `fsdp` / `fsdp_config`, DeepSpeed's `deepspeed`
config). They are decisions named `training.<key>`: `cudaload plan --finetune` shows them, `training_arguments()`
returns them, and the launch files are written from the same values, so what is shown is what the ranks apply."""

from __future__ import annotations

from typing import Any

from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
from ..request import TrainingRequest
from .engine_deepspeed import deepspeed_decision
from .parallelism import ParallelChoice

__all__ = ["FSDP_STRATEGIES", "engine_arguments", "fsdp_arguments"]

TRAINER_DEFAULT_BATCH = 8
"""transformers 5.22-5.25 `TrainingArguments.per_device_train_batch_size`'s default."""
FSDP_STRATEGIES = ("fsdp", "fsdp-hybrid")
"""The strategies FSDP2 applies through TrainingArguments' `fsdp_config` (and, for hybrid shard, its
`parallelism_config`)."""


def engine_arguments(
    choice: ParallelChoice | None, training: TrainingRequest, model: ModelFacts | None = None
) -> tuple[Decision, ...]:
    """The `training.*` decisions for the job's chosen strategy; none for one process with no layout asked, or
    when nothing fits."""
    if choice is None or choice.chosen is None:
        return ()
    micro = choice.sizes[choice.chosen].micro_batch
    decisions = [
        Decision(
            "training.per_device_train_batch_size",
            micro,
            f"the micro-batch each rank's memory was sized for ({choice.chosen}, batch_size={training.batch_size})",
            (Rejected(TRAINER_DEFAULT_BATCH, "TrainingArguments' default: not what the ranks were sized for"),),
        )
    ]
    # Each engine's own settings follow here (one function per engine).
    decisions += fsdp_arguments(choice, training, model)
    if choice.chosen.startswith("deepspeed-zero"):
        decisions.append(deepspeed_decision(choice.chosen))
    return tuple(decisions)


def fsdp_arguments(choice: ParallelChoice, training: TrainingRequest, model: ModelFacts | None) -> list[Decision]:
    """FSDP2's TrainingArguments for an "fsdp" or "fsdp-hybrid" plan: `fsdp=True`, the `fsdp_config` accelerate
    1.16's `FullyShardedDataParallelPlugin` is built from (transformers 5.22-5.25
    `TrainingArguments._process_fsdp_args`), and for hybrid shard the `parallelism_config` (accelerate 1.16
    `ParallelismConfig`: replicate across nodes, shard within one). Empty for any other strategy."""
    if choice.chosen not in FSDP_STRATEGIES:
        return []
    config: dict[str, Any] = {
        "version": 2,
        "reshard_after_forward": True,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "cpu_ram_efficient_loading": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_offload": False,
        "activation_checkpointing": False,
    }
    wrap = list(model.no_split_modules) if model is not None else []
    if wrap:
        config["transformer_layer_cls_to_wrap"] = wrap
    wrapped = f"each {', '.join(wrap)} its own unit" if wrap else "the model's `_no_split_modules` each its own unit"
    checkpointing = (
        "the model's own gradient checkpointing (load_for_finetune applies the plan's) does it"
        if training.gradient_checkpointing
        else "not asked (gradient_checkpointing=False)"
    )
    decisions = [
        Decision(
            "training.fsdp",
            True,
            f"{choice.chosen}: FSDP2 through accelerate's plugin, configured by fsdp_config (transformers 5.22-5.25 "
            "`TrainingArguments._process_fsdp_args`)",
            (
                Rejected(
                    "hybrid_shard auto_wrap" if choice.chosen == "fsdp-hybrid" else "full_shard auto_wrap",
                    "the string form is deprecated (transformers 5.22-5.25 "
                    "`TrainingArguments._apply_legacy_fsdp_to_config`), and 'hybrid_shard' raises there under FSDP2",
                ),
            ),
        ),
        Decision(
            "training.fsdp_config",
            config,
            f"FSDP2 (version 2), parameters resharded after each forward (full shard), {wrapped}; with "
            "cpu_ram_efficient_loading only rank 0 reads the weights: load_for_finetune() builds the other ranks' "
            "model on the meta device and accelerate broadcasts rank 0's weights into their shards; "
            f"sharded checkpoints; FSDP's activation checkpointing off: {checkpointing}",
            (
                Rejected(False, "cpu_ram_efficient_loading off: each rank reads and keeps a copy until it shards"),
                Rejected("FULL_STATE_DICT", "gathers the whole model on rank 0 at each save"),
            ),
        ),
    ]
    if choice.chosen == "fsdp-hybrid":
        layout = choice.layout
        mesh = {"dp_replicate_size": layout.nodes, "dp_shard_size": layout.ranks_per_node}
        decisions.append(
            Decision(
                "training.parallelism_config",
                mesh,
                f"hybrid shard: each node's {layout.ranks_per_node} ranks shard the model, the {layout.nodes} nodes "
                "replicate it (accelerate 1.16 `ParallelismConfig`; training_arguments() builds it)",
                (Rejected(None, "full shard over all ranks: every all-gather crosses nodes"),),
            )
        )
    return decisions
