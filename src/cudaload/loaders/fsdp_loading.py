"""A launched FSDP2 rank other than rank 0 reads no weights: it builds the model on the meta device, and its weights
arrive from rank 0 when accelerate shards it. With the plan's fsdp_config `cpu_ram_efficient_loading`, accelerate 1.16
`utils.fsdp_utils.fsdp2_prepare_model` moves every rank but the main process to meta before sharding and
`fsdp2_load_full_state_dict` broadcasts the main process's weights (global rank 0) into each shard, so the copy
transformers 5.22-5.25 would read on every other rank (`PreTrainedModel._load_pretrained_model` reads the whole
checkpoint whatever the rank) is never used: a job holds one CPU copy while loading, not one a rank.

The model is built with accelerate 1.16 `big_modeling.init_empty_weights(include_buffers=False)`: parameters on meta,
buffers real. The non-persistent ones (rotary `inv_freq`) are in no state dict, and `fsdp2_prepare_model` keeps and
re-registers each rank's own, so they must be computed here as from_pretrained computes them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..plans import Plan

__all__ = ["SKELETON_NOTE", "build_skeleton", "skeleton_kwargs", "skeleton_rank"]

_MODEL_KEYS = ("dtype", "attn_implementation")
"""from_pretrained keyword arguments from_config takes as they are."""
_CONFIG_KEYS = ("trust_remote_code", "revision", "subfolder", "cache_dir", "local_files_only", "token")
"""from_pretrained keyword arguments that say where the config is (and whether its code may run)."""

SKELETON_NOTE = (
    "skipped: this rank read no weights (FSDP2 with cpu_ram_efficient_loading: the model is on the meta device "
    "until accelerate's fsdp2_prepare_model broadcasts rank 0's weights into its shards); rank 0 runs the check"
)


def skeleton_rank(plan: Plan, environ: Mapping[str, str] = os.environ) -> bool:
    """This process is a launched rank other than rank 0 of an FSDP2 plan whose fsdp_config has
    `cpu_ram_efficient_loading`, for a model that is not quantized (accelerate 1.16 `fsdp2_prepare_model` keeps
    `Params4bit` weights where they are, so every rank of a QLoRA plan loads its own)."""
    section = plan.finetune
    if section is None or "quantization_config" in plan.kwargs:
        return False
    config = section.training_arguments.get("fsdp_config")
    if not section.training_arguments.get("fsdp") or not isinstance(config, Mapping):
        return False
    if config.get("cpu_ram_efficient_loading") is not True:
        return False
    return int(environ.get("WORLD_SIZE", "1") or 1) > 1 and int(environ.get("RANK", "0") or 0) != 0


def skeleton_kwargs(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(config keyword arguments, from_config keyword arguments) for from_pretrained's `kwargs`, or None when they
    hold anything a model built from its config would not apply (a device_map, a quantization, Hub kernels
    swapped in at load): such a rank loads its own copy instead."""
    rest = {key: value for key, value in kwargs.items() if key not in (*_MODEL_KEYS, *_CONFIG_KEYS)}
    if rest.pop("use_kernels", False) or rest or kwargs.get("dtype") == "auto":  # "auto": the weights' own dtype
        return None
    where = {key: kwargs[key] for key in _CONFIG_KEYS if key in kwargs}
    model = {key: kwargs[key] for key in _MODEL_KEYS if key in kwargs}
    if "trust_remote_code" in where:  # the auto class resolves the model's class from the config's auto_map too
        model["trust_remote_code"] = where["trust_remote_code"]
    return where, model


def build_skeleton(auto: Any, path: str, where: Mapping[str, Any], model_kwargs: Mapping[str, Any]) -> Any:
    """`auto`'s model for the checkpoint at `path`, its parameters on the meta device and its buffers computed on
    the CPU, with the dtype and attention implementation from_pretrained would have applied."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, **where)
    kwargs = dict(model_kwargs)
    if isinstance(kwargs.get("dtype"), str):
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    with init_empty_weights(include_buffers=False):
        return auto.from_config(config, **kwargs)
