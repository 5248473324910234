"""Where transformers' own `device_map="auto"` would put a model: accelerate's placement, run on a
meta model built from the config (`upstream_placement`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config_file import load_config
from .model_class import meta_model, model_class_for

__all__ = ["upstream_placement"]


def upstream_placement(
    model: Any,
    auto_class: str,
    dtype: str,
    max_memory: Mapping[Any, Any],
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> dict[str, int] | None:
    """Bytes per device ("0", "1", "cpu", "disk") where transformers' own `device_map="auto"` puts `model` in
    `dtype` under `max_memory`: its `_get_device_map` (integrations/accelerate.py: `get_balanced_memory`, then
    `infer_auto_device_map`, which keeps room for the largest layer on the first GPU and adds "disk" when
    max_memory has no "cpu" key) run on a meta model built from the config, sized by its `compute_module_sizes`.
    None when transformers cannot compute it here (the plan then keeps its own estimate)."""
    import logging
    import warnings

    import torch
    from transformers.integrations.accelerate import _get_device_map, compute_module_sizes

    try:
        config = load_config(model, trust_remote_code, revision)
        meta = meta_model(model_class_for(config, auto_class, trust_remote_code, str(model), revision), config)
        meta = meta.to(getattr(torch, dtype))
        quiet = [logging.getLogger(name) for name in ("accelerate", "transformers")]
        levels = [logger.level for logger in quiet]
        try:
            for logger in quiet:  # "Device 0 is not available": planning for GPUs this machine lacks is the point
                logger.setLevel(logging.ERROR)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                device_map = _get_device_map(meta, "auto", dict(max_memory), None)
                sizes, _ = compute_module_sizes(meta, None)
        finally:
            for logger, level in zip(quiet, levels, strict=True):
                logger.setLevel(level)
    except Exception:  # a config this transformers cannot build or map: no upstream answer
        return None
    landed: dict[str, int] = {}
    for name, device in device_map.items():
        landed[str(device)] = landed.get(str(device), 0) + int(sizes[name])
    return landed
