"""What a model's config says, without loading weights.

`read_model_facts()` reads the config (local path, hub id through the cache, or a
`PretrainedConfig`), resolves the model class the Auto class would pick, and counts
parameters by building the model on the meta device (no memory, no weights).

Building that meta model imports torch and the modeling code (seconds). For a local folder the
facts are cached per config.json, Auto class and transformers version, so planning a model seen
before reads JSON only (`facts_cache.py`); reading the config itself is config_facts.py's, imported on a miss.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..facts.model import ModelFacts
from ..upstream_imports import import_transformers
from .facts_cache import cached_facts, facts_cache_file, write_cached_facts
from .weights_header import weights_dtype

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["read_model_facts"]


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
    cache = facts_cache_file(model, auto_class) if not trust_remote_code and not config_kwargs else None
    if cache is not None:
        cached = cached_facts(cache, str(model))
        if cached is not None:
            _warn_on_stored_dtype(model, cached, revision, config_kwargs)
            return _with_stored_float_dtype(model, cached, revision, config_kwargs)
    import_transformers()  # a cached model is planned without transformers; this one is read with it
    from .config_facts import read_config_facts  # and the modules that read a config: a cached model needs none

    facts, dtype_from_weights = read_config_facts(model, auto_class, trust_remote_code, revision, config_kwargs or {})
    if cache is not None:
        write_cached_facts(cache, facts, dtype_from_weights)
    _warn_on_stored_dtype(model, facts, revision, config_kwargs)
    return _with_stored_float_dtype(model, facts, revision, config_kwargs)


def _with_stored_float_dtype(
    model: Any, facts: ModelFacts, revision: str | None, config_kwargs: Mapping[str, Any] | None
) -> ModelFacts:
    """A bitsandbytes checkpoint's facts with the dtype its unquantized weights are stored in (option
    "stored_dtype", from the safetensors header: the float tensors, the packed uint8 ones left out), read on
    every plan as `_warn_on_stored_dtype` reads it: transformers loads them in that dtype whatever dtype= says
    (measured with transformers 5.22.2 and 5.25, bitsandbytes 0.50.2: a bf16-stored nf4 checkpoint loaded with
    dtype=float32 holds bf16 norms and embeddings), so the plan says it (policy/stored_dtype.py)."""
    quantization = facts.quantization
    if not isinstance(model, str) or quantization is None or quantization.method != "bitsandbytes":
        return facts
    stored = weights_dtype(model, revision, config_kwargs)
    if stored is None:
        return facts
    options = (*(o for o in quantization.options if o[0] != "stored_dtype"), ("stored_dtype", stored))
    return replace(facts, quantization=replace(quantization, options=options))


def _warn_on_stored_dtype(
    model: Any, facts: ModelFacts, revision: str | None, config_kwargs: Mapping[str, Any] | None
) -> None:
    """Warn when config.json names one float dtype and the safetensors header another (read on every
    plan, cached facts or not: a header read is one small file read). transformers follows the config
    (transformers 5.25 modeling_utils.py: PreTrainedModel.from_pretrained with dtype="auto") and casts
    each tensor to it, so the weights are not the ones saved; a quantized checkpoint mixes dtypes by design."""
    if not isinstance(model, str) or facts.quantized is not None or facts.checkpoint_dtype is None:
        return
    stored = weights_dtype(model, revision, config_kwargs)
    if stored is None or stored == facts.checkpoint_dtype:
        return
    import warnings

    from ..errors import CudaloadWarning

    warnings.warn(
        f"{model!r}: config.json says dtype {facts.checkpoint_dtype}, but its safetensors weights are stored in "
        f"{stored}. cudaload plans from the config and transformers casts every weight to the planned dtype on "
        f"load, so the model is not exactly the one saved (float16 and bfloat16 keep different bits). Set "
        f'"dtype": "{stored}" in config.json if the weights are right, or pass dtype= to choose.',
        CudaloadWarning,
        stacklevel=3,
    )
