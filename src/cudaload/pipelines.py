"""`pipeline()`: a transformers `pipeline()` built on the applied plan.

(The module is `pipelines`, not `pipeline`: a submodule named like the exported function would
shadow `cudaload.pipeline` once imported.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from .errors import SettingError
from .plans import Plan

if TYPE_CHECKING:
    from transformers import Pipeline

    from .facts.machine import Machine

__all__ = ["TASK_MODEL_CLASSES", "offered_tasks", "pipeline"]

TASK_MODEL_CLASSES = {
    "text-generation": "AutoModelForCausalLM",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "summarization": "AutoModelForSeq2SeqLM",
    "translation": "AutoModelForSeq2SeqLM",
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "sentiment-analysis": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "fill-mask": "AutoModelForMaskedLM",
}
"""Tasks `pipeline()` can plan for, and the Auto class each loads (as transformers' pipeline registry
does: `transformers.pipelines.SUPPORTED_TASKS`); `offered_tasks()` keeps those the installed
transformers still has."""


def offered_tasks() -> dict[str, str]:
    """The tasks of `TASK_MODEL_CLASSES` the installed transformers' `pipeline()` has (its
    `transformers.pipelines.SUPPORTED_TASKS` and `TASK_ALIASES`): transformers 5.22 and 5.25 removed
    text2text-generation, summarization and translation, which `transformers.pipeline()` then
    refuses with a bare KeyError."""
    from transformers import pipelines

    known = {*pipelines.SUPPORTED_TASKS, *getattr(pipelines, "TASK_ALIASES", {})}
    return {task: auto for task, auto in TASK_MODEL_CLASSES.items() if task in known}


_GENERATING = frozenset({"text-generation", "text2text-generation", "summarization", "translation"})


def _check_plan_for(task: str, plan: Plan, given: list[str]) -> None:
    """A Plan is loaded as planned: through the task's Auto class, with nothing asked beside it (the task's
    own model_class and generate are not the caller's, so they are never blamed)."""
    wanted = TASK_MODEL_CLASSES[task]
    if plan.auto_class != wanted:
        raise SettingError(
            f"pipeline({task!r}) loads through {wanted}, but this plan was made for {plan.auto_class}. Plan it "
            f"with cudaload.plan(model, model_class={wanted!r}), or pass the model itself."
        )
    if plan.finetune is not None:
        raise SettingError(
            f"pipeline({task!r}) was given a fine-tuning plan: a pipeline runs inference. Plan without "
            "finetune=True, or pass the model itself."
        )
    if given:
        raise SettingError(
            f"pipeline({task!r}, plan) was given {', '.join(given)}: a Plan is loaded as planned (for "
            f"{plan.machine}). Build the plan with them instead: cudaload.plan(model, ...)."
        )


# pipeline_kwargs that transformers.pipeline() would take from cudaload's own arguments: the model and the
# tokenizer are passed by cudaload (a second one is a TypeError after loading), and device, device_map and dtype
# would re-place or re-cast a model the plan already placed (transformers 5.25 pipelines/base.py:
# Pipeline.__init__ moves a loaded model to `device`) or be ignored for a loaded model (dtype).
_LOAD_SETTINGS = {
    "model": "pass the model once, as pipeline()'s second argument",
    "tokenizer": "cudaload builds the tokenizer with tokenizer_for(); pass its options as tokenizer_kwargs=",
    "device": "the plan places the model; pass device_map= as a keyword of pipeline() (e.g. device_map='cpu')",
    "device_map": "pass device_map= as a keyword of pipeline(), so the plan checks it against this machine",
    "dtype": "pass dtype= as a keyword of pipeline(), so the plan loads the weights in it",
    "torch_dtype": "pass dtype= as a keyword of pipeline(), so the plan loads the weights in it",
}


def _check_pipeline_kwargs(task: str, pipeline_kwargs: Mapping[str, Any] | None) -> None:
    """Refuse, before loading, a pipeline_kwargs key that is a load setting (see _LOAD_SETTINGS)."""
    for key, instead in _LOAD_SETTINGS.items():
        if key in (pipeline_kwargs or {}):
            value = (pipeline_kwargs or {})[key]
            shown = repr(value) if isinstance(value, (str, int, float)) or value is None else type(value).__name__
            raise SettingError(
                f"pipeline({task!r}, pipeline_kwargs={{{key!r}: {shown}}}): {key} is not a pipeline setting here, "
                f"as cudaload loads the model for this machine itself: {instead}."
            )


