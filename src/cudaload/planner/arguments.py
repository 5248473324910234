"""plan()'s arguments checked and turned into a `Request`, before anything is read."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import (
    AttentionUnavailableError,
    DtypeUnsupportedError,
    FinetuneConfigError,
    ModelConfigError,
    PlacementError,
    QuantizationError,
    SettingError,
)
from ..facts.model import ModelFacts
from ..request import (
    PARALLELISM_CHOICES,
    TRAIN_MODES,
    GenerationRequest,
    Request,
    TrainingRequest,
    check_count,
    check_flag,
)
from ..upstream_imports import import_transformers

__all__ = ["check_model", "generation_request", "parallel_request", "split_overrides", "training_request"]


_SETTINGS = ("attn_implementation", "dtype", "device_map", "max_memory", "use_kernels")


_HUB_KERNEL = r"[A-Za-z0-9_][\w.-]*/[A-Za-z0-9_][\w.-]*(?:@[^/:\s]+)?(?::[^/:\s]+)?"
"""A Hub kernel as transformers takes it ("org/repo", "@revision", ":kernel"; `integrations/hub_kernels.py`
`is_kernel` in 5.22 and 5.25), with org and repo as the Hub spells ids (huggingface_hub `validate_repo_id`:
letters, digits, `-_.`, no `..` or `--`): "kernels-community/../../evil" is neither. A pattern `re` compiles on
first use: a load that names no attention never compiles it."""


def _check_attention_name(name: str) -> None:
    """An attention name transformers would take: "eager", one registered in its AttentionInterface
    (sdpa, flash_attention_N, flex_attention, paged|..., yours), or a Hub kernel repo ("org/repo").

    transformers refuses any other name only inside from_pretrained (`get_correct_attn_implementation`
    in modeling_utils.py checks `["eager"] + ALL_ATTENTION_FUNCTIONS.valid_keys()`); checked here, a
    typo fails at plan time with a suggestion instead of after reading the config and weights.
    """
    import difflib

    import_transformers()
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    known = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    if name in known or (re.fullmatch(_HUB_KERNEL, name) and ".." not in name and "--" not in name.split("@")[0]):
        return
    close = difflib.get_close_matches(name.lower().replace("-", "_"), known, n=1, cutoff=0.6)
    raise AttentionUnavailableError(
        f"attn_implementation={name!r} is not an attention implementation transformers knows"
        + (f": did you mean {close[0]!r}?" if close else ".")
        + f" Known here: {', '.join(sorted(known))}, or a Hub kernel repo such as 'kernels-community/flash-attn2'; "
        "leave it unset to let cudaload choose."
    )


def split_overrides(overrides: dict[str, Any], **extra: Any) -> Request:
    """Turn from_pretrained-style kwargs into a Request; unknown keys pass through untouched."""
    rest = dict(overrides)
    check_flag("use_kernels", rest.get("use_kernels"), allow_none=True)
    if "trust_remote_code" in rest:
        check_flag("trust_remote_code", rest["trust_remote_code"], allow_none=False)
    attn = rest.get("attn_implementation")
    if attn is not None and not isinstance(attn, str):
        raise SettingError(
            f"attn_implementation={attn!r} ({type(attn).__name__}): pass a name such as 'sdpa', 'eager', "
            "'flash_attention_2' or a Hub kernel repo, or leave it unset."
        )
    if attn is not None:
        _check_attention_name(attn)
    for flag in ("load_in_8bit", "load_in_4bit"):
        if flag in rest:
            bits = flag.removeprefix("load_in_")
            raise QuantizationError(
                f"{flag}={rest[flag]!r}: transformers 5 removed from_pretrained's {flag} (it reaches the model's "
                f"__init__ and fails there). Pass quantization_config=BitsAndBytesConfig({flag}=True) to load "
                f"quantized, or fine-tune with cudaload.load_for_finetune(model, quantize='{bits}')."
            )
    if "device" in rest:
        raise PlacementError(
            f"device={rest['device']!r}: from_pretrained has no device argument (it reaches the model's __init__ "
            "and fails there). cudaload places the model itself; to choose, pass device_map= ('cuda:0', 0, 'cpu' "
            "or 'auto')."
        )
    if "torch_dtype" in rest:  # transformers' old name for dtype
        if "dtype" in rest:
            raise DtypeUnsupportedError("Both dtype= and torch_dtype= were given; pass only dtype=.")
        rest["dtype"] = rest.pop("torch_dtype")
    _kernel_arguments(rest)
    known = {k: rest.pop(k) for k in _SETTINGS if k in rest}
    return Request(**known, passthrough=rest, **extra)


def _kernel_arguments(rest: dict[str, Any]) -> None:
    """`kernel_config` and `kernels_mode` switch Hub layer kernels on in from_pretrained (transformers 5.22
    modeling_utils.py `PreTrainedModel.from_pretrained`: "A kernel_config was provided but use_kernels is False;
    setting use_kernels=True automatically"; 5.25 applies both only when use_kernels is on): asking for either is
    asking for use_kernels=True, and contradicting use_kernels=False is refused rather than resolved for you."""
    given = [name for name in ("kernel_config", "kernels_mode") if rest.get(name) is not None]
    if not given:
        return
    if rest.get("use_kernels") is False:
        raise SettingError(
            f"{' and '.join(given)} was given with use_kernels=False: transformers would switch Hub layer kernels on "
            f"for {given[0]}. Drop {given[0]}, or pass use_kernels=True."
        )
    if "kernels_mode" in given:
        from ..capability.transformers_api import takes_kernels_mode

        if not takes_kernels_mode():
            raise SettingError(
                "kernels_mode was given, but the installed transformers has no kernels_mode (it arrived with "
                "PreTrainedModel.kernels_mode in transformers 5.25): upgrade transformers, or drop kernels_mode."
            )
    rest["use_kernels"] = True


def check_model(model: Any) -> None:
    if not isinstance(model, (str, os.PathLike, ModelFacts)):
        import_transformers()
        from transformers import PretrainedConfig

        if not isinstance(model, PretrainedConfig):
            raise ModelConfigError(
                f"plan() takes a local path, a Hub id, a PretrainedConfig or ModelFacts, not "
                f"{type(model).__name__} ({model!r:.60})."
            )
    if isinstance(model, (str, os.PathLike)) and not str(model).strip():
        raise ModelConfigError("plan() was given an empty model name: pass a local path or a Hub id.")


def generation_request(
    generate: bool | None,
    finetune: bool,
    context: int | None,
    cache_implementation: str | None,
    padding_side: str | None,
) -> GenerationRequest | None:
    """What plan()'s generation arguments ask: None for no generation section."""
    settings = {"context": context, "cache_implementation": cache_implementation, "padding_side": padding_side}
    if not generate and any(v is not None for v in settings.values()):
        given = ", ".join(f"{k}={v!r}" for k, v in settings.items() if v is not None)
        raise SettingError(f"{given} only applies to a generation plan: pass generate=True as well.")
    if generate and finetune:
        raise SettingError(
            "generate=True and finetune=True: a fine-tuning plan trains, it does not plan generation. Plan the "
            "generation separately (cudaload.plan(model, generate=True))."
        )
    if generate is False or finetune:
        return None
    return GenerationRequest(generate is True, context, cache_implementation, padding_side)


def training_request(
    finetune: bool,
    quantize: str | None,
    lora: Mapping[str, Any] | None,
    gradient_checkpointing: bool | None,
    seq_len: int | None,
    batch_size: int | None,
    overrides: Mapping[str, Any],
    train: str | None = None,
) -> TrainingRequest | None:
    """The fine-tuning section of the request (None for inference, where giving any of it is an error)."""
    if not finetune:
        training_only = {
            "train": train,
            "lora": lora,
            "gradient_checkpointing": gradient_checkpointing,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "quantize": None if quantize == "auto" else quantize,  # None: inference is never quantized by it
        }
        if any(v is not None for v in training_only.values()):
            named = ", ".join(f"{k}={v!r}" for k, v in training_only.items() if v is not None)
            raise FinetuneConfigError(
                f"{named} only applies to a fine-tuning plan: pass finetune=True (load_for_finetune() does)"
                + (
                    ", or a quantization_config= of your own to quantize for inference."
                    if training_only["quantize"] is not None
                    else "."
                )
            )
        return None
    check_flag("gradient_checkpointing", gradient_checkpointing, allow_none=True)
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        check_count(name, value)
    if quantize is not None and "quantization_config" in overrides:
        raise QuantizationError(
            f"Both quantize={quantize!r} and quantization_config= were given. Pass quantize='4bit'/'8bit' to let "
            "cudaload build the BitsAndBytesConfig, or quantize=None with your own quantization_config."
        )
    own = overrides.get("quantization_config")
    _check_train(train, quantize, lora, own)
    return TrainingRequest(
        train=train or "lora",
        own_quantization=_bitsandbytes_bits(own) if own is not None else None,
        quantize=quantize,
        lora=lora,
        gradient_checkpointing=True if gradient_checkpointing is None else gradient_checkpointing,
        seq_len=2048 if seq_len is None else seq_len,
        batch_size=1 if batch_size is None else batch_size,
    )


def _check_train(train: str | None, quantize: str | None, lora: Any, own: Any) -> None:
    """`train` is one of TRAIN_MODES; full training takes no quantized base (a 4- or 8-bit weight takes no
    gradient: "quantized weights should be frozen", bitsandbytes 0.50.2 nn/modules.py: Params4bit.__new__) and
    no LoRA settings (it adds no adapters), rather than ignoring them."""
    if train is None or train == "lora":
        return
    if train not in TRAIN_MODES:
        raise SettingError(
            f"train={train!r}: pass 'lora' (adapters on a frozen base, the default) or 'full' (every weight trained)."
        )
    if quantize not in (None, "auto") or own is not None:
        asked = f"quantize={quantize!r}" if own is None else "quantization_config="
        raise SettingError(
            f"train='full' with {asked}: full training updates every weight, and a quantized weight cannot be "
            "trained (it has no gradient). Pass quantize=None or 'auto' (full training plans no quantization), or "
            "train='lora' to train LoRA adapters on the quantized base (QLoRA)."
        )
    if lora is not None:
        raise SettingError(
            f"train='full' with lora={lora!r}: full training adds no LoRA adapters, so LoRA settings would be "
            "ignored. Drop lora=, or pass train='lora'."
        )


def _bitsandbytes_bits(config: Any) -> str:
    """What a quantization_config you pass does to the weights: "4bit" or "8bit" for a BitsAndBytesConfig
    (or its dict), "other" for another method. Read by attribute or key, as transformers' own config does."""

    def get(name: str) -> Any:
        return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)

    method = get("quant_method") or "bitsandbytes"
    method = str(getattr(method, "value", method)).lower()  # transformers' QuantizationMethod is a str enum
    if method != "bitsandbytes":
        return "other"
    if get("load_in_4bit") is True:
        return "4bit"
    if get("load_in_8bit") is True:
        return "8bit"
    return "other"


