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
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..errors import MissingPackageError, ModelConfigError, RemoteCodeError, SettingError, describe_error
from ..facts.dtypes import canonical_dtype
from ..facts.kv_cache import GenerationFacts
from ..facts.model import ModelFacts, generates
from ..facts.stored_weights import CheckpointQuantization, count_quantized, read_quantization_config
from ..upstream_imports import import_transformers
from .kv_layout import checkpoint_generation_config, head_dim, read_generation_facts

if TYPE_CHECKING:
    from pathlib import Path

    from transformers import PretrainedConfig

__all__ = ["default_auto_class", "model_class_name", "read_model_facts", "resolve_auto_class", "upstream_placement"]


def _normalise_dtype(value: Any) -> str | None:
    if value is None:
        return None
    return canonical_dtype(value) or str(value).removeprefix("torch.")


def _load_config(
    model: Any, trust_remote_code: bool, revision: str | None, config_kwargs: Mapping[str, Any] | None = None
) -> Any:
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return model
    name = str(model)
    extra = dict(config_kwargs or {})
    _check_config_file(name)
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, revision=revision, **extra)
    except ImportError as exc:
        if "gguf_file" in extra:  # transformers reads a GGUF file's metadata with the `gguf` package
            raise MissingPackageError(
                f"gguf_file={extra['gguf_file']!r}: transformers reads a GGUF file with the gguf package, which is "
                f"not installed here ({describe_error(exc)}). Install it (pip install gguf), or load a "
                "safetensors checkpoint."
            ) from exc
        raise
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise RemoteCodeError(
                f"{name!r} needs custom code from its repository to build its config, and "
                "trust_remote_code was not passed. cudaload never enables remote code for you: read the "
                "repository's code, then pass trust_remote_code=True yourself if you trust it."
            ) from exc
        raise ModelConfigError(
            f"Could not read the config of {name!r}: {str(exc).rstrip('.')}. {_what_the_folder_holds(name, extra)}"
        ) from exc
    except _config_validation_errors() as exc:
        # transformers 5 configs are strict dataclasses: huggingface_hub names the field and the value.
        raise ModelConfigError(f"{name!r}: config.json has a value its config class refuses: {exc}") from exc
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
            folder = os.path.join(name, str(extra.get("subfolder") or ""))
            if os.path.isfile(os.path.join(folder, "config.json")) and not extra.get("gguf_file"):
                raise ModelConfigError(
                    f"{name!r} is a local folder, but its config.json is missing or unreadable: "
                    f"{str(exc).rstrip('.')}. Save the model there with save_pretrained(), or pass the folder that "
                    "holds config.json."
                ) from exc
            raise ModelConfigError(
                f"{name!r} is a local folder, but transformers could not read its config: {str(exc).rstrip('.')}. "
                f"{_what_the_folder_holds(name, extra)}"
            ) from exc
        raise ModelConfigError(
            f"Could not read the config of {name!r}: it is not a local folder with a config.json and "
            "could not be fetched from the Hub (offline, not cached, or a wrong id). Pass a local path, "
            f"or download it first while online. Cause: {exc}"
        ) from exc


def _what_the_folder_holds(name: str, config_kwargs: Mapping[str, Any]) -> str:
    """What to do, from what a local folder really holds: a PEFT adapter, GGUF files, models in subfolders,
    a config.json that is there but not valid, or no config.json at all (never "check config.json is valid
    JSON" when there is none)."""
    folder = os.path.join(name, str(config_kwargs.get("subfolder") or ""))
    if not os.path.isdir(folder):
        return "Check the path (and subfolder=), or the Hub id."
    entries = sorted(os.listdir(folder))
    config = os.path.join(folder, "config.json")
    if os.path.isfile(os.path.join(folder, "adapter_config.json")) and not os.path.isfile(config):
        base = _adapter_base(os.path.join(folder, "adapter_config.json"))
        return (
            f"It is a PEFT adapter (adapter_config.json{f', base model {base!r}' if base else ''}), not a model: "
            "cudaload plans and loads the base model. Load the base with cudaload.load(base) (or "
            "load_for_finetune(base) to train on), then attach the adapter: "
            f"peft.PeftModel.from_pretrained(model, {folder!r})."
        )
    if config_kwargs.get("gguf_file"):
        return (
            f"transformers read the config from gguf_file={config_kwargs['gguf_file']!r}'s metadata: check that it "
            "is a complete GGUF file of a model type transformers converts, and that it is in this folder."
        )
    gguf = [e for e in entries if e.endswith(".gguf")]
    if gguf:
        return f"It holds GGUF file(s) {gguf[:3]}: pass gguf_file={gguf[0]!r} to read one."
    inner = [e for e in entries if os.path.isfile(os.path.join(folder, e, "config.json"))]
    if inner and not os.path.isfile(config):
        return f"It has no config.json, but {inner[:3]} do: pass subfolder={inner[0]!r} to read that model."
    if os.path.isfile(config):
        return "Check that its config.json is valid JSON with a model_type, as save_pretrained() writes it."
    shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "") if entries else "nothing"
    return (
        f"It has no config.json (it holds {shown}). Save the model there with save_pretrained(), or pass the "
        "folder that holds config.json."
    )


