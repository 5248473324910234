"""`tokenizer_for()`: a tokenizer prepared for how the model was loaded."""

from __future__ import annotations

from typing import Any

from .errors import ModelConfigError
from .plans import Plan

__all__ = ["tokenizer_for"]


def tokenizer_for(model_or_plan: Any, *, training: bool = False, **kwargs: Any) -> Any:
    """The model's tokenizer, set up for its plan.

    - Padding side: left for generation (a decoder-only model continues from the last
      position, and FlashAttention raises on right-padded batched generation); right for
      training, where labels line up with inputs.
    - A pad token when the tokenizer has none: the EOS token (the model's embeddings are not
      resized; padded positions are masked by the attention mask).
    `kwargs` go to AutoTokenizer.from_pretrained; `trust_remote_code` is never set for you.
    """
    from transformers import AutoTokenizer

    source: str
    if isinstance(model_or_plan, Plan):
        source = model_or_plan.model
        revision = model_or_plan.kwargs.get("revision")
    else:
        source = str(getattr(model_or_plan, "name_or_path", "") or model_or_plan.config._name_or_path)
        revision = None
    if revision is not None:
        kwargs.setdefault("revision", revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelConfigError(
            f"Could not load a tokenizer for {source!r}: {exc}. Save one next to the model "
            "(tokenizer.save_pretrained(path)) or pass the tokenizer's path as the model."
        ) from exc
    tokenizer.padding_side = "right" if training else "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelConfigError(
                f"The tokenizer of {source!r} has neither a pad nor an EOS token to pad with. Add one: "
                "tokenizer.add_special_tokens({'pad_token': '<pad>'}) and resize the model's embeddings."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
