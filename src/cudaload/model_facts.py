"""What a model's config says, without loading weights.

`read_model_facts()` reads the config (local path, hub id through the cache, or a
`PretrainedConfig`), resolves the model class the Auto class would pick, and counts
parameters by building the model on the meta device (no memory, no weights).

Building that meta model imports torch and the modeling code (seconds). For a local folder the
facts are cached per config.json, Auto class and transformers version, so planning a model seen
before reads JSON only (see `_cached_facts`).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any

from .errors import ModelConfigError, RemoteCodeError
from .facts.dtypes import canonical_dtype
from .facts.model import ModelFacts

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["read_model_facts", "resolve_auto_class"]


def _normalise_dtype(value: Any) -> str | None:
    if value is None:
        return None
    return canonical_dtype(value) or str(value).removeprefix("torch.")


def _load_config(model: Any, trust_remote_code: bool, revision: str | None) -> Any:
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return model
    name = str(model)
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, revision=revision)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise RemoteCodeError(
                f"{name!r} needs custom code from its repository to build its config, and "
                "trust_remote_code was not passed. cudaload never enables remote code for you: read the "
                "repository's code, then pass trust_remote_code=True yourself if you trust it."
            ) from exc
        raise ModelConfigError(
            f"Could not read the config of {name!r}: {exc}. Check that config.json is valid JSON written by "
            "save_pretrained()."
        ) from exc
    except (AttributeError, TypeError, KeyError) as exc:
        # transformers fails inside the config class on values it cannot take (e.g. "dtype": "auto"
        # in config.json makes 5.22 look up torch.auto): the file is the problem, not the network.
        raise ModelConfigError(
            f"transformers could not build the config of {name!r} from its config.json: "
            f'{type(exc).__name__}: {exc}. Fix that value in config.json (a "dtype" key can be removed: '
            "the weights' dtype is then used)."
        ) from exc
    except OSError as exc:
        if os.path.isdir(name):
            raise ModelConfigError(
                f"{name!r} is a local folder, but its config.json is missing or unreadable: {exc}. Save the model "
                "there with save_pretrained(), or pass the folder that holds config.json."
            ) from exc
        raise ModelConfigError(
            f"Could not read the config of {name!r}: it is not a local folder with a config.json and "
            "could not be fetched from the Hub (offline, not cached, or a wrong id). Pass a local path, "
            f"or download it first while online. Cause: {exc}"
        ) from exc


def _remote_class(reference: str, source: str, revision: str | None) -> type:
    """The custom class `reference` ("modeling_x.XForCausalLM") from the model's own code: only
    called once the caller passed trust_remote_code=True, as from_pretrained would then do."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    try:
        return get_class_from_dynamic_module(reference, source, revision=revision)
    except Exception as exc:  # the custom code itself failed: the model's problem, said as such
        raise ModelConfigError(
            f"trust_remote_code=True: the model's custom class {reference} could not be imported from {source!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def resolve_auto_class(name: str) -> Any:
    """The transformers Auto class called `name` (e.g. "AutoModelForCausalLM").

    Raises:
        ModelConfigError: transformers has no Auto class of that name with `from_pretrained`.
    """
    import transformers

    auto = getattr(transformers, name, None)
    if auto is None or not hasattr(auto, "from_pretrained"):
        raise ModelConfigError(
            f"model_class={name!r}: transformers has no such Auto class. Pass the name of one, e.g. "
            "'AutoModelForCausalLM' or 'AutoModelForSequenceClassification'."
        )
    return auto


def _model_class(
    config: Any, auto_class: str, trust_remote_code: bool = False, source: str = "", revision: str | None = None
) -> type:
    auto = resolve_auto_class(auto_class)
    auto_map = getattr(config, "auto_map", None) or {}
    # With trust_remote_code=True, from_pretrained prefers the repository's class to the library's.
    if trust_remote_code and auto_class in auto_map and source:
        reference = auto_map[auto_class]
        return _remote_class(reference if isinstance(reference, str) else reference[0], source, revision)
    if type(config) in auto._model_mapping:
        return auto._model_mapping[type(config)]  # type: ignore[no-any-return]
    if auto_class in auto_map:
        raise RemoteCodeError(
            f"{config.model_type!r} is implemented by custom code in its repository ({auto_map[auto_class]}), "
            "not by transformers. cudaload never enables remote code for you: pass trust_remote_code=True "
            "if you have read and trust that code."
        )
    raise ModelConfigError(
        f"{auto_class} does not support model type {config.model_type!r}. Pass model_class= with the right "
        "Auto class (e.g. AutoModel, AutoModelForSequenceClassification)."
    )


def _meta_model(cls: type, config: Any) -> Any:
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=True):
        try:
            return cls._from_config(config, dtype=torch.float32)  # type: ignore[attr-defined]
        except TypeError:
            return cls(config)