def _adapter_base(path: str) -> str | None:
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            base = json.load(handle).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return base if isinstance(base, str) else None


def _check_config_file(name: str) -> None:
    """A local folder's config.json must be a regular file of sane size before transformers opens
    it: a FIFO would block the read forever and a symlink to /dev/zero would fill memory."""
    import stat

    from .cache import MAX_READ_BYTES

    path = os.path.join(name, "config.json")
    if not os.path.isdir(name) or not os.path.lexists(path):
        return  # a Hub id, or a folder without one: transformers' own error says so
    try:
        info = os.stat(path)  # stat opens nothing, so a FIFO does not block it
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_READ_BYTES:
        kind = "is not a regular file" if not stat.S_ISREG(info.st_mode) else f"is {info.st_size:,} bytes"
        raise ModelConfigError(
            f"{path} {kind}: cudaload reads only a regular config.json of at most {MAX_READ_BYTES >> 20} MiB "
            "(a FIFO or a device would hang or fill memory). Save the model with save_pretrained()."
        )


def _config_validation_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's strict-dataclass validation errors (transformers 5 configs), when it has them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: configs are not validated there
        return ()
    return (StrictDataclassError,)


# Config sizes the meta model is built from: each an int > 0 (a bool is not one). Bounds far above
# any real model (layers and heads: 65,536; widths and vocabularies: 2**26) keep a typo such as
# 10**12 from building a model for minutes or exhausting memory.
_SIZE_FIELDS = {
    "num_hidden_layers": 1 << 16,
    "n_layer": 1 << 16,
    "num_attention_heads": 1 << 16,
    "n_head": 1 << 16,
    "num_key_value_heads": 1 << 16,
    "num_local_experts": 1 << 16,
    "num_experts": 1 << 16,
    "hidden_size": 1 << 26,
    "n_embd": 1 << 26,
    "intermediate_size": 1 << 26,
    "moe_intermediate_size": 1 << 26,
    "head_dim": 1 << 26,
    "vocab_size": 1 << 26,
    "max_position_embeddings": 1 << 26,
    "n_positions": 1 << 26,
}


def _check_sizes(config: Any, name: str) -> None:
    """Raise ModelConfigError naming the first config size that is not a positive int in bounds."""
    configs = [config]
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:
        configs.append(text)
    for part in configs:
        for field, bound in _SIZE_FIELDS.items():
            value = getattr(part, field, None)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= bound:
                where = "" if part is config else f" (in {type(part).__name__})"
                raise ModelConfigError(
                    f"{name!r}: config.json has {field}={value!r}{where}; it must be a whole number from 1 to "
                    f"{bound:,}. Fix that value in config.json (save_pretrained() writes a valid one)."
                )


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
    """The transformers class called `name`: an Auto class (e.g. "AutoModelForCausalLM") or a model
    class (e.g. "BertModel").

    Raises:
        ModelConfigError: transformers has no class of that name with `from_pretrained`.
    """
    import transformers

    auto = getattr(transformers, name, None)
    if auto is None or not hasattr(auto, "from_pretrained"):
        raise ModelConfigError(
            f"model_class={name!r}: transformers has no such Auto class or model class. Pass the name of one, "
            "e.g. 'AutoModelForCausalLM', 'AutoModelForSequenceClassification' or 'BertModel'."
        )
    return auto


