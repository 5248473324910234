"""quantization_config for fine-tuning: a method of facts/quant_methods.py (4-bit nf4 QLoRA, 8-bit), none,
or "auto"."""

from __future__ import annotations

from typing import Any

from ..errors import MissingPackageError, QuantizationError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..facts.packages import install_hint
from ..facts.quant_methods import QUANT_METHODS, QuantMethod, quantize_choices
from ..plans import Decision, Rejected
from ..plans.checkpoint import CheckpointPlan
from .fit import TRAINING_SHARE, format_bytes, judge_fit, pinned_gpu
from .memory import TrainingMemory

__all__ = [
    "bitsandbytes_status",
    "decide_quantization",
    "method_status",
    "package_status",
    "quant_method_status",
]


def package_status(machine: Machine, method: QuantMethod) -> tuple[bool, str]:
    """(usable, why): is `method`'s package installed, in a release transformers accepts (its
    `<NAME>_MIN_VERSION`)? What from_pretrained's quantizer raises ImportError for, on any device."""
    package, minimum = method.package.distribution, method.package.min_version
    version = machine.software.version(package)
    if version is None:
        return False, f"{package} is not installed ({install_hint(package)})"
    if minimum is not None and not machine.software.at_least(package, minimum):
        return False, (
            f"{package} {version} is older than {minimum}, the oldest transformers accepts "
            f"({install_hint(package, minimum)})"
        )
    return True, f"{package} {version}"


def method_status(machine: Machine, method: QuantMethod) -> tuple[bool, str]:
    """(usable, why): can cudaload quantize a base with `method` here: its package (`package_status`), with a
    backend for this machine (on a GPU, its vendor's record says)?"""
    usable, why = package_status(machine, method)
    if not usable:
        return usable, why
    package, version = method.package.distribution, machine.software.version(method.package.distribution)
    if not machine.gpus and method.cpu_since is None:
        return False, f"cudaload plans {package} only on a CUDA GPU (not verified on a CPU), and this machine has none"
    if not machine.gpus and not machine.software.at_least(package, method.cpu_since or ""):
        return False, (
            f"{package} {version} has no CPU backend ({(method.cpu_since or '').removesuffix('.0')}+ has one); "
            "this machine has no CUDA GPU"
        )
    gpu = machine.weakest_gpu
    no_backend = gpu.platform.quant_backend(package) if gpu is not None else None  # the vendor's record says
    if no_backend is not None:
        return False, no_backend
    # The installed release under the installed torch (bitsandbytes on ROCm: a release and a build for its HIP).
    release = gpu.platform.quant_installed(package, machine.software) if gpu is not None else None
    if release is not None:
        return False, release
    return True, f"{why} ({gpu.platform.runtime if gpu is not None else 'CPU'} backend)"


def bitsandbytes_status(machine: Machine) -> tuple[bool, str]:
    """`method_status` of the bitsandbytes methods (they share package and backends)."""
    method = next(m for m in QUANT_METHODS.values() if m.quant_method == "bitsandbytes")
    return method_status(machine, method)


def quant_method_status(machine: Machine, quant_method: str) -> tuple[bool, str] | None:
    """`package_status` of the methods whose config is transformers' `quant_method` (they share a package): what
    loading a checkpoint quantized with it needs, on any device; None when no method of QUANT_METHODS is."""
    method = next((m for m in QUANT_METHODS.values() if m.quant_method == quant_method), None)
    return package_status(machine, method) if method is not None else None


def _config(method: QuantMethod, dtype: str, machine: Machine) -> dict[str, Any]:
    return method.build(dtype, machine.launch.shards_parameters)


