"""A ZeRO-3 rank loads its share only: transformers partitions the weights at load (`deepspeed.zero.Init`) when
`integrations.deepspeed.is_deepspeed_zero3_enabled()` is true, which it is while an `HfDeepSpeedConfig` of stage 3
is alive (transformers 5.22-5.25 `integrations.deepspeed.HfDeepSpeedConfig`, a global weak reference). HF Trainer
makes one from `TrainingArguments(deepspeed=...)`, but a script builds TrainingArguments after
`load_for_finetune()`: so the loader makes one from the plan's config, before from_pretrained, and the model keeps
it alive until Trainer's own replaces it."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from ..errors import MissingPackageError, PlacementError
from ..plans import Plan

__all__ = ["zero3_loading"]


def zero3_loading(plan: Plan, environ: os._Environ[str] | dict[str, str] = os.environ) -> Any:
    """The live `HfDeepSpeedConfig` a launched rank of a ZeRO-3 plan loads under (keep it referenced), or None for
    any other plan, or a single process (WORLD_SIZE unset or 1: no process group to partition over)."""
    section = plan.finetune
    config = None if section is None else section.training_arguments.get("deepspeed")
    if not isinstance(config, dict) or config.get("zero_optimization", {}).get("stage") != 3:
        return None
    if int(environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    if "device_map" in plan.kwargs:
        raise PlacementError(
            f"The plan places {plan.model} with device_map={plan.kwargs['device_map']!r}, but its strategy is "
            "DeepSpeed ZeRO-3, which partitions the weights at load and takes no device_map (transformers raises). "
            "Launch it with the files `cudaload launch` wrote for this plan, or plan with parallelism='ddp'."
        )
    if importlib.util.find_spec("deepspeed") is None:
        raise MissingPackageError(
            f"The plan's strategy is {section.parallelism['strategy'] if section and section.parallelism else 'ZeRO-3'}"
            ", but deepspeed is not installed on this rank: install it with `pip install deepspeed` (with "
            "DS_BUILD_OPS=0 on a host without CUDA; from a clone: `pip install -e '.[deepspeed]'`), or plan another "
            "strategy."
        )
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    assert section is not None  # the config came from it
    return HfDeepSpeedConfig(_load_time_config(config, dict(section.training_arguments)))  # type: ignore[no-untyped-call]


def _load_time_config(config: dict[str, Any], training_arguments: dict[str, Any]) -> dict[str, Any]:
    """The config `deepspeed.zero.Init` reads while transformers loads a ZeRO-3 rank (before Trainer fills the
    "auto" values): the planned micro-batch, no accumulation, TrainingArguments' default clipping (1.0) and the
    planned precision. deepspeed 0.19.8 `runtime.config.DeepSpeedConfig` compares numbers and fails on "auto"
    (TypeError), and checks train_batch_size against the world size it sees then (1 before the process group):
    left out, it is computed."""
    filled = {key: value for key, value in config.items() if key != "train_batch_size"}
    filled["train_micro_batch_size_per_gpu"] = int(training_arguments.get("per_device_train_batch_size", 1))
    filled["gradient_accumulation_steps"] = 1
    filled["gradient_clipping"] = 1.0
    filled["bf16"] = {"enabled": bool(training_arguments.get("bf16", False))}
    filled["fp16"] = {"enabled": bool(training_arguments.get("fp16", False))}
    return filled
