"""`tokenizer_for()`: a tokenizer prepared for how the model was loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ModelConfigError, SettingError
from .facts.model import generates
from .plans import Plan
from .request import check_flag, check_padding_side
from .upstream_imports import import_transformers

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["tokenizer_for"]


def tokenizer_for(
    model_or_plan: PreTrainedModel | PeftModel | Plan,
    *,
    training: bool = False,
    padding_side: str | None = None,
    **kwargs: Any,
) -> PreTrainedTokenizerBase:
    """The model's tokenizer, set up for its plan.

    - Padding side: yours when you pass `padding_side`; right for training, where labels line up
      with inputs; else the plan's generation decision (`plan.generation.padding_side`: left for a
      decoder-only model, which continues from the last position: generate() warns on a
      right-padded batch, whose shorter rows continue from padding); left for any other
      generating model; otherwise (an encoder) the tokenizer's own side, since absolute position
      embeddings expect right padding.
    - A pad token when the tokenizer has none: the EOS token (the model's embeddings are not
      resized; padded positions are masked by the attention mask).
    `kwargs` go to AutoTokenizer.from_pretrained; `trust_remote_code` is never set for you.

    Args:
        model_or_plan: A model from `load()`/`load_for_finetune()` (or any transformers model:
            its `name_or_path` is where the tokenizer is read from), or a `Plan` (its model, with
            the plan's `revision`, `subfolder` and `cache_dir`; a model loaded by cudaload also reads
            them from its plan).
        training: Pad on the right, for training (default False). Ignored when `padding_side`
            is given.
        padding_side: "left" or "right" to choose yourself (default None: decided as above).
        **kwargs: Keyword arguments for `AutoTokenizer.from_pretrained` (e.g. `use_fast`,
            `revision`, `trust_remote_code`).

    Returns:
        The tokenizer, with its padding side set and a pad token (EOS when it had none).

    Raises:
        SettingError: a `padding_side` other than "left" or "right".
        ModelConfigError: no tokenizer can be loaded from the model's folder or Hub id (none, or
            one without a vocabulary: no tokenizer files), or it has neither a pad nor an EOS token.
        SettingError: `model_or_plan` is neither a Plan nor a model loaded from a path, or `training`
            is not a real bool.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> model = cudaload.load(build_tiny_model(tempfile.mkdtemp()), dtype="float32")
        >>> tokenizer = cudaload.tokenizer_for(model)
        >>> tokenizer.padding_side, tokenizer.pad_token  # the tiny tokenizer has no pad token: EOS pads
        ('left', '<eos>')
        >>> cudaload.tokenizer_for(model, training=True).padding_side
        'right'
    """
    import_transformers("AutoTokenizer")
    from transformers import AutoTokenizer

    check_flag("training", training, allow_none=False)
    if padding_side is not None:
        check_padding_side(padding_side)
    source: str
    generation = None
    planned: Plan | None = None
    if isinstance(model_or_plan, Plan):
        planned = model_or_plan
        source = model_or_plan.model
        generation = model_or_plan.generation
        can_generate = generates(model_or_plan.model_class)
    else:
        config = getattr(model_or_plan, "config", None)
        source = str(getattr(model_or_plan, "name_or_path", "") or getattr(config, "_name_or_path", "") or "")
        if not source:
            raise SettingError(
                f"tokenizer_for() takes a model from cudaload.load()/load_for_finetune() (or a transformers model "
                f"loaded from a path) or a Plan, not {type(model_or_plan).__name__} ({model_or_plan!r:.60}). For a "
                "path, load the model first, or plan it: tokenizer_for(cudaload.plan(path))."
            )
        applied = getattr(model_or_plan, "cudaload_plan", None)
        generation = getattr(applied, "generation", None)
        planned = getattr(applied, "plan", None) if isinstance(getattr(applied, "plan", None), Plan) else None
        if planned is not None and planned.model != source:
            planned = None  # a model not from this plan's files: read its own
        method = getattr(model_or_plan, "can_generate", None)
        can_generate = bool(method()) if callable(method) else False
    # The files the model was read from (a subfolder, a cache folder, a revision): its tokenizer is there too.
    for key in ("revision", "subfolder", "cache_dir", "token", "local_files_only"):
        value = planned.kwargs.get(key) if planned is not None else None
        if value is not None:
            kwargs.setdefault(key, value)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelConfigError(
            f"Could not load a tokenizer for {source!r}: {exc}. Save one next to the model "
            "(tokenizer.save_pretrained(path)) or pass the tokenizer's path as the model."
        ) from exc
    if len(tokenizer) <= len(tokenizer.all_special_tokens):
        # transformers 5 builds a tokenizer class from config.json alone when no tokenizer file is
        # there: only its special tokens, so every word encodes as unknown (or nothing at all).
        raise ModelConfigError(
            f"{source!r} has no tokenizer files (tokenizer.json, vocab, merges, ...): transformers built an empty "
            f"{type(tokenizer).__name__} with only its {len(tokenizer)} special tokens, which cannot encode text. "
            "Save the tokenizer next to the model (tokenizer.save_pretrained(path))."
        )
    side = padding_side  # yours; else the plan's decision (policy/tokenizer.py `decide_tokenizer`)
    if side is None and planned is not None and planned.tokenizer is not None:
        side = generation.padding_side if generation is not None and not training else planned.tokenizer.side(training)
    elif side is None:
        # A model cudaload did not plan (or a plan rebuilt without its tokenizer section): no decision to
        # apply, so the plan's own rules, from what the model says (policy/tokenizer.py).
        side = "right" if training else generation.padding_side if generation is not None else None
        side = "left" if side is None and can_generate else side
    if side is not None:
        tokenizer.padding_side = side
    if tokenizer.pad_token is None:  # the plan's pad_token decision: EOS pads (`TokenizerPlan.pad_token`)
        if tokenizer.eos_token is None:
            raise ModelConfigError(
                f"The tokenizer of {source!r} has neither a pad nor an EOS token to pad with. Add one: "
                "tokenizer.add_special_tokens({'pad_token': '<pad>'}) and resize the model's embeddings."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
