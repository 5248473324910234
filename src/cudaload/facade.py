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
from .request import check_flag, model_class_name

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
    """Load `model` (a local path, a Hub id, or a ready `Plan`) with the plan for this machine.

    `plan()`, then the from_pretrained call the plan stands for. An attention option you left to cudaload that
    fails at load or at the short test forward falls back to the next link of the plan's chain, and the cause
    is recorded; each plan warning is issued once as a `CudaloadWarning`. What falls back, what raises and what
    is recorded: [What load() does](#what-load-does) on the API page.

    Args:
        model: A local path (str or PathLike), a Hub id, or a `Plan` from `plan()` (then loaded as planned:
            `machine` is not used and no overrides are accepted).
        strict: Raise instead of falling back along the attention chain (default False).
        verify: Run a short test forward (8 token ids) and check its logits are finite (default True); False
            skips it (`AppliedPlan.verified` is then None). Once it has passed for this checkpoint (config.json and
            weight files), kwargs, package versions and machine, a later load does not run it again
            (`AppliedPlan.check_proven` says so and when); "full" (or CUDALOAD_VERIFY=full) runs it every time.
        machine: The `Machine` to plan for (default None: this one, detected). A simulated machine is planned
            as given.
        model_class: The transformers Auto class or model class to load with, or its name (default None: the
            checkpoint's own architecture). A Plan loads through the class it was planned with.
        allow_missing_weights: Accept weights the checkpoint does not hold, initialized at random (e.g. a new
            task head you will train), with a warning. Default False: such a load raises LoadFailedError.
        **overrides: from_pretrained keyword arguments (`dtype`, `attn_implementation`, `device_map`, ...) and
            `plan()` keyword arguments (`workload`, `hub_kernels`, `generate`, `context`, ...). Yours always win.

    Returns:
        The loaded transformers model (in eval mode), with `model.cudaload_plan` set to the `AppliedPlan`:
        what was asked, chosen and really applied.

    Raises:
        ModelConfigError: `model` is not a path, Hub id or Plan, its config cannot be read, or `model_class`
            does not support it.
        RemoteCodeError: the model needs `trust_remote_code=True` and it was not given.
        LoadFailedError: loading or the test forward failed for a reason no fallback can fix, an attention
            option failed with nothing to fall back to, or the checkpoint does not fill the model.
        SettingError: an override of the wrong type or an impossible generation setting (`WorkloadError` for
            an unknown `workload`); a Plan given with overrides, a `machine`, another `model_class`, or a
            fine-tuning plan.
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
    """
    start = time.perf_counter()
    if not isinstance(model, (str, os.PathLike, Plan)):
        raise ModelConfigError(
            f"load() takes a local path, a Hub id or a Plan, not {type(model).__name__}. To plan from a "
            "config object use cudaload.plan(config); to load, save the model and pass its folder."
        )
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
            lora = model.finetune.lora
            what, unapplied = (
                ("full training", "trainable weights nor the planned checkpointing")
                if lora is None
                else (f"LoRA r={lora.get('r')}", "adapters nor the k-bit preparation")
            )
            raise SettingError(
                f"load(plan) was given a fine-tuning plan ({what}, "
                f"quantize={_planned_quantize(model)!r}): load() applies neither the {unapplied}. "
                "Pass it to cudaload.load_for_finetune(plan), or plan for inference "
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
