"""`load()`: plan (planner/ `plan()`) and apply (loaders/ `apply_plan()`) in one call. The module that
applies a plan imports neither the planner nor the policy; this one composes them."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, cast

from .errors import ModelConfigError, SettingError
from .loaders import AppliedPlan, apply_plan
from .plans import Plan
from .request import check_flag

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .facts.machine import Machine

__all__ = ["load"]


def load(
    model: str | os.PathLike[str] | Plan,
    *,
    strict: bool = False,
    verify: bool | Literal["full"] = True,
    machine: Machine | None = None,
    model_class: str | type | None = None,
    allow_missing_weights: bool = False,
    **overrides: Any,
) -> PreTrainedModel:
    """Load `model` (a local path, a hub id, or a ready `Plan`) with the plan for this machine.

    - `overrides` are from_pretrained kwargs: yours always win; an impossible one raises.
    - If an attention option fails at load or at a short test forward, the next link of the
      plan's chain is used and the cause recorded; `strict=True` raises instead. Only an
      attention implementation you left to cudaload falls back.
    - `model.cudaload_plan` is the AppliedPlan: what was asked, chosen, and really applied.
      For a generating model (a causal or seq2seq LM) it has `.generation` (see `plan()`'s
      `generate=`): pass `generate=True, context=N, cache_implementation=..., padding_side=...` to
      choose, or `generate=False` to skip.

    Each plan warning (and an offload to CPU/disk) is issued once as a `CudaloadWarning`.

    Args:
        model: A local path (str or PathLike), a Hub id, or a `Plan` from `plan()` (then loaded
            as planned: `machine` is not used and no overrides are accepted).
        strict: Raise instead of falling back along the attention chain (default False).
        verify: Run a short test forward (8 token ids) and check its logits are finite (default
            True); False skips it (`AppliedPlan.verified` is then None). Once it has passed for
            this checkpoint (config.json and weight files), kwargs, package versions and machine, a
            later load does not run it again (`AppliedPlan.check_proven` says so and when it passed);
            "full" (or the environment variable CUDALOAD_VERIFY=full) runs it every time.
        machine: The `Machine` to plan for (default None: `detect()` this one, and measure the
            CPU dtype when planning for its CPU). A simulated machine is planned as given.
        model_class: The transformers Auto class (or model class) to load with, as a class or its
            name (e.g. "AutoModelForSequenceClassification", `BertModel`). Default None: the
            checkpoint's own architecture (config.json's "architectures"). A Plan loads through
            the class it was planned with (`Plan.auto_class`); naming another one is an error.
        allow_missing_weights: Accept weights the checkpoint does not hold, initialized at random
            (e.g. a new task head you will train), with a warning; they are listed in
            `AppliedPlan.missing_weights`. Default False: such a load raises LoadFailedError.
        **overrides: from_pretrained keyword arguments (`dtype`, `attn_implementation`,
            `device_map`, `max_memory`, `use_kernels`, `revision`, `trust_remote_code`, ...) and
            `plan()` keyword arguments (`workload`, `probe`, `hub_kernels`, `generate`, `context`,
            `cache_implementation`, `padding_side`, ...). Yours always win.

    Returns:
        The loaded transformers model (in eval mode), with `model.cudaload_plan` set to the
        `AppliedPlan`.

    Raises:
        ModelConfigError: `model` is not a path, Hub id or Plan, its config cannot be read, or
            `model_class` is not a transformers Auto class that supports it.
        RemoteCodeError: the model needs `trust_remote_code=True` and it was not given.
        LoadFailedError: loading failed for a reason no fallback can fix (the message
            names the likely cause); the checkpoint lacks weights of the model (unless
            `allow_missing_weights=True`) or holds weights its own architecture does not use;
            the test forward failed for a reason unrelated to attention;
            or an attention option failed with nothing to fall back to (you chose it,
            `strict=True`, or the chain ran out).
        SettingError: an override of the wrong type or an impossible generation setting
            (`WorkloadError` for an unknown `workload`); a Plan given with overrides, a `machine`,
            or a `model_class` other than the one it was planned with.
        DtypeUnsupportedError: a `dtype` this machine cannot run.
        AttentionUnavailableError: an `attn_implementation` this machine or model cannot run.
        PlacementError: a `device_map`/`max_memory` that cannot work here, or invalid launch variables.
        MissingPackageError: `use_kernels=True` without an accepted `kernels` package.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> model = cudaload.load(path, dtype="float32")
        >>> type(model).__name__, model.cudaload_plan.dtype, model.cudaload_plan.verified
        ('Qwen3ForCausalLM', 'float32', True)
        >>> model.cudaload_plan.generation.padding_side  # a decoder-only LM pads batches on the left
        'left'
    """
    start = time.perf_counter()
    if not isinstance(model, (str, os.PathLike, Plan)):
        raise ModelConfigError(
            f"load() takes a local path, a Hub id or a Plan, not {type(model).__name__}. To plan from a "
            "config object use cudaload.plan(config); to load, save the model and pass its folder."
        )
    from .capability.model_config import model_class_name

    for name, value in (("strict", strict), ("allow_missing_weights", allow_missing_weights)):
        check_flag(name, value, allow_none=False)
    if not isinstance(verify, bool) and verify != "full":
        raise SettingError(
            f'verify={verify!r} ({type(verify).__name__}): pass True, False, or "full" to run the test forward '
            "even when an earlier load proved it."
        )
    if "output_loading_info" in overrides:
        raise SettingError(
            "output_loading_info= is not passed through: load() reads transformers' loading report itself, raises "
            "on weights the checkpoint lacks and records the rest in model.cudaload_plan (missing_weights, "
            "unexpected_weights)."
        )
    if isinstance(model, Plan):
        given = [
            *(
                [f"model_class={model_class!r}"]
                if model_class_name(model_class) not in (None, model.auto_class)
                else []
            ),
            *(["machine"] if machine is not None else []),
            *overrides,
        ]
        if given:
            raise SettingError(
                f"load(plan) was given {', '.join(given)}: a Plan is loaded as planned "
                f"(for {model.machine}, through {model.auto_class}). Build the plan with them instead: "
                "cudaload.plan(model, ...)."
            )
        if model.finetune is not None:
            # load() applies no LoRA and no k-bit preparation: the model would come back untrainable,
            # with a plan that says it is set up for fine-tuning.
            raise SettingError(
                f"load(plan) was given a fine-tuning plan (LoRA r={model.finetune.lora.get('r')}, "
                f"quantize={_planned_quantize(model)!r}): load() applies neither the adapters nor the k-bit "
                "preparation. Pass it to cudaload.load_for_finetune(plan), or plan for inference "
                "(cudaload.plan(model) without finetune=True) to load with load()."
            )
        the_plan = model
    else:
        from .planner import plan

        overrides.setdefault("generate", None)  # plan generation for a generating model when its config allows
        the_plan = plan(str(model), machine=machine, model_class=model_class, **overrides)
    planned = time.perf_counter() - start
    loaded = apply_plan(the_plan, strict=strict, verify=verify, allow_missing_weights=allow_missing_weights)
    applied: AppliedPlan = loaded.cudaload_plan
    loaded.cudaload_plan = replace(applied, timings={"plan": planned, **applied.timings})
    return cast("PreTrainedModel", loaded)


def _planned_quantize(plan: Plan) -> Any:
    try:
        return plan.decision("quantize").value
    except KeyError:
        return None