def model_class_name(value: Any) -> str | None:
    """`model_class=` as the name of a transformers class: a name is kept, a transformers class (an
    Auto class or a model class such as `BertModel`) gives its name; None stays None (the class is
    then read from the config, `default_auto_class`).

    Raises:
        SettingError: anything else, or a class transformers does not export under its name.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    name = getattr(value, "__name__", None)
    if isinstance(value, type) and name and hasattr(value, "from_pretrained"):
        import transformers

        if getattr(transformers, name, None) is value:
            return str(name)
        raise SettingError(
            f"model_class={value!r}: cudaload loads through classes transformers exports, and this one is not "
            f"transformers.{name}. Pass a transformers Auto class (e.g. AutoModelForSequenceClassification) or "
            "model class (e.g. BertModel), or its name."
        )
    raise SettingError(
        f"model_class={value!r:.60} ({type(value).__name__}): pass a transformers Auto class or model class, or "
        "its name (e.g. 'AutoModelForSequenceClassification', 'BertModel'); leave it unset to load the "
        "checkpoint's own architecture (config.json's 'architectures')."
    )


# The Auto classes a checkpoint's architecture is looked up in, most specific first: the first whose
# mapping for the model type names `config.architectures[0]` is the one it was saved from.
_ARCHITECTURE_AUTO_CLASSES = (
    "AutoModelForCausalLM",
    "AutoModelForSeq2SeqLM",
    "AutoModelForImageTextToText",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForQuestionAnswering",
    "AutoModelForMaskedLM",
    "AutoModelForPreTraining",
    "AutoModel",
)


def _mapped_names(auto: Any, model_type: str) -> tuple[str, ...]:
    """The class names an Auto class maps `model_type` to, without importing them."""
    names = getattr(getattr(auto, "_model_mapping", None), "_model_mapping", {}).get(model_type)
    return (names,) if isinstance(names, str) else tuple(names or ())


def default_auto_class(config: Any) -> str:
    """The Auto class that loads the checkpoint as it was saved.

    transformers' own rule for `AutoModel*.from_pretrained` is the caller's class; the checkpoint's
    is `config.architectures` (written by `save_pretrained`). An encoder saved as `BertModel` is
    loaded through AutoModel, never AutoModelForCausalLM, which would give it an untrained
    `BertLMHeadModel` head. Without `architectures` (a config built in code), a causal LM when the
    model type has one and is not an encoder (one with a masked-LM head that is not a decoder),
    else the base model.
    """
    import transformers

    model_type = str(getattr(config, "model_type", ""))
    architectures = getattr(config, "architectures", None) or ()
    auto_map = getattr(config, "auto_map", None) or {}
    for architecture in architectures[:1]:
        for name in _ARCHITECTURE_AUTO_CLASSES:
            if architecture in _mapped_names(getattr(transformers, name), model_type):
                return name
        for name, reference in auto_map.items():  # the repository's own classes
            refs = (reference,) if isinstance(reference, str) else tuple(reference)
            if any(str(ref).rsplit(".", 1)[-1] == architecture for ref in refs if ref):
                return str(name)
    if getattr(config, "is_encoder_decoder", False) and _mapped_names(transformers.AutoModelForSeq2SeqLM, model_type):
        return "AutoModelForSeq2SeqLM"
    causal = _mapped_names(transformers.AutoModelForCausalLM, model_type) or "AutoModelForCausalLM" in auto_map
    encoder = _mapped_names(transformers.AutoModelForMaskedLM, model_type) and not getattr(config, "is_decoder", False)
    return "AutoModelForCausalLM" if causal and not encoder else "AutoModel"


def _model_class(
    config: Any, auto_class: str, trust_remote_code: bool = False, source: str = "", revision: str | None = None
) -> type:
    auto = resolve_auto_class(auto_class)
    if not hasattr(auto, "_model_mapping"):  # a model class (e.g. BertModel), not an Auto class
        expected = getattr(auto, "config_class", None)
        if expected is not None and not isinstance(config, expected):
            raise ModelConfigError(
                f"model_class={auto_class!r} takes a {expected.__name__}, but this checkpoint's config is a "
                f"{type(config).__name__} (model type {config.model_type!r}). Pass a class for that model type, "
                "or an Auto class."
            )
        return auto  # type: ignore[no-any-return]
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
        config = _load_config(model, trust_remote_code, revision)
        meta = _meta_model(_model_class(config, auto_class, trust_remote_code, str(model), revision), config)
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


def read_model_facts(
    model: str | os.PathLike[str] | PretrainedConfig,
    *,
    auto_class: str | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    config_kwargs: Mapping[str, Any] | None = None,
) -> ModelFacts:
    """Facts about `model` (a path, a hub id or a PretrainedConfig) from its config alone.

    No weights are read: the parameters are counted on a model built on the meta device (seconds
    the first time, for the imports). For a local folder the facts are cached per config.json,
    Auto class and transformers version, so a model seen before costs a JSON read.

    Args:
        model: A local folder (str), a Hub id (read through the local cache; with
            HF_HUB_OFFLINE=1 only what is cached) or a transformers `PretrainedConfig`.
        auto_class: The transformers Auto class (or model class) whose model class is described
            (e.g. "AutoModel", "AutoModelForSequenceClassification"). Default None: the
            checkpoint's own, from config.json's "architectures" (`default_auto_class`).
        trust_remote_code: Allow the repository's own code for its config and class (default
            False; never set for you). Facts of remote-code models are not cached.
        revision: The Hub revision (branch, tag or commit) to read; default None: the main one.
        config_kwargs: The other from_pretrained arguments that choose which files are read
            (`subfolder`, `cache_dir`, `gguf_file`, `token`, ...), passed to
            `AutoConfig.from_pretrained` as from_pretrained passes them; facts read with any are
            not cached. Default None.

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
    cache = _facts_cache_file(model, auto_class) if not trust_remote_code and not config_kwargs else None
    if cache is not None:
        cached = _cached_facts(cache, str(model))
        if cached is not None:
            return cached
    import_transformers()  # a cached model is planned without transformers; this one is read with it
    facts, dtype_from_weights = _read_model_facts(model, auto_class, trust_remote_code, revision, config_kwargs or {})
    if cache is not None:
        from .cache import write_json

        write_json(cache, {"schema": _FACTS_SCHEMA, "dtype_from_weights": dtype_from_weights, "facts": asdict(facts)})
    return facts