def read_model_facts(
    model: Any,
    *,
    auto_class: str = "AutoModelForCausalLM",
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> ModelFacts:
    """Facts about `model` (a path, a hub id or a PretrainedConfig) from its config alone.

    No weights are read: the parameters are counted on a model built on the meta device (seconds
    the first time, for the imports). For a local folder the facts are cached per config.json,
    Auto class and transformers version, so a model seen before costs a JSON read.

    Args:
        model: A local folder (str), a Hub id (read through the local cache; with
            HF_HUB_OFFLINE=1 only what is cached) or a transformers `PretrainedConfig`.
        auto_class: The transformers Auto class whose model class is described (default
            "AutoModelForCausalLM"; e.g. "AutoModel", "AutoModelForSequenceClassification").
        trust_remote_code: Allow the repository's own code for its config and class (default
            False; never set for you). Facts of remote-code models are not cached.
        revision: The Hub revision (branch, tag or commit) to read; default None: the main one.

    Returns:
        The `ModelFacts`.

    Raises:
        ModelConfigError: the config cannot be read (a folder without a valid config.json, a Hub
            id that is not cached offline or does not exist), `auto_class` is not a transformers
            Auto class or does not support the model type, or the repository's custom class
            cannot be imported.
        RemoteCodeError: the config or class is defined by the repository's code and
            `trust_remote_code` is False.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = str(build_tiny_model(tempfile.mkdtemp()))
        >>> facts = cudaload.read_model_facts(path)
        >>> facts.model_class, facts.parameters, facts.supports_sdpa
        ('Qwen3ForCausalLM', 139648, True)
        >>> cudaload.read_model_facts(path, auto_class="AutoModel").model_class
        'Qwen3Model'
    """
    cache = _facts_cache_file(model, auto_class) if not trust_remote_code else None
    if cache is not None:
        cached = _cached_facts(cache, str(model))
        if cached is not None:
            return cached
    facts, dtype_from_weights = _read_model_facts(model, auto_class, trust_remote_code, revision)
    if cache is not None:
        from .capability.cache import write_json

        write_json(cache, {"schema": _FACTS_SCHEMA, "dtype_from_weights": dtype_from_weights, "facts": asdict(facts)})
    return facts


def _read_model_facts(
    model: Any, auto_class: str, trust_remote_code: bool, revision: str | None
) -> tuple[ModelFacts, bool]:
    """The facts, and whether the checkpoint dtype came from the weights rather than the config."""
    config = _load_config(model, trust_remote_code, revision)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    checkpoint_dtype = _normalise_dtype(getattr(config, "dtype", None))
    dtype_from_weights = checkpoint_dtype not in ("float32", "float16", "bfloat16")
    if dtype_from_weights:
        # No (or "auto") dtype in the config: transformers' dtype="auto" then reads the weights
        # (`_get_dtype` in modeling_utils.py); so do we, from the safetensors header alone.
        checkpoint_dtype = None if not isinstance(model, str) else _weights_dtype(model, revision)
    source = model if isinstance(model, str) else str(getattr(config, "_name_or_path", "") or "")
    cls = _model_class(config, auto_class, trust_remote_code, source, revision)
    meta = _meta_model(cls, copy.deepcopy(config))  # building a model writes into its config
    import torch

    # GPT-2 style models use transformers' Conv1D (weight stored transposed) for their
    # projections; peft's LoRA wraps both.
    shapes: dict[tuple[str, int, int], int] = {}
    for name, module in meta.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in {"lm_head", "score", "classifier"}:
            continue
        if isinstance(module, torch.nn.Linear):
            key = (leaf, module.in_features, module.out_features)
        elif type(module).__name__ == "Conv1D":
            key = (leaf, int(module.weight.shape[0]), int(module.weight.shape[1]))
        else:
            continue
        shapes[key] = shapes.get(key, 0) + 1
    linear = sorted({leaf for leaf, _, _ in shapes})
    experts = sorted(
        {
            re.sub(r"^.*?\.\d+\.", "", name)
            for name, param in meta.named_parameters()
            if param.ndim == 3 and ".experts." in f".{name}"
        }
    )
    quant = getattr(config, "quantization_config", None)
    quant_method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    hidden = getattr(text_config, "hidden_size", None)
    heads = getattr(text_config, "num_attention_heads", None)
    head_dim = getattr(text_config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    head_dims, qk_v = _head_dims(text_config, head_dim)
    compatible = getattr(cls, "_compatible_flash_implementations", None)
    facts = ModelFacts(
        source=model if isinstance(model, str) else (getattr(config, "_name_or_path", "") or config.model_type),
        model_type=str(config.model_type),
        model_class=cls.__name__,
        auto_class=auto_class,
        supports_flash=bool(getattr(cls, "_supports_flash_attn", False)),
        supports_sdpa=bool(getattr(cls, "_supports_sdpa", False)),
        supports_flex=bool(getattr(cls, "_supports_flex_attn", False)),
        parameters=sum(p.numel() for p in meta.parameters()),
        checkpoint_dtype=checkpoint_dtype,
        head_dim=head_dim,
        num_layers=getattr(text_config, "num_hidden_layers", None),
        hidden_size=hidden,
        sliding_window=getattr(text_config, "sliding_window", None),
        softcap=getattr(text_config, "attn_logit_softcapping", None),
        quantized=str(quant_method) if quant_method else None,
        remote_code=bool(getattr(config, "auto_map", None)),
        linear_names=tuple(linear),
        linear_shapes=tuple((leaf, i, o, n) for (leaf, i, o), n in sorted(shapes.items())),
        vocab_size=getattr(text_config, "vocab_size", None),
        conv1d=any(type(m).__name__ == "Conv1D" for m in meta.modules()),
        head_dims=head_dims,
        qk_v_head_dims=qk_v,
        expert_parameters=tuple(experts),
        compatible_flash=tuple(compatible) if compatible is not None else None,
        attention_heads=heads,
        kv_heads=getattr(text_config, "num_key_value_heads", None) or heads,
        tp_plan=bool(getattr(text_config, "base_model_tp_plan", None)),
    )
    return facts, dtype_from_weights


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _weights_dtype(model: str, revision: str | None) -> str | None:
    """The floating dtype holding most of the weights, read from a safetensors header (the first
    8 bytes give the JSON header's length; no tensor is read). None when there is no local file."""
    import json
    import struct

    path = _weights_file(model, revision)
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error):
        return None
    counts: dict[str, int] = {}
    for name, entry in header.items():
        dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype", "")) if name != "__metadata__" else None
        if dtype is not None:
            size = 1
            for dim in entry.get("shape", ()):
                size *= int(dim)
            counts[dtype] = counts.get(dtype, 0) + size
    return max(counts, key=lambda d: counts[d]) if counts else None


def _weights_file(model: str, revision: str | None) -> str | None:
    """A local safetensors file of `model` (a folder, or a Hub id already in the cache)."""
    import json
    from pathlib import Path

    def find(name: str) -> str | None:
        if os.path.isdir(model):
            candidate = os.path.join(model, name)
            return candidate if os.path.isfile(candidate) else None
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, name, revision=revision)
        return cached if isinstance(cached, str) else None

    single = find("model.safetensors")
    if single is not None:
        return single
    index = find("model.safetensors.index.json")
    if index is None:
        return None
    try:
        weight_map = json.loads(Path(index).read_text())["weight_map"]
        return find(next(iter(weight_map.values())))
    except (OSError, ValueError, KeyError, StopIteration):
        return None


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
    found = {int(v) for a in _HEAD_DIM_ATTRIBUTES if isinstance(v := getattr(config, a, None), int) and v > 0}
    if head_dim:
        found.add(int(head_dim))
    qk, v = getattr(config, "qk_head_dim", None), getattr(config, "v_head_dim", None)
    if qk is None and isinstance(getattr(config, "qk_nope_head_dim", None), int):
        qk = config.qk_nope_head_dim + (getattr(config, "qk_rope_head_dim", 0) or 0)
        found.add(int(qk))
    pair = (int(qk), int(v)) if isinstance(qk, int) and isinstance(v, int) and qk != v else None
    return tuple(sorted(found)), pair


