"""`apply_plan()`: the fallback loop over the plan's attention chain, and what was applied."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import replace
from typing import Any

from ..errors import CudaloadError, CudaloadWarning, describe_error
from ..facts.quant_methods import config_method, quantization_method
from ..plans import Decision, Plan, Rejected
from .applied import AppliedPlan, Failure, Fallback
from .check_record import judge_proof, proven_check, record_passed
from .fsdp_loading import build_skeleton, skeleton_kwargs, skeleton_rank
from .hub_code import unasked_hub_code
from .kwargs import from_pretrained_kwargs, set_rank_device
from .readback import read_back
from .weights import WeightsReport, check_weights, offload_warning, offloaded_modules

logger = logging.getLogger("cudaload.loaders")
"""Under the "cudaload" logger (silent unless you configure logging): one INFO line per load, a WARNING per fallback."""

__all__ = ["apply_plan"]


_warned: set[str] = set()
_COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, CudaloadWarning, stacklevel=4)  # the caller of load()


def _as_applied(plan: Plan, chain: tuple[str, ...], fallbacks: list[Fallback]) -> Plan:
    """The plan as applied: the attention that worked, with the failed links among its rejections, and the
    generation section the policy decided for that attention (`Plan.generation_for`: selected, not decided)."""
    if not fallbacks:
        return plan
    planned = plan.decision("attn_implementation")
    applied = Decision(
        "attn_implementation",
        chain[0],
        f"fell back to it: {', '.join(f.option for f in fallbacks)} failed (see applied)",
        (*(Rejected(f.option, f"failed at {f.phase}: {f.error}") for f in fallbacks), *planned.rejected),
        planned.source,
    )
    decisions = tuple(applied if d is planned else d for d in plan.decisions)
    return replace(
        plan.with_attention(chain[0]),
        attention_chain=chain,
        decisions=decisions,
        generation=plan.generation_for(chain[0]),
    )


def _load_with(auto: Any, plan: Plan, option: str, skeleton: bool) -> tuple[Any, WeightsReport, Failure | None]:
    """(the model loaded with `option`, its weights report, None), or (None, an empty report, the failure).
    A `skeleton` rank builds it on the meta device and reads no weights (loaders/fsdp_loading.py)."""
    try:
        kwargs = from_pretrained_kwargs(plan.with_attention(option))
        split = skeleton_kwargs(kwargs) if skeleton else None
        if split is not None:
            return build_skeleton(auto, plan.model, *split), WeightsReport(), None
        model, info = auto.from_pretrained(plan.model, output_loading_info=True, **kwargs)
    except CudaloadError:
        raise  # cudaload's own errors already say what to do
    except Exception as exc:
        return None, WeightsReport(), Failure("load", describe_error(exc), exc)
    return model, WeightsReport.read(info), None


def _switch_to(model: Any, option: str) -> Failure | None:
    """Switch the loaded model in place to `option` (no weights are read again); the failure if
    transformers refuses it."""
    try:
        model.set_attn_implementation(option)
    except Exception as exc:
        return Failure("switch", describe_error(exc), exc)
    return None


def apply_plan(
    plan: Plan, *, strict: bool, verify: bool | str, training: bool = False, allow_missing_weights: bool = False
) -> Any:
    """Load `plan.model` through `plan.auto_class`, falling back along `plan.attention_chain`.

    One loop over the chain: load the first option (or, once a model is loaded and failed its test
    forward, switch it in place to the next), then run the test forward. A failure that is the
    option's (`is_attention_failure`) is recorded as a `Fallback` and the next option is tried;
    any other failure raises at once, as does the last option's or one cudaload may not leave.
    A test forward proven before is not run again unless `verify="full"` or `CUDALOAD_VERIFY=full`; the proof
    is judged here, on the host applying, against the checkpoint's files and packages now, not trusted from
    the plan (loaders/check_record.py); one that passes is recorded where the plan says.
    Weights the checkpoint does not fill raise before any test forward (`check_weights`).
    """
    from ..upstream_imports import import_bitsandbytes, import_transformers, resolve_auto_class

    import_transformers()
    if _quantizes_with_bitsandbytes(plan):  # transformers' bitsandbytes quantizer imports it: no Hub code unasked
        import_bitsandbytes(hub_code=plan.hub_code)
    # A quantized FSDP / ZeRO-3 rank, or a pre-quantized checkpoint on mixed GPUs: before the quantizer reads the
    # current device (policy/current_device.py, `decide_rank_device` and `decide_current_device`).
    set_rank_device(plan)
    judged = judge_proof(plan, verify=verify, training=training)  # here, before any weight is read
    skeleton = skeleton_rank(plan)  # an FSDP2 rank whose weights come from rank 0 when accelerate shards
    auto = resolve_auto_class(plan.auto_class)
    chain = plan.attention_chain
    can_fall_back = not strict and "attn_implementation" not in plan.explicit
    why = "strict=True" if strict else "you chose it" if not can_fall_back else "no option left in the chain"
    fallbacks: list[Fallback] = []
    timings: dict[str, float] = dict(plan.timings)  # "probe" when planning measured this CPU
    model: Any = None
    verified: bool | None = None
    skipped = ""
    report = WeightsReport()
    weight_notes: tuple[str, ...] = ()
    for index, option in enumerate(chain):
        start = time.perf_counter()
        # A link that would fetch Hub code the plan did not allow fails before transformers is asked.
        failure: Failure | None = unasked_hub_code(plan, option, "load" if model is None else "switch")
        if failure is None and model is None:
            model, report, failure = _load_with(auto, plan, option, skeleton)
            timings["load" if failure is None else f"load[{option}]"] = time.perf_counter() - start
            if failure is None:
                weight_notes = check_weights(plan, model, report, allow_missing_weights)
        elif failure is None:  # the loaded model failed its test forward: switch it in place, no weights read again
            failure = _switch_to(model, option)
            timings["verify"] = timings.get("verify", 0.0) + time.perf_counter() - start
        proven = proven_check(plan, option, judged) if failure is None and verify else None
        if proven is not None:  # passed before under the same key (loaders/check_record.py): not run again
            verified = True
        elif failure is None and verify:
            from .verify import verify_forward  # the test forward's code: a proven load runs none

            start = time.perf_counter()
            outcome = verify_forward(model, training)
            timings["verify"] = timings.get("verify", 0.0) + time.perf_counter() - start
            verified, failure = outcome.verified, outcome.failure
            skipped = outcome.problem if outcome.status == "skipped" else ""
            if outcome.status == "passed":
                record_passed(plan, option, judged)
        if failure is None:
            break
        from .attribution import is_attention_failure, no_fallback_error, unrelated_error  # a failure's, only

        if failure.error is not None and not is_attention_failure(failure.error, option):
            raise unrelated_error(plan, option, failure, fallbacks) from failure.error
        if not can_fall_back or index == len(chain) - 1:
            raise no_fallback_error(plan, option, failure, fallbacks, why) from failure.error
        fallbacks.append(Fallback(option, failure.phase, failure.problem))
        logger.warning(
            "%s: attn_implementation=%s failed at %s (%s); falling back to %s",
            plan.model,
            option,
            failure.phase,
            failure.problem.rstrip("."),
            chain[index + 1],
        )

    applied_plan = _as_applied(plan, chain[index:], fallbacks)
    device_map = getattr(model, "hf_device_map", None)
    offloaded = offloaded_modules(device_map, has_gpu=any(isinstance(v, int) for v in (device_map or {}).values()))
    notes = [*plan.warnings, *weight_notes]
    if offloaded:
        notes.append(offload_warning(plan.model, offloaded))
    dtype = str(model.dtype).removeprefix("torch.")  # transformers: the first floating parameter's
    notes.extend(_generation_dtype_note(applied_plan, dtype))
    notes.extend(read_back(applied_plan, model))  # every value the plan shows, against the model's own state
    for note in notes:
        _warn_once(note)
    applied = AppliedPlan(
        plan=applied_plan,
        attn_implementation=str(model.config._attn_implementation),
        dtype=dtype,
        device=str(model.device),
        device_map=dict(device_map) if device_map else None,
        fallbacks=tuple(fallbacks),
        offloaded=offloaded,
        verified=verified,
        verify_note=skipped,
        check_proven=proven or "",
        missing_weights=report.missing,
        unexpected_weights=report.unexpected,
        timings=timings,
        warnings=tuple(notes),
    )
    model.cudaload_plan = applied
    logger.info("%s", _summary(applied, type(model).__name__))
    return model


def _quantizes_with_bitsandbytes(plan: Plan) -> bool:
    """The plan quantizes with bitsandbytes (its quantization_config, built by a bitsandbytes record, or a dict of
    yours whose method is bitsandbytes) or loads a bitsandbytes checkpoint kept quantized."""
    if "quantization_config" in plan.kwargs:
        method = config_method(plan.decisions)
        if method is not None and method.package.distribution == "bitsandbytes":
            return True
        if method is None and quantization_method(plan.kwargs["quantization_config"]) == "bitsandbytes":
            return True
    return any(d.setting == "checkpoint_quantization" and d.value == "bitsandbytes" for d in plan.decisions)


def _generation_dtype_note(plan: Plan, dtype: str) -> tuple[str, ...]:
    """Said, not re-decided: the generation section was sized for the planned dtype (its KV cache is kept in
    the model's compute dtype), so a model that holds another compute dtype gets a note. An fp8 storage
    dtype (FineGrainedFP8) is no compute dtype: the cache stays in the planned one."""
    planned = plan.generation.dtype if plan.generation is not None else None
    if planned is None or dtype == planned or dtype not in _COMPUTE_DTYPES:
        return ()
    return (
        f"{plan.model}: the generation plan (KV cache per token, batch x context that fits) was made for "
        f"{planned}, and the loaded model holds {dtype}; plan with dtype={dtype!r} for sizes that match.",
    )


def _summary(applied: AppliedPlan, cls: str) -> str:
    """The one log line of a load: what was applied, where, and how long it took."""
    where = applied.device
    if applied.device_map:
        places = sorted({f"cuda:{p}" if isinstance(p, int) else str(p) for p in applied.device_map.values()})
        where = f"device_map {places[0]}" if len(places) == 1 else f"device_map over {', '.join(places)}"
    fell = f", fell back from {', '.join(f.option for f in applied.fallbacks)}" if applied.fallbacks else ""
    fell += ", test forward not run again: proven earlier" if applied.check_proven else ""
    took = ", ".join(f"{step} {seconds:.2f}s" for step, seconds in applied.timings.items())
    return (
        f"loaded {applied.plan.model} as {cls} on {where}: dtype={applied.dtype} attn_implementation="
        f"{applied.attn_implementation}{fell} ({took})"
    )
