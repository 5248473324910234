"""The `ModelFacts` of a model read from its config, the model class the Auto class picks and that class built on
the meta device (no memory, no weights): what `read_model_facts()` (model_config.py) does when its cache has
no entry. Imported then only: a model planned before is read from the facts cache without these modules."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ModelConfigError
from ..facts.attention_backends import class_flags
from ..facts.dtypes import canonical_dtype
from ..facts.kv_cache import GenerationFacts
from ..facts.model import NAMED_FLAGS, ModelFacts, generates
from ..facts.stored_weights import CheckpointQuantization, count_quantized, read_quantization_config
from .config_file import check_sizes, load_config
from .config_file import text_config as text_of
from .kv_layout import checkpoint_generation_config, head_dim, read_generation_facts
from .model_class import default_auto_class, meta_model, model_class_for
from .per_layer import largest_int, layer_values
from .weights_header import weights_dtype

__all__ = ["read_config_facts"]


def _normalise_dtype(value: Any) -> str | None:
    if value is None:
        return None
    return canonical_dtype(value) or str(value).removeprefix("torch.")


def _rope_types() -> str:
    """The rope_type values transformers builds (ROPE_INIT_FUNCTIONS, plus "default")."""
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return "see transformers' modeling_rope_utils.ROPE_INIT_FUNCTIONS"
    return ", ".join(repr(name) for name in ("default", *ROPE_INIT_FUNCTIONS))


def read_config_facts(
    model: Any,
    auto_class: str | None,
    trust_remote_code: bool,
    revision: str | None,
    config_kwargs: Mapping[str, Any] | None = None,
) -> tuple[ModelFacts, bool]:
    """The facts, and whether the checkpoint dtype came from the weights rather than the config."""
    config = load_config(model, trust_remote_code, revision, config_kwargs)
    check_sizes(config, str(model) if not hasattr(model, "model_type") else config.model_type)
    auto_class = auto_class or default_auto_class(config)
    text_config = text_of(config)
    checkpoint_dtype = _normalise_dtype(getattr(config, "dtype", None))
    dtype_from_weights = checkpoint_dtype not in ("float32", "float16", "bfloat16")
    if dtype_from_weights:
        # No (or "auto") dtype in the config: transformers' dtype="auto" then reads the weights
        # (`_get_dtype` in modeling_utils.py); so do we, from the safetensors header alone.
        checkpoint_dtype = None if not isinstance(model, str) else weights_dtype(model, revision, config_kwargs)
    source = model if isinstance(model, str) else str(getattr(config, "_name_or_path", "") or "")
    cls = model_class_for(config, auto_class, trust_remote_code, source, revision)
    try:
        meta = meta_model(cls, copy.deepcopy(config))  # building a model writes into its config
    except KeyError as exc:
        # transformers looks an unknown rope_type up in ROPE_INIT_FUNCTIONS (modeling_rope_utils.py) and raises a
        # bare KeyError when the rotary embedding is built.
        rope = [getattr(config, a, None) for a in ("rope_parameters", "rope_scaling")]
        what = (
            f"its RoPE rope_type {exc}, which transformers does not know (it builds {_rope_types()})"
            if exc.args and repr(exc.args[0]) in repr(rope)
            else f"a value transformers cannot look up ({exc})"
        )
        raise ModelConfigError(
            f"transformers could not build {cls.__name__} from the config of {source or config.model_type!r}: "
            f"config.json has {what}. Fix that value in config.json (rope_parameters / rope_scaling for a RoPE "
            "setting), or remove it."
        ) from exc
    except (RuntimeError, ValueError, ZeroDivisionError, TypeError, AttributeError, OverflowError) as exc:
        # Values each valid alone that do not fit together (e.g. a hidden size the heads do not divide).
        raise ModelConfigError(
            f"transformers could not build {cls.__name__} from the config of {source or config.model_type!r}: "
            f"{type(exc).__name__}: {str(exc).rstrip('.')}. Check config.json's sizes (hidden_size, "
            "num_attention_heads, "
            "head_dim, ...) against each other."
        ) from exc
    shapes = _linear_shapes(meta)
    linear = sorted({leaf for leaf, _, _ in shapes})
    experts = sorted(
        {
            re.sub(r"^.*?\.\d+\.", "", name)
            for name, param in meta.named_parameters()
            if param.ndim == 3 and ".experts." in f".{name}"
        }
    )
    quantization = _stored_quantization(config, meta)
    hidden = largest_int(text_config, "hidden_size")
    heads = largest_int(text_config, "num_attention_heads")
    size = head_dim(text_config)
    head_dims, qk_v = _head_dims(text_config, size)
    compatible = getattr(cls, "_compatible_flash_implementations", None)
    # The attention flags ModelFacts names, then each one an attention backend's record names (attention_backends.py).
    flags = {flag: bool(getattr(cls, flag, False)) for flag in (*NAMED_FLAGS, *class_flags())}
    facts = ModelFacts(
        source=model if isinstance(model, str) else (getattr(config, "_name_or_path", "") or config.model_type),
        model_type=str(config.model_type),
        model_class=cls.__name__,
        auto_class=auto_class,
        supports_flash=flags["_supports_flash_attn"],
        supports_sdpa=flags["_supports_sdpa"],
        supports_flex=flags["_supports_flex_attn"],
        parameters=sum(p.numel() for p in meta.parameters()),
        checkpoint_dtype=checkpoint_dtype,
        head_dim=size,
        num_layers=largest_int(text_config, "num_hidden_layers"),
        hidden_size=hidden,
        sliding_window=largest_int(text_config, "sliding_window"),
        softcap=next(iter(layer_values(text_config, "attn_logit_softcapping")), None),
        final_softcap=next(iter(layer_values(text_config, "final_logit_softcapping")), None),
        quantized=quantization.method if quantization is not None else None,
        quantization=quantization,
        remote_code=bool(getattr(config, "auto_map", None)),
        linear_names=tuple(linear),
        linear_shapes=tuple((leaf, i, o, n) for (leaf, i, o), n in sorted(shapes.items())),
        vocab_size=largest_int(text_config, "vocab_size"),
        conv1d=any(type(m).__name__ == "Conv1D" for m in meta.modules()),
        head_dims=head_dims,
        qk_v_head_dims=qk_v,
        expert_parameters=tuple(experts),
        compatible_flash=tuple(compatible) if compatible is not None else None,
        attention_heads=heads,
        kv_heads=largest_int(text_config, "num_key_value_heads") or heads,
        tp_plan=bool(getattr(text_config, "base_model_tp_plan", None)),
        generation=_generation_facts(config, cls, model, revision, config_kwargs) if generates(auto_class) else None,
        # gpt-oss and its kin declare `self.sinks = nn.Parameter(torch.empty(num_attention_heads))` per attention.
        no_split_modules=tuple(str(n) for n in getattr(cls, "_no_split_modules", None) or ()),
        attention_sinks=any(name.rpartition(".")[2] == "sinks" for name, _ in meta.named_parameters()),
        sub_model_sdpa=_sub_model_sdpa(meta),
        class_flags=tuple((flag, value) for flag, value in flags.items() if flag not in NAMED_FLAGS),
    )
    return facts, dtype_from_weights


def _sub_model_sdpa(meta: Any) -> tuple[tuple[str, bool], ...]:
    """(sub-config name, whether the module built from it supports SDPA) for each sub-config of the meta
    model that a module of its own was built from (transformers builds a sub-model from the sub-config object)."""
    found = []
    config = meta.config
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        owner = next(
            (m for m in meta.modules() if m is not meta and getattr(m, "config", None) is sub and sub is not None),
            None,
        )
        if owner is not None:
            found.append((str(key), bool(getattr(owner, "_supports_sdpa", False))))
    return tuple(found)


def _generation_facts(
    config: Any, cls: type, model: Any, revision: str | None, config_kwargs: Mapping[str, Any] | None = None
) -> GenerationFacts | None:
    """The KV-cache layout from the config already read (and the checkpoint's generation_config.json);
    None when the decoder's layers cannot be read the way transformers' caches read them."""
    where = dict(config_kwargs or {})
    generation_config = (
        checkpoint_generation_config(model, revision, where.get("subfolder") or "", where.get("cache_dir"))
        if isinstance(model, str)
        else {}
    )
    try:
        return read_generation_facts(config, cls, generation_config)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError):
        # get_layer_types_and_kwargs on a config it does not describe (e.g. an encoder without layer sizes)
        return None


def _linear_shapes(meta: Any) -> dict[tuple[str, int, int], int]:
    """(leaf name, in, out) -> how many, for the decoder's projections (heads excluded). GPT-2 style
    models use transformers' Conv1D (weight stored transposed) for them; peft's LoRA wraps both.

    The head is excluded as peft's "all-linear" excludes it (peft 0.21 tuners/tuners_utils.py:
    `_maybe_include_all_linear_layers` drops `model.get_output_embeddings()`, whatever its name: RWKV's `head`,
    GPT-NeoX-Japanese's `embed_out`), and by the usual names where a class has no output embeddings."""
    import torch

    try:
        output = meta.get_output_embeddings()
    except (AttributeError, NotImplementedError, TypeError):
        output = None
    shapes: dict[tuple[str, int, int], int] = {}
    for name, module in meta.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in {"lm_head", "score", "classifier"} or (output is not None and module is output):
            continue
        if isinstance(module, torch.nn.Linear):
            key = (leaf, module.in_features, module.out_features)
        elif type(module).__name__ == "Conv1D":
            key = (leaf, int(module.weight.shape[0]), int(module.weight.shape[1]))
        else:
            continue
        shapes[key] = shapes.get(key, 0) + 1
    return shapes


def _stored_quantization(config: Any, meta: Any) -> CheckpointQuantization | None:
    """How a pre-quantized checkpoint stores its weights: the weights its method keeps quantized, counted
    on the meta model as its quantizer picks them (facts/stored_weights.py); None when it is not quantized."""
    quantization = read_quantization_config(getattr(config, "quantization_config", None))
    if quantization is None:
        return None
    import torch

    output = meta.get_output_embeddings() if hasattr(meta, "get_output_embeddings") else None
    modules = dict(meta.named_modules())

    def kind(name: str, param: Any) -> str:
        owner = modules.get(name.rpartition(".")[0])
        if output is not None and owner is output:
            return "output"
        if name.endswith(".weight") and isinstance(owner, torch.nn.Linear):
            return "linear"
        return "expert" if param.ndim == 3 and ".experts." in f".{name}" else "other"

    return count_quantized(
        quantization, ((name, kind(name, param), param.numel()) for name, param in meta.named_parameters())
    )


# Config attributes that hold an attention head dimension (transformers 5.x configuration_*.py):
# the usual one, sliding-window / global variants, and MLA's query-key and value dims.
_HEAD_DIM_ATTRIBUTES = (
    "head_dim",
    "swa_head_dim",
    "global_head_dim",
    "attention_head_dim",
    "qk_head_dim",
    "v_head_dim",
)


def _head_dims(config: Any, head_dim: int | None) -> tuple[tuple[int, ...], tuple[int, int] | None]:
    values = (v for a in _HEAD_DIM_ATTRIBUTES for v in layer_values(config, a))  # every layer's
    found = {int(v) for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    if head_dim:
        found.add(int(head_dim))
    qk, v = largest_int(config, "qk_head_dim"), largest_int(config, "v_head_dim")
    nope = largest_int(config, "qk_nope_head_dim")
    if qk is None and nope is not None:
        qk = nope + (largest_int(config, "qk_rope_head_dim") or 0)
        found.add(int(qk))
    pair = (int(qk), int(v)) if isinstance(qk, int) and isinstance(v, int) and qk != v else None
    return tuple(sorted(found)), pair
