"""The DeepSpeed launch: ds_config.json for the planned ZeRO stage, serialized with `json.dumps` (keys of
deepspeed.ai/docs/config-json: train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping,
bf16/fp16, zero_optimization.stage, offload_optimizer). accelerate's DeepSpeed config points at it."""

from __future__ import annotations

import json
from typing import Any

from ..plans import Plan

__all__ = ["deepspeed_config", "deepspeed_files"]


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


def deepspeed_files(plan: Plan, strategy: str) -> dict[str, str]:
    """ds_config.json."""
    return {"ds_config.json": json.dumps(deepspeed_config(plan, strategy), indent=2) + "\n"}
