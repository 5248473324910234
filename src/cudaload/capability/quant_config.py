"""Whether a `quantization_config=` you pass is one transformers builds as you meant: a config object, or a dict
routed by its `quant_method` to transformers' own config class (`AutoQuantizationConfig.from_dict`), checked
against that class's parameters when planning, so that a typo or another method's dict never becomes 4-bit
bitsandbytes after loading (transformers 5.22 and 5.25 `quantizers/auto.py`: AUTO_QUANTIZATION_CONFIG_MAPPING,
`AutoQuantizationConfig.from_dict`; `utils/quantization_config.py`: BitsAndBytesConfig takes **kwargs and
ignores what it does not know)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import QuantizationError, describe_error
from ..upstream_imports import import_transformers

__all__ = ["check_quantization_config"]

_BITSANDBYTES = "bitsandbytes"


def _says_bits(config: Mapping[str, Any]) -> bool:
    return config.get("load_in_4bit") is True or config.get("load_in_8bit") is True


def _parameters(config_class: type) -> set[str]:
    """The keyword parameters a config class names (its **kwargs excepted: what lands there is ignored)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        name for name, p in inspect.signature(config_class).parameters.items() if p.kind in kinds and name != "self"
    }


def check_quantization_config(config: Any, model: str) -> None:
    """Raise QuantizationError, when planning, for a quantization_config transformers would not build as given:
    not a config object nor a dict (a string such as "4bit"); a dict without `quant_method` that is not a
    BitsAndBytesConfig's (load_in_4bit or load_in_8bit True, its keys only); a `quant_method` transformers does
    not know; a key the method's config class does not take (`load_in_3bit`)."""
    if config is None:
        return
    if not isinstance(config, Mapping):
        if getattr(config, "quant_method", None) is not None:
            return  # a transformers config object (QuantizationConfigMixin): transformers validated it
        raise QuantizationError(
            f"{model}: quantization_config={config!r:.60} ({type(config).__name__}) is neither a transformers "
            "quantization config nor its dict. Pass e.g. quantization_config=BitsAndBytesConfig(load_in_4bit=True) "
            "or {'quant_method': 'bitsandbytes', 'load_in_4bit': True}; to fine-tune in 4-bit, "
            "load_for_finetune(model, quantize='4bit')."
        )
    import_transformers()
    from transformers import BitsAndBytesConfig
    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING

    given = dict(config)
    method = given.get("quant_method")
    if method is None and not _says_bits(given):
        raise QuantizationError(
            f"{model}: quantization_config={given!r:.120} names no quant_method and does not load bitsandbytes "
            "(load_in_4bit=True or load_in_8bit=True): cudaload will not guess its method. Add 'quant_method' "
            f"(one of {', '.join(sorted(_methods(AUTO_QUANTIZATION_CONFIG_MAPPING)))}) or pass the transformers "
            "config object (BitsAndBytesConfig(...), TorchAoConfig(...), ...)."
        )
    name = _BITSANDBYTES if method is None else str(getattr(method, "value", method))
    known = _methods(AUTO_QUANTIZATION_CONFIG_MAPPING)
    if name not in known:
        raise QuantizationError(
            f"{model}: quantization_config has quant_method={name!r}, which the installed transformers does not "
            f"know (it knows {', '.join(sorted(known))}). Fix the name or pass the transformers config object."
        )
    config_class = BitsAndBytesConfig if name == _BITSANDBYTES else AUTO_QUANTIZATION_CONFIG_MAPPING[name]
    unknown = sorted(set(given) - _parameters(config_class) - {"quant_method"})
    if unknown:
        raise QuantizationError(
            f"{model}: quantization_config has {', '.join(map(repr, unknown))}, which {config_class.__name__} "
            f"(quant_method={name!r}) does not take: transformers would ignore it. It takes "
            f"{', '.join(sorted(_parameters(config_class)))}; fix the key, or pass the config object."
        )
    if name == _BITSANDBYTES and not _says_bits(given):
        raise QuantizationError(
            f"{model}: quantization_config={given!r:.120} is bitsandbytes without load_in_4bit=True or "
            "load_in_8bit=True: say which."
        )
    if method is None:
        return  # built as BitsAndBytesConfig(**it) when applied: its keys are checked above
    from transformers.quantizers.auto import AutoQuantizationConfig

    try:  # what applying builds (loaders/kwargs.py), built once here: the config class's own checks
        AutoQuantizationConfig.from_dict(dict(given))
    except ImportError:
        pass  # its package is missing here: applying says so (the plan may be for another machine)
    except (ValueError, TypeError) as exc:
        raise QuantizationError(
            f"{model}: transformers refuses quantization_config={given!r:.120}: {describe_error(exc)} "
            "Fix it, or pass the transformers config object."
        ) from exc


def _methods(mapping: Mapping[str, Any]) -> set[str]:
    """The quant_method names a dict may carry: the mapping's keys, bitsandbytes_4bit/_8bit as "bitsandbytes"
    (`AutoQuantizationConfig.from_dict` adds the suffix from load_in_4bit)."""
    return {_BITSANDBYTES if key.startswith(f"{_BITSANDBYTES}_") else key for key in mapping}
