"""Which transformers class loads a model: the Auto class its checkpoint was saved from
(`default_auto_class`), the class that Auto class picks, or the repository's own (`model_class_for`), and
that class built on the meta device (`meta_model`: no memory, no weights)."""

from __future__ import annotations

from typing import Any

from ..errors import ModelConfigError, RemoteCodeError
from ..upstream_imports import resolve_auto_class

# resolve_auto_class (upstream_imports.py) is also the loader's; model_class_name (request.py) checks the argument.
__all__ = ["default_auto_class", "meta_model", "model_class_for", "resolve_auto_class"]


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
        # No Auto class above maps it (ViTForImageClassification, or Emu3ForCausalLM whose saved config
        # is the text sub-config's type): the class itself, as `from_pretrained` of that class loads it.
        own = getattr(transformers, str(architecture), None)
        if (
            own is not None
            and isinstance(getattr(own, "config_class", None), type)
            and isinstance(config, own.config_class)
        ):
            return str(architecture)
    if getattr(config, "is_encoder_decoder", False) and _mapped_names(transformers.AutoModelForSeq2SeqLM, model_type):
        return "AutoModelForSeq2SeqLM"
    causal = _mapped_names(transformers.AutoModelForCausalLM, model_type) or "AutoModelForCausalLM" in auto_map
    encoder = _mapped_names(transformers.AutoModelForMaskedLM, model_type) and not getattr(config, "is_decoder", False)
    return "AutoModelForCausalLM" if causal and not encoder else "AutoModel"


def model_class_for(
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


def meta_model(cls: type, config: Any) -> Any:
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=True):
        try:
            return cls._from_config(config, dtype=torch.float32)  # type: ignore[attr-defined]
        except TypeError:
            return cls(config)