def decide_quantization(
    machine: Machine,
    model: ModelFacts,
    requested: str | None,
    dtype: str,
    estimates: dict[str | None, TrainingMemory],
    device_map: Any = None,
    checkpoint: CheckpointPlan | None = None,
    own: str | None = None,
) -> tuple[Decision, dict[str, Any] | None, tuple[str, ...]]:
    """(decision, BitsAndBytesConfig kwargs or None, warnings). `estimates` maps None/"4bit"/"8bit"
    to the training-memory estimate for that choice; `device_map` is the one you passed, if any: a
    single process judges the GPU it pins the model to. `checkpoint`: what happens to an
    already-quantized checkpoint here (`decide_checkpoint_quantization`): its own quantization is
    used ("checkpoint"), never stacked with another.

    "auto" asks fit.py's `judge_fit`, as placement does: the same GPU and budget for both."""
    if requested not in quantize_choices():
        methods = ", ".join(m.summary for m in QUANT_METHODS.values())
        raise QuantizationError(
            f"quantize={requested!r} is not a choice. Use {methods}, None (no quantization) "
            "or 'auto' (4-bit only when 16-bit LoRA would not fit)."
        )
    if checkpoint is not None:
        return _checkpoint_quantize(model, requested, checkpoint), None, ()
    if model.quantized is not None and requested in QUANT_METHODS:  # ModelFacts built without `quantization`
        raise QuantizationError(
            f"quantize={requested!r} was asked, but {model.source} is already quantized ({model.quantized}). "
            "Pass quantize='auto' (the default) or None to fine-tune it as it is."
        )
    if requested in QUANT_METHODS:
        method = QUANT_METHODS[requested]
        usable, why = method_status(machine, method)
        if not usable:
            # Name everything a QLoRA run needs at once: bitsandbytes, then peft at load time, was two round trips.
            both = "not installed" in why and machine.software.version("peft") is None
            also = "; peft (LoRA) is not installed either: install both with pip install bitsandbytes peft"
            also = also if both else ""
            raise MissingPackageError(f"quantize={requested!r} was asked, but {why}{also}.")
        return (
            Decision("quantize", requested, f"your choice: {method.detail.format(dtype=dtype)}", source="user"),
            _config(method, dtype, machine),
            (),
        )
    if requested is None and own in QUANT_METHODS:
        # Your quantization_config quantizes the base (passed to from_pretrained as you gave it): the estimate,
        # the placement and the optimizer must follow it, not "full precision".
        return (
            Decision(
                "quantize",
                own,
                f"your quantization_config: {QUANT_METHODS[own].package.distribution} {own} base weights (passed to "
                "from_pretrained as given); "
                f"the memory estimate, placement and optimizer follow it",
                source="user",
            ),
            None,
            (),
        )
    if requested is None and own is not None:
        return (
            Decision(
                "quantize",
                None,
                "your quantization_config (not bitsandbytes 4-/8-bit): passed to from_pretrained as given; the "
                "memory estimate assumes 16-bit base weights",
                source="user",
            ),
            None,
            (),
        )
    if requested is None:
        return Decision("quantize", None, "your choice: full-precision base weights", source="user"), None, ()
    return _auto_quantize(machine, dtype, estimates, device_map)