def pipeline(
    task: str,
    model: str | os.PathLike[str] | Plan,
    *,
    machine: Machine | None = None,
    strict: bool = False,
    verify: bool = True,
    tokenizer_kwargs: Mapping[str, Any] | None = None,
    pipeline_kwargs: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Pipeline:
    """A transformers `pipeline(task)` on the model as cudaload loads it for this machine.

    The model is loaded with `load()` (device, dtype, attention from the plan, with fallbacks), the
    tokenizer with `tokenizer_for()` (padding side from the plan: left for batched decoder-only
    generation; a pad token when it has none), and for generating tasks the planned generation
    settings (`plan.generation.generate_kwargs`, e.g. a static cache) are the pipeline's defaults.
    The plan is reachable as `pipe.cudaload_plan` (and `pipe.model.cudaload_plan`).

    Args:
        task: One of `offered_tasks()`: "text-generation", "feature-extraction",
            "text-classification", "sentiment-analysis", "token-classification" or "fill-mask"
            (and "text2text-generation", "summarization", "translation" under a transformers
            that still has them; 5.22 and 5.25 do not).
        model: A local path or Hub id, or a `Plan` made for the task's Auto class (e.g.
            `plan(path, model_class="AutoModelForCausalLM", generate=True)`), loaded as planned:
            `machine` and overrides are then not accepted.
        machine: As for `load()` (default None: this machine).
        strict: As for `load()` (default False: fall back along the attention chain).
        verify: As for `load()` (default True: a short test forward).
        tokenizer_kwargs: Passed to `tokenizer_for()` (e.g. `{"padding_side": "right"}`);
            default None.
        pipeline_kwargs: Passed to `transformers.pipeline()` (e.g. `{"batch_size": 8}`); a
            generation setting given here wins over the plan's. Default None.
        **overrides: `load()`/`plan()` keyword arguments: from_pretrained settings (dtype,
            attn_implementation, device_map, ...) and for generating tasks `context`,
            `cache_implementation`, `padding_side`, `workload`. Yours always win. For a
            non-generating task `padding_side` goes to the tokenizer.

    Returns:
        The transformers pipeline, with `pipe.cudaload_plan` (and `pipe.model.cudaload_plan`)
        set to the `AppliedPlan`.

    Raises:
        SettingError: an unknown task or one the installed transformers lacks (before loading), a
            `model_class`/`generate` override (the task decides them),
            or a Plan made for another Auto class, for fine-tuning, or given with overrides; a
            `pipeline_kwargs` key that is a load setting (model, tokenizer, device, device_map, dtype,
            torch_dtype), before loading.
        ModelConfigError, LoadFailedError: as `load()` and `tokenizer_for()` raise them (and every
            other error `load()` raises for an impossible override).

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> pipe = cudaload.pipeline("text-generation", path, dtype="float32")
        >>> type(pipe).__name__, pipe.tokenizer.padding_side, pipe.cudaload_plan.dtype
        ('TextGenerationPipeline', 'left', 'float32')
        >>> outputs = pipe(["w5 w6 w7", "w8"], max_new_tokens=2, do_sample=False, batch_size=2)
        >>> len(outputs), sorted(outputs[0][0])
        (2, ['generated_text'])
        >>> cudaload.pipeline("image-classification", path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cudaload.errors.SettingError: pipeline task 'image-classification' is not one cudaload plans for. ...
    """
    offered = offered_tasks() if task in TASK_MODEL_CLASSES else {}
    if task in TASK_MODEL_CLASSES and task not in offered:
        import transformers

        raise SettingError(
            f"pipeline task {task!r}: the installed transformers {transformers.__version__} has no such pipeline "
            "(transformers.pipelines.SUPPORTED_TASKS), so it would fail after loading. Use one of "
            f"{', '.join(sorted(offered))}; for a sequence-to-sequence model, load it with "
            f"cudaload.load(model, model_class={TASK_MODEL_CLASSES[task]!r}) and call model.generate()."
        )
    if task not in TASK_MODEL_CLASSES:
        raise SettingError(
            f"pipeline task {task!r} is not one cudaload plans for. Use one of "
            f"{', '.join(sorted(TASK_MODEL_CLASSES))}, or load the model with cudaload.load(..., model_class=...) "
            "and build transformers.pipeline() yourself."
        )
    _check_pipeline_kwargs(task, pipeline_kwargs)
    for key in ("model_class", "generate"):
        if key in overrides:
            raise SettingError(
                f"pipeline({task!r}) chooses {key} itself ({TASK_MODEL_CLASSES[task]}"
                f"{', generating' if task in _GENERATING else ''}): drop {key}={overrides[key]!r}."
            )
    from .facade import load
    from .tokenizer import tokenizer_for

    generating = task in _GENERATING
    # A generating task's padding side is a plan decision (tokenizer_for follows it); an encoder's
    # goes to the tokenizer alone.
    padding_side = None if generating else overrides.pop("padding_side", None)
    loaded: Any
    if isinstance(model, Plan):
        _check_plan_for(task, model, [*(["machine"] if machine is not None else []), *overrides])
        loaded = load(model, strict=strict, verify=verify)
    else:
        loaded = load(
            model,
            machine=machine,
            strict=strict,
            verify=verify,
            model_class=TASK_MODEL_CLASSES[task],
            generate=generating,
            **overrides,
        )
    applied = loaded.cudaload_plan
    tokenizer_options = dict(tokenizer_kwargs or {})
    if padding_side is not None:
        tokenizer_options.setdefault("padding_side", padding_side)
    tokenizer = tokenizer_for(loaded, **tokenizer_options)
    options = dict(pipeline_kwargs or {})
    generation = applied.generation
    if generating and generation is not None:
        for key, value in generation.generate_kwargs.items():
            options.setdefault(key, value)
    from transformers import pipeline as build

    transformers_pipeline: Any = build  # its overloads want a literal task name

    chosen_side = tokenizer.padding_side
    pipe = transformers_pipeline(task, model=loaded, tokenizer=tokenizer, **options)
    # TextGenerationPipeline.__init__ (transformers/pipelines/text_generation.py) turns a right
    # padding side into left without a word: right only gets here when you asked for it, so keep it.
    pipe.tokenizer.padding_side = chosen_side
    pipe.cudaload_plan = applied
    return cast("Pipeline", pipe)
