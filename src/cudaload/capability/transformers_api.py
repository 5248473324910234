"""Which API the installed transformers (and peft) offer where releases differ: facts of this process, read
once, so that the code that applies a plan calls what is there instead of probing at the call site."""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..errors import FinetuneConfigError
from ..upstream_imports import import_transformers

__all__ = [
    "check_lora_settings",
    "checkpointing_method",
    "lora_config_fields",
    "lora_refusal",
    "takes_kernels_mode",
    "tensor_parallel_argument",
]


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


@functools.cache
def takes_kernels_mode() -> bool:
    """Whether the installed transformers' from_pretrained takes `kernels_mode` (transformers 5.25
    modeling_utils.py: `PreTrainedModel.kernels_mode`, the property the argument sets)."""
    import_transformers()
    from transformers import PreTrainedModel

    return hasattr(PreTrainedModel, "kernels_mode")


def lora_refusal(settings: Mapping[str, Any]) -> str | None:
    """Why the installed peft's `LoraConfig` refuses these keyword arguments ("TypeError: ..."); None when it
    takes them, or when peft is not installed here (a plan for another machine: checked where it is loaded).

    Planning must not import peft: peft imports bitsandbytes, whose import can fetch Hub code (see
    upstream_imports.import_bitsandbytes). Where peft is not imported yet, the names LoraConfig accepts are read
    from peft's source (its dataclass fields) and unknown names are refused as LoraConfig would refuse them;
    the values are checked by LoraConfig itself when `load_for_finetune` builds it.
    """
    if "peft" in sys.modules:
        from peft import LoraConfig

        try:
            LoraConfig(**settings)
        except (TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None
    accepted = lora_config_fields()
    if accepted is None:
        return None
    unknown = sorted(set(settings) - accepted)
    if unknown:
        return f"TypeError: LoraConfig.__init__() got an unexpected keyword argument {unknown[0]!r}"
    return None


@functools.cache
def lora_config_fields() -> frozenset[str] | None:
    """The field names of the installed peft's LoraConfig and its base classes, read from peft's source files
    (peft 0.21 tuners/lora/config.py: LoraConfig(PeftConfig); config.py: PeftConfig(PeftConfigMixin)) without
    importing peft; None when peft is not installed or its source does not have them."""
    spec = importlib.util.find_spec("peft")  # a top-level name: finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    classes = {"LoraConfig": root / "tuners" / "lora" / "config.py", "PeftConfig": root / "config.py"}
    classes["PeftConfigMixin"] = classes["PeftConfig"]
    fields: set[str] = set()
    for name, path in classes.items():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return None
        found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
        if not found:
            return None
        fields |= {
            n.target.id for n in found[0].body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
    return frozenset(fields) if "target_modules" in fields else None


def check_lora_settings(planned: Mapping[str, Any], asked: Mapping[str, Any] | None) -> None:
    """Refuse, before any weight is read, LoRA settings (`asked` over the planned ones) that the installed
    peft's LoraConfig refuses: a bad one fails in a second, not after loading."""
    problem = lora_refusal(planned)
    if problem is not None:
        raise FinetuneConfigError(
            f"peft's LoraConfig refuses these LoRA settings ({dict(asked or {})!r} over the planned ones): "
            f"{problem}. Pass LoraConfig keyword arguments (r, lora_alpha, lora_dropout, target_modules, ...)."
        )