def _auto_quantize(
    machine: Machine,
    dtype: str,
    estimates: dict[str | None, TrainingMemory],
    device_map: Any,
) -> tuple[Decision, dict[str, Any] | None, tuple[str, ...]]:
    """quantize="auto": the `auto` method (4-bit) only when 16-bit LoRA does not fit the GPU."""
    method = next(m for m in QUANT_METHODS.values() if m.auto)
    usable, why = method_status(machine, method)
    plain, four = estimates[None], estimates[method.choice]
    if not machine.gpus:
        return (
            Decision(
                "quantize",
                None,
                "no GPU: the weights live in RAM, and 4-bit matmuls on CPU are slower",
                (Rejected(method.choice, "saves RAM, costs speed on CPU; pass quantize='4bit' to trade"),),
            ),
            None,
            (),
        )
    # Judged on the GPU placement uses (fit.py): on a mixed machine the one with most free memory,
    # under a distributed launch the smallest (every rank holds a copy).
    pinned = pinned_gpu(device_map)
    fit = judge_fit(machine, plain.total, TRAINING_SHARE, pinned)
    budget = fit.budget
    how = (
        f"estimated {format_bytes(plain.total)} for {dtype} LoRA (weights {format_bytes(plain.weights)}, LoRA+Adam "
        f"{format_bytes(plain.lora)}, activations {format_bytes(plain.activations)}) vs {format_bytes(budget)} "
        f"usable on {fit.where}"
    )
    if fit.fits:
        return (
            Decision(
                "quantize",
                None,
                f"{dtype} LoRA fits: {how}",
                (Rejected(method.choice, "not needed: slower and lossier than 16-bit LoRA"),),
            ),
            None,
            (),
        )
    if not usable:
        warning = f"16-bit LoRA will not fit ({how}) and 4-bit is unavailable: {why}."
        return (
            Decision("quantize", None, f"4-bit would be needed but {why}", (Rejected(method.choice, why),)),
            None,
            (warning,),
        )
    warnings: tuple[str, ...] = ()
    four_fit = judge_fit(machine, four.total, TRAINING_SHARE, pinned)
    # Placement spreads a copy that exceeds one GPU over all of them (unless a device_map pins one): 4-bit
    # "does not fit" only when it exceeds that too, or the plan would say both "spread over N GPUs" and this.
    spreads = pinned is None and len(four_fit.spread) > 1
    spread_total = sum(four_fit.spread.values())
    if not four_fit.fits and not (spreads and four_fit.fits_spread):
        where = f"{fit.where} has {format_bytes(budget)} usable" + (
            f" (the {len(four_fit.spread)} GPUs {format_bytes(spread_total)} together)" if spreads else ""
        )
        warnings = (
            f"Even 4-bit needs ~{format_bytes(four.total)} and {where}: shorten sequences, lower the batch, or use "
            "more or bigger GPUs.",
        )
    spread_note = (
        f", more than one GPU: placement spreads it over the {len(four_fit.spread)} GPUs "
        f"({format_bytes(spread_total)} usable together)"
        if not four_fit.fits and spreads and four_fit.fits_spread
        else ""
    )
    return (
        Decision(
            "quantize",
            method.choice,
            f"{dtype} LoRA does not fit ({how}); QLoRA needs ~{format_bytes(four.total)}{spread_note}",
            (Rejected(None, "does not fit"),),
        ),
        _config(method, dtype, machine),
        warnings,
    )


def _checkpoint_quantize(model: ModelFacts, requested: str | None, checkpoint: CheckpointPlan) -> Decision:
    """quantize= for an already-quantized checkpoint: "auto" and None take the checkpoint's own
    quantization ("checkpoint"); "4bit"/"8bit" would stack a second one and raise."""
    found = model.quantization
    assert found is not None  # a CheckpointPlan exists only for a quantized checkpoint
    if requested in QUANT_METHODS:
        raise QuantizationError(
            f"quantize={requested!r} was asked, but {model.source} is already quantized ({found.method}), as "
            f"{found.label}: "
            "cudaload does not quantize a quantized checkpoint again (transformers loads it with its own "
            "quantization_config). Pass quantize='auto' (the default) or None to fine-tune it as it is, or "
            "point to the unquantized checkpoint to choose 4-/8-bit yourself."
        )
    if checkpoint.missing is not None:
        raise MissingPackageError(
            f"{model.source} is a {found.label} checkpoint (fine-tuned with its own quantization), but "
            f"{checkpoint.missing}."
        )
    if not checkpoint.trainable and checkpoint.dequantized_to is None:
        raise QuantizationError(
            f"{model.source} is a {found.label} checkpoint, and transformers cannot train {found.label} weights "
            "(the quantizer's is_trainable is False). Pass quantize=None with "
            "quantization_config=Mxfp4Config(dequantize=True) to fine-tune a bf16 copy."
        )
    how = "your choice" if requested is None else "the checkpoint's own"
    stacked = Rejected("4bit", "already quantized: a second quantization is never stacked")
    if checkpoint.dequantized_to is not None:
        # Dequantized at load: the base is a plain 16-bit model, trained as one.
        reason = f"{how}: the checkpoint's {found.label} weights are dequantized to {checkpoint.dequantized_to} here"
        return Decision("quantize", None, reason, (stacked,), source="user" if requested is None else "auto")
    reason = f"{how}: the checkpoint is already {found.label}; LoRA trains on it as stored"
    return Decision("quantize", "checkpoint", reason, (stacked,), source="user" if requested is None else "auto")
