"""Which API the installed transformers (and peft) offer where releases differ: facts of this process, read
once, so that the code that applies a plan calls what is there instead of probing at the call site."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

from ..errors import FinetuneConfigError
from ..upstream_imports import import_transformers

__all__ = ["check_lora_settings", "checkpointing_method", "lora_refusal", "tensor_parallel_argument"]


@functools.cache
def tensor_parallel_argument() -> Literal["distributed_config", "tp_plan"]:
    """How the installed transformers takes tensor parallelism in from_pretrained: "distributed_config" (a
    `transformers.distributed.DistributedConfig(tp_plan=...)`; a bare `tp_plan=` warns FutureWarning there) or
    "tp_plan" (older 5.x, which has no `transformers.distributed.DistributedConfig`)."""
    import_transformers()
    try:
        from transformers.distributed import DistributedConfig  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return "tp_plan"
    return "distributed_config"


@functools.cache
def checkpointing_method() -> Literal["activation_checkpointing", "gradient_checkpointing"]:
    """The name of the installed transformers' checkpointing switch on a model: "activation_checkpointing"
    (`activation_checkpointing_enable(activation_checkpointing_kwargs=...)`, transformers >= 5.23) or
    "gradient_checkpointing" (the old name, which warns FutureWarning from 5.23 on)."""
    import_transformers()
    from transformers import PreTrainedModel

    return (
        "activation_checkpointing"
        if hasattr(PreTrainedModel, "activation_checkpointing_enable")
        else ("gradient_checkpointing")
    )


def lora_refusal(settings: Mapping[str, Any]) -> str | None:
    """Why the installed peft's `LoraConfig` refuses these keyword arguments ("TypeError: ..."); None when it
    takes them, or when peft is not installed here (a plan for another machine: checked where it is loaded)."""
    try:
        from peft import LoraConfig
    except ImportError:
        return None
    try:
        LoraConfig(**settings)
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def check_lora_settings(planned: Mapping[str, Any], asked: Mapping[str, Any] | None) -> None:
    """Refuse, before any weight is read, LoRA settings (`asked` over the planned ones) that the installed
    peft's LoraConfig refuses: a bad one fails in a second, not after loading."""
    problem = lora_refusal(planned)
    if problem is not None:
        raise FinetuneConfigError(
            f"peft's LoraConfig refuses these LoRA settings ({dict(asked or {})!r} over the planned ones): "
            f"{problem}. Pass LoraConfig keyword arguments (r, lora_alpha, lora_dropout, target_modules, ...)."
        )