def parallel_request(
    training: TrainingRequest | None,
    nodes: int | None,
    ranks_per_node: int | None,
    interconnect: str | None,
    parallelism: str | None,
    node_memory: int | str | None = None,
) -> TrainingRequest | None:
    """The fine-tuning request with the job's layout (`nodes`, `ranks_per_node`, `interconnect`, `node_memory`)
    and the parallelism asked for; giving any of them to an inference plan is an error."""
    given = {"nodes": nodes, "ranks_per_node": ranks_per_node, "interconnect": interconnect, "parallelism": parallelism}
    given["node_memory"] = node_memory
    if training is None:
        if any(v is not None for v in given.values()):
            named = ", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None)
            raise FinetuneConfigError(f"{named} only applies to a fine-tuning plan: pass finetune=True.")
        return None
    # Imported here, as the training policy is (policy/__init__.py): an inference plan does not pay for them.
    from ..facts.interconnect import interconnect as known_link
    from ..policy.node_memory import parse_node_memory

    for name in ("nodes", "ranks_per_node"):
        check_count(name, given[name])
    if interconnect is not None:
        known_link(interconnect)  # an unknown link raises here, naming the known ones
    if parallelism is not None and parallelism not in PARALLELISM_CHOICES:
        raise SettingError(
            f"parallelism={parallelism!r} is not a strategy cudaload plans. Pass one of {list(PARALLELISM_CHOICES)}."
        )
    return replace(
        training,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        interconnect=interconnect,
        parallelism=parallelism or "auto",
        node_memory=parse_node_memory(node_memory),
    )
