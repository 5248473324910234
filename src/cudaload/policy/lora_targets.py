"""Which layers LoRA adapts: the names cudaload plans (`lora_targets`), a regex as peft takes it
(`is_target_regex`, `lora_leaves`), and what a rank above a layer's dimensions means (`rank_warnings`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import FinetuneConfigError
from ..facts.model import ModelFacts, generates

__all__ = ["OUTPUT_LAYER", "check_regex", "is_target_regex", "lora_leaves", "lora_targets", "rank_warnings"]


def lora_targets(model: ModelFacts, requested: Any) -> tuple[str, ...]:
    """The leaf module names LoRA wraps; a requested name that matches nothing raises. `lm_head` is one for a
    generating model (peft wraps the output layer as any linear layer); a regex is `lora_leaves`'s."""
    if requested is None or requested == "all-linear":
        if not model.linear_names:
            raise FinetuneConfigError(f"{model.model_class} has no linear layers for LoRA to wrap.")
        return model.linear_names
    names = (requested,) if isinstance(requested, str) else tuple(requested)
    output = (OUTPUT_LAYER,) if has_output_layer(model) else ()
    unknown = [n for n in names if n not in (*model.linear_names, *output)]
    if unknown:
        raise FinetuneConfigError(
            f"LoRA target_modules {unknown} match no linear layer of {model.model_class}. Its linear layers are "
            f"{list(model.linear_names)}{' (and the output layer lm_head)' if output else ''}; pick from those, pass "
            "'all-linear', or a regular expression peft matches against each module's full name (e.g. "
            "r'.*\\.(q_proj|v_proj)')."
        )
    return names


OUTPUT_LAYER = "lm_head"
"""The output layer of transformers' generating classes: not in `linear_names` ("all-linear" skips it, as
peft's does), but one peft wraps when it is named."""


def has_output_layer(model: ModelFacts) -> bool:
    return generates(model.model_class) and model.vocab_size is not None and model.hidden_size is not None


def is_target_regex(model: ModelFacts, requested: Any) -> bool:
    """Whether `target_modules` is a regular expression, as peft takes a str (peft 0.21 tuners_utils.py:
    check_target_module_exists fullmatches it against each module's full name): any str other than
    "all-linear" and a plain name (a layer's own, planned as that one layer, or a typo, refused as one)."""
    return isinstance(requested, str) and requested != "all-linear" and re.escape(requested) != requested


# Full module names a regex is tried on to size its adapters (the usual decoder layouts: Llama/Qwen's
# model.layers.N.{self_attn,mlp}, GPT-2's transformer.h.N.{attn,mlp}).
_SAMPLE_PATHS = (
    "",
    "model.layers.0.self_attn.",
    "model.layers.0.mlp.",
    "transformer.h.0.attn.",
    "transformer.h.0.mlp.",
)


def lora_leaves(model: ModelFacts, target_modules: Any) -> tuple[str, ...]:
    """The leaf names a LoRA config adapts, for sizing: the list itself, or for a regex the linear layers
    it matches under the usual module paths (all of them, an upper bound, when it matches none of those)."""
    if not isinstance(target_modules, str):
        return tuple(target_modules)
    pattern = re.compile(target_modules)
    names = (*model.linear_names, *((OUTPUT_LAYER,) if has_output_layer(model) else ()))
    hit = tuple(n for n in names if any(pattern.fullmatch(path + n) for path in _SAMPLE_PATHS))
    return hit or model.linear_names


def check_regex(requested: str) -> None:
    try:
        re.compile(requested)
    except re.error as exc:
        raise FinetuneConfigError(
            f"LoRA target_modules={requested!r}: peft takes a str as a regular expression, and this one does not "
            f"compile ({exc}). Pass a list of layer names, 'all-linear', or a valid expression."
        ) from exc


def rank_warnings(model: ModelFacts, lora_config: Mapping[str, Any]) -> tuple[str, ...]:
    """A rank above a layer's smaller dimension adds parameters and memory but no expressiveness: the update
    B @ A has rank at most min(in, out) whatever r is."""
    r, leaves = int(lora_config["r"]), lora_leaves(model, lora_config["target_modules"])
    shapes = [(n, i, o) for n, i, o, _ in model.linear_shapes if n in leaves]
    if OUTPUT_LAYER in leaves and model.hidden_size and model.vocab_size:
        shapes.append((OUTPUT_LAYER, model.hidden_size, model.vocab_size))
    over = [f"{n} ({i}x{o})" for n, i, o in shapes if r > min(i, o)]
    if not over:
        return ()
    return (
        f"lora r={r} is larger than the smaller dimension of {', '.join(over)}: a LoRA update there has rank at "
        f"most that dimension, so the extra rank only costs memory (r x (in + out) parameters per layer). Pass a "
        "smaller r (8 to 64 is usual).",
    )