# The facts cache. A local folder's facts depend on its config.json, the Auto class, the installed
# transformers (its classes and their `_supports_*` flags) and this code; the key holds all four.
# Only the checkpoint dtype can change without config.json changing (new weights, no "dtype" in
# the config): it is then re-read from the safetensors header, which costs no import.
_FACTS_SCHEMA = 1


def _facts_cache_file(model: Any, auto_class: str) -> Path | None:
    """The cache file for a local folder's facts, or None (a Hub id, a config object, no config.json)."""
    if not isinstance(model, str) or not os.path.isdir(model):
        return None
    try:
        with open(os.path.join(model, "config.json"), "rb") as handle:
            config_hash = hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None
    from . import __version__
    from .capability.cache import cache_dir, cache_key
    from .capability.software import installed_versions

    transformers_version = installed_versions().get("transformers")
    if transformers_version is None:
        return None
    key = cache_key(
        {
            "schema": _FACTS_SCHEMA,
            "config": config_hash,
            "auto_class": auto_class,
            "transformers": transformers_version,
            "cudaload": __version__,
        }
    )
    return cache_dir() / "model-facts" / f"{key}.json"


def _cached_facts(path: Path, source: str) -> ModelFacts | None:
    from .capability.cache import read_json

    data = read_json(path)
    if data is None or data.get("schema") != _FACTS_SCHEMA:
        return None
    try:
        fields = {f.name: data["facts"][f.name] for f in dataclass_fields(ModelFacts)}
    except (KeyError, TypeError):
        return None
    fields["source"] = source
    for name in ("linear_names", "head_dims", "expert_parameters"):
        fields[name] = tuple(fields[name])
    fields["linear_shapes"] = tuple(tuple(shape) for shape in fields["linear_shapes"])
    for name in ("qk_v_head_dims", "compatible_flash"):
        fields[name] = tuple(fields[name]) if fields[name] is not None else None
    if data.get("dtype_from_weights"):
        fields["checkpoint_dtype"] = _weights_dtype(source, None)
    return ModelFacts(**fields)