def _read_model_facts(
    model: Any,
    auto_class: str | None,
    trust_remote_code: bool,
    revision: str | None,
    config_kwargs: Mapping[str, Any] | None = None,
) -> tuple[ModelFacts, bool]:
    """The facts, and whether the checkpoint dtype came from the weights rather than the config."""
    config = _load_config(model, trust_remote_code, revision, config_kwargs)
    _check_sizes(config, str(model) if not hasattr(model, "model_type") else config.model_type)
    auto_class = auto_class or default_auto_class(config)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    checkpoint_dtype = _normalise_dtype(getattr(config, "dtype", None))
    dtype_from_weights = checkpoint_dtype not in ("float32", "float16", "bfloat16")
    if dtype_from_weights:
        # No (or "auto") dtype in the config: transformers' dtype="auto" then reads the weights
        # (`_get_dtype` in modeling_utils.py); so do we, from the safetensors header alone.
        checkpoint_dtype = None if not isinstance(model, str) else _weights_dtype(model, revision, config_kwargs)
    source = model if isinstance(model, str) else str(getattr(config, "_name_or_path", "") or "")
    cls = _model_class(config, auto_class, trust_remote_code, source, revision)
    try:
        meta = _meta_model(cls, copy.deepcopy(config))  # building a model writes into its config
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
    hidden = getattr(text_config, "hidden_size", None)
    heads = getattr(text_config, "num_attention_heads", None)
    size = head_dim(text_config)
    head_dims, qk_v = _head_dims(text_config, size)
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
        head_dim=size,
        num_layers=getattr(text_config, "num_hidden_layers", None),
        hidden_size=hidden,
        sliding_window=getattr(text_config, "sliding_window", None),
        softcap=getattr(text_config, "attn_logit_softcapping", None),
        final_softcap=getattr(text_config, "final_logit_softcapping", None),
        quantized=quantization.method if quantization is not None else None,
        quantization=quantization,
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
        generation=_generation_facts(config, cls, model, revision, config_kwargs) if generates(auto_class) else None,
        # gpt-oss and its kin declare `self.sinks = nn.Parameter(torch.empty(num_attention_heads))` per attention.
        attention_sinks=any(name.rpartition(".")[2] == "sinks" for name, _ in meta.named_parameters()),
    )
    return facts, dtype_from_weights


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
    models use transformers' Conv1D (weight stored transposed) for them; peft's LoRA wraps both."""
    import torch

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


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _weights_dtype(model: str, revision: str | None, config_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """The floating dtype holding most of the weights, read from a safetensors header (the first
    8 bytes give the JSON header's length; no tensor is read). None when there is no local file
    (or the weights are a GGUF file, which transformers dequantizes)."""
    import json
    import struct

    where = dict(config_kwargs or {})
    if where.get("gguf_file"):
        return None
    path = _weights_file(model, revision, where.get("subfolder") or "", where.get("cache_dir"))
    if path is None:
        return None
    import stat

    try:
        with open(path, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100_000_000:  # safetensors' own header limit (MAX_HEADER_SIZE)
                return None
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


def _weights_file(model: str, revision: str | None, subfolder: str = "", cache_dir: Any = None) -> str | None:
    """A local safetensors file of `model` (a folder, or a Hub id already in the cache), in `subfolder`
    and through `cache_dir` as transformers' `cached_file` looks them up."""
    import json
    from pathlib import Path

    def find(name: str) -> str | None:
        if os.path.isdir(model):
            candidate = os.path.join(model, subfolder, name)
            return candidate if os.path.isfile(candidate) else None
        from huggingface_hub import try_to_load_from_cache

        filename = f"{subfolder}/{name}" if subfolder else name
        cached = try_to_load_from_cache(model, filename, revision=revision, cache_dir=cache_dir)
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


# The facts cache. A local folder's facts depend on its config.json (and generation_config.json), the
# Auto class, the installed
# transformers (its classes and their `_supports_*` flags) and this code; the key holds all four.
# Only the checkpoint dtype can change without config.json changing (new weights, no "dtype" in
# the config): it is then re-read from the safetensors header, which costs no import.
_FACTS_SCHEMA = 4  # 2: ModelFacts.quantization; 3: ModelFacts.generation; 4: ModelFacts.attention_sinks


def _facts_cache_file(model: Any, auto_class: str | None) -> Path | None:
    """The cache file for a local folder's facts, or None (a Hub id, a config object, no config.json)."""
    if not isinstance(model, str) or not os.path.isdir(model):
        return None
    from .cache import read_regular_file

    # Only a regular file of at most 16 MiB is hashed: a FIFO would block, /dev/zero never end.
    config = read_regular_file(os.path.join(model, "config.json"))
    if config is None:
        return None  # no cache: the config is then read (and judged) as transformers reads it
    config_hash = hashlib.sha256(config).hexdigest()
    # The checkpoint's generation_config.json (its cache_implementation) is a fact too, and changes alone.
    generation_config = read_regular_file(os.path.join(model, "generation_config.json"))
    from ..installed import installed_versions
    from ..version import __version__
    from .cache import cache_dir, cache_key

    transformers_version = installed_versions().get("transformers")
    if transformers_version is None:
        return None
    key = cache_key(
        {
            "schema": _FACTS_SCHEMA,
            "config": config_hash,
            "generation_config": hashlib.sha256(generation_config).hexdigest() if generation_config else None,
            "auto_class": auto_class,
            "transformers": transformers_version,
            "cudaload": __version__,
        }
    )
    return cache_dir() / "model-facts" / f"{key}.json"


def _cached_facts(path: Path, source: str) -> ModelFacts | None:
    """The cached facts, or None when the file is missing, from another schema, or any field has a
    wrong type or a negative or non-finite number (then the facts are read again and rewritten)."""
    from dataclasses import replace

    from .cache import decode, read_json

    data = read_json(path, {"schema": int, "dtype_from_weights": bool, "facts": ModelFacts})
    if data is None or data["schema"] != _FACTS_SCHEMA:
        return None
    try:
        facts: ModelFacts = replace(decode(data["facts"], ModelFacts), source=source)
    except (TypeError, ValueError):  # a value the dataclass itself refuses
        return None
    if data["dtype_from_weights"]:
        facts = replace(facts, checkpoint_dtype=_weights_dtype(source, None))
    return facts
