"""The DeepSpeed launch: ds_config.json, the plan's `training.deepspeed` decision (policy/engine_deepspeed.py)
serialized with `json.dumps`: the same dict `training_arguments()` gives TrainingArguments(deepspeed=...), so the
file and the ranks' Trainer hold one config. accelerate's DeepSpeed config points at it."""

from __future__ import annotations

import json
from typing import Any

from ..errors import SettingError
from ..plans import Plan

__all__ = ["deepspeed_config", "deepspeed_files"]


def deepspeed_config(plan: Plan, strategy: str) -> dict[str, Any]:
    """The plan's DeepSpeed config (keys of deepspeed.ai/docs/config-json) for its ZeRO strategy."""
    section = plan.finetune
    config = None if section is None else section.training_arguments.get("deepspeed")
    if not isinstance(config, dict):
        raise SettingError(
            f"A DeepSpeed launch ({strategy}) was asked, but the plan has no DeepSpeed config "
            "(training.deepspeed): plan it with parallelism='deepspeed' or a 'deepspeed-zero*' strategy."
        )
    return config


def deepspeed_files(plan: Plan, strategy: str) -> dict[str, str]:
    """ds_config.json."""
    return {"ds_config.json": json.dumps(deepspeed_config(plan, strategy), indent=2) + "\n"}
