"""DeepSpeed's config for a planned ZeRO strategy, as the dict HF Trainer takes (`TrainingArguments(deepspeed=...)`)
and the launch writes to ds_config.json: one value, the plan's `training.deepspeed` decision.

Every key HF Trainer fills from TrainingArguments is "auto" (transformers 5.22-5.25
`integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_process`: train_micro_batch_size_per_gpu,
gradient_accumulation_steps, train_batch_size, gradient_clipping, fp16/bf16 enabled), so
`HfTrainerDeepSpeedConfig.trainer_config_finalize` finds nothing to disagree with (a fixed value that differs from
TrainingArguments raises ValueError there). The micro-batch the ranks were sized for reaches DeepSpeed through
`training.per_device_train_batch_size`. reduce_bucket_size / allgather_bucket_size stay unset: DeepSpeed's
default (5e8 elements, deepspeed 0.19.8 `runtime.zero.config.ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT`) is what
the rank sizing counts."""

from __future__ import annotations

from typing import Any

from ..facts.launch import zero_stage as stage_of
from ..plans import Decision, Rejected

__all__ = ["deepspeed_config", "deepspeed_decision", "zero_stage"]

_AUTO = "auto"


def zero_stage(strategy: str) -> int:
    """The ZeRO stage of a "deepspeed-zero<stage>[-offload]" strategy (facts/launch.py `zero_stage`); ValueError
    for another strategy: a DeepSpeed config is only written for a ZeRO plan."""
    stage = stage_of(strategy)
    if stage is None:
        raise ValueError(f"not a DeepSpeed ZeRO strategy: {strategy!r}")
    return stage


def deepspeed_config(strategy: str) -> dict[str, Any]:
    """The DeepSpeed config (keys of deepspeed.ai/docs/config-json) for a "deepspeed-zero*" strategy."""
    stage = zero_stage(strategy)
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": _AUTO,
        "gradient_accumulation_steps": _AUTO,
        "train_batch_size": _AUTO,
        "gradient_clipping": _AUTO,
        "bf16": {"enabled": _AUTO},
        "fp16": {"enabled": _AUTO},
        "zero_optimization": zero,
    }
    if strategy.endswith("-offload"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        # Trainer's own optimizer (torch AdamW, what the rank sizing counts) steps on the CPU copy. Without this,
        # deepspeed 0.19.8 `runtime.engine.DeepSpeedEngine._configure_optimizer` raises ZeRORuntimeException
        # for any optimizer but DeepSpeedCPUAdam, and under Trainer accelerate 1.16 `Accelerator._prepare_deepspeed`
        # swaps AdamW for DeepSpeedCPUAdam (`map_pytorch_optim_to_deepspeed`): a C++ op JIT-compiled on every new
        # machine when installed with DS_BUILD_OPS=0 (both ran on CPU, 2026-12-06: same losses).
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def deepspeed_decision(strategy: str) -> Decision:
    """`training.deepspeed`: the config dict TrainingArguments gets and ds_config.json holds."""
    stage = zero_stage(strategy)
    offload = " with the optimizer states in CPU RAM (Trainer's AdamW steps there)" if "-offload" in strategy else ""
    return Decision(
        "training.deepspeed",
        deepspeed_config(strategy),
        f"ZeRO stage {stage}{offload} ({strategy}); batch, accumulation, clipping and precision 'auto': HF Trainer "
        "fills them from TrainingArguments",
        (Rejected("fixed batch / accumulation / clipping", "Trainer raises on a difference from TrainingArguments"),),
    )
