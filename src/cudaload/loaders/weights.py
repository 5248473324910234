"""What the loaded weights say: transformers' loading report (missing, unexpected) and modules offloaded off the GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import LoadFailedError
from ..frozen import frozen
from ..plans import Plan
from .applied import listed_keys

__all__ = ["WeightsReport", "check_weights", "offload_warning", "offloaded_modules"]  # used by apply.py


def offloaded_modules(device_map: Mapping[str, Any] | None, has_gpu: bool) -> tuple[str, ...]:
    """Modules placed off the fast device: "disk" always, "cpu" when a GPU was available."""
    if not device_map:
        return ()
    slow = {"disk", "cpu"} if has_gpu else {"disk"}
    return tuple(f"{name or '(whole model)'} -> {where}" for name, where in device_map.items() if str(where) in slow)


def offload_warning(model: str, offloaded: tuple[str, ...]) -> str:
    """What to say when from_pretrained's device_map put modules on the CPU or disk (known only after
    loading, from the model's `hf_device_map`)."""
    shown = ", ".join(offloaded[:4]) + (", ..." if len(offloaded) > 4 else "")
    return (
        f"{model}: device_map offloaded {len(offloaded)} module(s) ({shown}): every forward copies those weights "
        "back (from disk or CPU), which is many times slower. Quantize (4-bit), add GPU memory, or pick a smaller "
        "model."
    )


@frozen
class WeightsReport:
    """What transformers' loading report (`output_loading_info=True`) says of the checkpoint's weights."""

    missing: tuple[str, ...] = ()
    """Weights the model has and the checkpoint lacks (or holds in another shape): initialized at random."""
    unexpected: tuple[str, ...] = ()
    """Weights the checkpoint holds and the model has no place for: not used."""

    @classmethod
    def read(cls, info: Mapping[str, Any]) -> WeightsReport:
        mismatched = {str(entry[0]) for entry in info.get("mismatched_keys") or ()}
        return cls(
            missing=tuple(sorted({str(k) for k in info.get("missing_keys") or ()} | mismatched)),
            unexpected=tuple(sorted(str(k) for k in info.get("unexpected_keys") or ())),
        )


def check_weights(plan: Plan, model: Any, report: WeightsReport, allow_missing: bool) -> tuple[str, ...]:
    """Raise when the checkpoint does not fill the model; the warnings to issue otherwise.

    A weight the checkpoint lacks is initialized at random by from_pretrained, which only logs it:
    the model then runs (the test forward passes) and answers nonsense. Unused checkpoint weights
    are an error when the model is the checkpoint's own architecture (config.json and weights
    disagree); when you chose another class (e.g. a base model from a checkpoint with a head) they
    are what you asked for, recorded in `AppliedPlan.unexpected_weights`.
    """
    cls = type(model).__name__
    notes: list[str] = []
    if report.missing:
        if not allow_missing:
            raise LoadFailedError(
                f"{plan.model} loaded as {cls}, but its checkpoint lacks {len(report.missing)} of the model's "
                f"weights, which from_pretrained initialized at random: {listed_keys(report.missing)}. The checkpoint "
                "is incomplete, or it was saved from another architecture: pass the model_class it was saved "
                "with (config.json's 'architectures'), or re-save it. To train these weights (e.g. a new task "
                "head), pass allow_missing_weights=True."
            )
        notes.append(
            f"{plan.model}: {len(report.missing)} weights are not in the checkpoint and were initialized at random "
            f"(allow_missing_weights=True): {listed_keys(report.missing)}. Train them before using the model's outputs."
        )
    if report.unexpected and cls in (getattr(model.config, "architectures", None) or ()):
        raise LoadFailedError(
            f"{plan.model} loaded as {cls}, its own architecture, but {len(report.unexpected)} checkpoint weights "
            f"have no place in it and were not used: {listed_keys(report.unexpected)}. config.json and the weights "
            "disagree (e.g. num_hidden_layers edited after saving): fix the config or re-save the model."
        )
    return tuple(notes)
