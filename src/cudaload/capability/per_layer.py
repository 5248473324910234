"""A config value that may differ per layer, read as every layer's value.

Two ways transformers says a size is per layer: a heterogeneous config (transformers 5.25
integrations/heterogeneity/configuration_utils.py: `HeterogeneousConfigMixin`), whose `per_layer_attributes`
raise `AmbiguousGlobalPerLayerAttributeError` when read on the global config and are read from
`config.per_layer_config[i]`; and a plain list with one value per layer (gemma3n's `intermediate_size`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["largest_int", "layer_values"]


def layer_values(config: Any, name: str) -> tuple[Any, ...]:
    """Every value `name` takes in `config`: one per layer where it is per layer, else the one value;
    () when the config does not have it (or has None)."""
    per_layer = getattr(config, "per_layer_attributes", None)  # None on a homogeneous config and in 5.22
    if per_layer and name in per_layer:
        values = tuple(getattr(layer, name, None) for layer in config.per_layer_config)
        return tuple(v for v in values if v is not None)
    value = getattr(config, name, None)
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def largest_int(config: Any, *names: str) -> int | None:
    """The largest positive int among the first of `names` the config has (over its layers), else None:
    the size that bounds every layer's (memory, kernel limits)."""
    for name in names:
        found = [v for v in layer_values(config, name) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        if found:
            return max(found)
    return None
