"""Read a model's KV-cache layout (`GenerationFacts`) from its config, as transformers' caches do.

The layer types and windows come from `cache_utils.get_layer_types_and_kwargs`, the function
`DynamicCache(config=...)` and `StaticCache` call; the per-token sizes from the config's heads and
head dims (`head_dim`, also what `ModelFacts.head_dim` holds); the class flags generation depends
on from the model class.
Called by `read_model_facts()`, which reads the config once for every fact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ..facts.kv_cache import PER_TOKEN_TYPES, STATE_TYPES, WINDOW_TYPES, GenerationFacts, KvLayers
from .per_layer import largest_int

__all__ = ["checkpoint_generation_config", "head_dim", "read_generation_facts"]


def _int(config: Any, *names: str) -> int | None:
    """The first of `names` the config has as a positive int; over its layers, the largest (`largest_int`:
    a per-layer head_dim raises when read on a heterogeneous config, transformers 5.25)."""
    return largest_int(config, *names)


def head_dim(config: Any) -> int | None:
    """The attention head size: `head_dim`, else hidden size / heads (as the modeling code derives it)."""
    heads = _int(config, "num_attention_heads", "n_head")
    hidden = _int(config, "hidden_size", "n_embd", "d_model")
    return _int(config, "head_dim") or (hidden // heads if hidden and heads else None)


def _elements_per_token(layer_config: Any, layer_type: str) -> tuple[int, str | None]:
    """(numbers cached per token by one layer, a note when a size had to be guessed)."""
    if layer_type in STATE_TYPES:
        return 0, None
    note = None
    latent = _int(layer_config, "kv_lora_rank")
    if latent is not None:
        # MLA (DeepSeek V2/V3 and kin): transformers caches the compressed latent and the rotary key
        # as two single-head tensors (modeling_deepseek_v3.py: "Cache read / write is performed while
        # latent KV is still compressed").
        elements = latent + (_int(layer_config, "qk_rope_head_dim") or 0)
    else:
        heads = _int(layer_config, "num_attention_heads", "n_head")
        kv_heads = _int(layer_config, "num_key_value_heads") or heads
        size = head_dim(layer_config)
        if kv_heads is None or size is None:
            return 0, f"{layer_type}: the config gives no attention heads or head size; its cache is not counted"
        v_dim = _int(layer_config, "v_head_dim") or size
        k_dim = _int(layer_config, "qk_head_dim") or size
        elements = kv_heads * (k_dim + v_dim)
    if layer_type == "indexed_attention":
        elements += _int(layer_config, "index_head_dim") or 0
    if layer_type not in PER_TOKEN_TYPES | WINDOW_TYPES:
        note = f"layer type {layer_type!r} is new to cudaload: counted as full attention"
    return elements, note


def _layer_types(config: Any) -> tuple[list[str], list[dict[str, Any]], list[Any]]:
    """Layer types and per-layer cache kwargs exactly as transformers builds its caches."""
    layers = _int(config, "num_hidden_layers", "n_layer", "num_layers") or 0
    per_layer = list(getattr(config, "per_layer_config", None) or [config] * layers)
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # older transformers: the same inference, by hand
        types = list(getattr(config, "layer_types", None) or [])
        if not types:
            for c in per_layer:
                window = getattr(c, "sliding_window", None)
                chunk = getattr(c, "attention_chunk_size", None)
                types.append("sliding_attention" if window else "chunked_attention" if chunk else "full_attention")
        kwargs: list[dict[str, Any]] = [
            {"sliding_window": getattr(c, "sliding_window", None) or getattr(c, "attention_chunk_size", None)}
            if t in WINDOW_TYPES
            else {}
            for t, c in zip(types, per_layer, strict=False)
        ]
        return types, kwargs, per_layer
    types, kwargs = get_layer_types_and_kwargs(config)
    return list(types), list(kwargs), per_layer


def read_generation_facts(
    config: Any, model_class: type | None = None, generation_config: Mapping[str, Any] | None = None
) -> GenerationFacts:
    """The KV-cache layout and generation flags of a model, from its config (no weights).

    Args:
        config: a transformers `PretrainedConfig` (the whole model's; its decoder text config is used).
        model_class: the model class (for `_can_compile_fullgraph` and whether generate() builds a
            Cache for it); None when unknown.
        generation_config: the checkpoint's generation_config.json as a dict, if it has one
            (`checkpoint_generation_config(path)`).

    Example::

        from transformers import AutoConfig
        facts = read_generation_facts(AutoConfig.from_pretrained("Qwen/Qwen3-0.6B"))
        facts.bytes_per_token(2)   # bf16 KV bytes per token: 28 layers x 8 heads x 256 x 2
    """
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types, kwargs, per_layer = _layer_types(text)
    groups: dict[tuple[str, int, int | None], int] = {}
    notes: list[str] = []
    for layer_type, layer_kwargs, layer_config in zip(
        types, kwargs, per_layer, strict=False
    ):  # kv-shared layers come last
        elements, note = _elements_per_token(layer_config, layer_type)
        if note and note not in notes:
            notes.append(note)
        window = layer_kwargs.get("sliding_window") if layer_type in WINDOW_TYPES else None
        key = (layer_type, elements, int(window) if window else None)
        groups[key] = groups.get(key, 0) + 1
    supports_cache = True
    fullgraph = False  # unknown class (remote code): do not count on compiling it
    if model_class is not None:
        check = getattr(model_class, "_supports_default_dynamic_cache", None)
        supports_cache = bool(check()) if callable(check) else True
        fullgraph = bool(getattr(model_class, "_can_compile_fullgraph", False))
    checkpoint_cache = (generation_config or {}).get("cache_implementation")
    if checkpoint_cache == "hybrid":
        # generate() unsets a checkpoint's "hybrid" (the old static sliding cache) and uses the
        # dynamic sliding-window cache instead (generation/utils.py, `_prepare_generation_config`).
        checkpoint_cache = None
    return GenerationFacts(
        layers=tuple(KvLayers(t, n, e, w) for (t, e, w), n in groups.items()),
        max_positions=_int(text, "max_position_embeddings", "n_positions"),
        encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
        supports_cache=supports_cache,
        compiles_fullgraph=fullgraph,
        checkpoint_cache_implementation=str(checkpoint_cache) if checkpoint_cache else None,
        model_type=str(getattr(config, "model_type", "") or "") or None,
        notes=tuple(notes),
    )


def checkpoint_generation_config(
    source: str, revision: str | None = None, subfolder: str = "", cache_dir: Any = None
) -> dict[str, Any]:
    """The checkpoint's generation_config.json as a dict ({} when it has none or it cannot be read), in
    `subfolder` and through `cache_dir` as transformers looks it up."""
    path = os.path.join(source, subfolder, "generation_config.json")
    if not os.path.isdir(source):
        try:
            from huggingface_hub import try_to_load_from_cache

            filename = f"{subfolder}/generation_config.json" if subfolder else "generation_config.json"
            cached = try_to_load_from_cache(source, filename, revision=revision, cache_dir=cache_dir)
        except Exception:  # an id the cache helper rejects: no generation config to read
            return {}
        if not isinstance(cached, str):
            return {}
        path = cached
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
