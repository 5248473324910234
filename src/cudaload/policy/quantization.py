"""quantization_config for fine-tuning: a method of facts/quant_methods.py (4-bit nf4 QLoRA, 8-bit), none,
or "auto"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import MissingPackageError, QuantizationError, install_hint
from ..facts.dtypes import BYTES
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..facts.quant_methods import QUANT_METHODS, QuantMethod, quantize_choices
from ..facts.stored_weights import CheckpointQuantization
from ..plans import Decision, Rejected
from .fit import TRAINING_SHARE, format_bytes, judge_fit, pinned_gpu
from .kernels import kernels_status
from .memory import TrainingMemory

__all__ = [
    "CheckpointPlan",
    "bitsandbytes_status",
    "decide_checkpoint_quantization",
    "decide_quantization",
    "method_status",
]


def method_status(machine: Machine, method: QuantMethod) -> tuple[bool, str]:
    """(usable, why): is the package that runs `method` installed, with a backend for this machine?"""
    package = method.package
    version = machine.software.version(package)
    if version is None:
        return False, f"{package} is not installed ({install_hint(package)})"
    if not machine.gpus and not (method.cpu_since and machine.software.at_least(package, method.cpu_since)):
        since = f" ({method.cpu_since.removesuffix('.0')}+ has one)" if method.cpu_since else ""
        return False, f"{package} {version} has no CPU backend{since}; this machine has no CUDA GPU"
    return True, f"{package} {version} ({'CUDA' if machine.gpus else 'CPU'} backend)"


def bitsandbytes_status(machine: Machine) -> tuple[bool, str]:
    """`method_status` of the bitsandbytes methods (they share package and backends)."""
    return method_status(machine, _by_quant_method("bitsandbytes"))


def _by_quant_method(quant_method: str) -> QuantMethod:
    return next(m for m in QUANT_METHODS.values() if m.quant_method == quant_method)


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
            raise MissingPackageError(f"quantize={requested!r} was asked, but {why}.")
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
                f"your quantization_config: {QUANT_METHODS[own].package} {own} base weights (passed to "
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


# transformers 5.22.2 dequantizes MXFP4 when use_kernels=True on CUDA and requires it on the CPU
# (quantizer_mxfp4.py:171-184); 5.25.0 dropped both rules (5.23/5.24 not checked: treated as 5.22).
MXFP4_USE_KERNELS_RULE_UNTIL = "5.25.0"


def _at_least(machine: Machine, dist: str, minimum: str) -> tuple[bool, str]:
    version = machine.software.version(dist)
    if version is None:
        return False, f"{dist} is not installed"
    ok = machine.software.at_least(dist, minimum)
    return ok, f"{dist} {version}" + ("" if ok else f" is older than {minimum}")


def _transformers_before(machine: Machine, version: str) -> bool:
    """transformers is older than `version`, or missing, or its version does not parse."""
    return not machine.software.at_least("transformers", version)


def _mxfp4_blocker(machine: Machine, use_kernels: bool) -> str | None:
    """Why transformers would dequantize an MXFP4 checkpoint here (quantizer_mxfp4.py
    `validate_environment`, 5.22.2 lines 63-121 and 171-184); None when it keeps it quantized."""
    old_rule = _transformers_before(machine, MXFP4_USE_KERNELS_RULE_UNTIL)
    kernels_ok, kernels_why = kernels_status(machine)
    if not machine.gpus:
        if old_rule:
            return (
                f"on a CPU transformers {machine.software.version('transformers')} runs MXFP4 only with "
                "use_kernels=True (quantizer_mxfp4.py:179-184), and cudaload plans Hub layer kernels only on CUDA"
            )
        triton_ok, triton_why = _at_least(machine, "triton", "3.5.0")
        if not triton_ok:
            return f"MXFP4 on a CPU needs triton >= 3.5.0 (quantizer_mxfp4.py:85-88, 104-111): {triton_why}"
        return None if kernels_ok else f"MXFP4 needs the `kernels` package (quantizer_mxfp4.py:113-121): {kernels_why}"
    gpu = min(machine.gpus, key=lambda g: g.capability)
    if gpu.capability < (7, 5):
        return f"MXFP4 kernels need compute capability >= 7.5 and {gpu.name} is {gpu.sm} (quantizer_mxfp4.py:80-102)"
    triton_ok, triton_why = _at_least(machine, "triton", "3.4.0")
    if not triton_ok:
        return f"MXFP4 on CUDA needs triton >= 3.4.0 (quantizer_mxfp4.py:83, 104-111): {triton_why}"
    if not kernels_ok:
        return f"MXFP4 needs the `kernels` package (quantizer_mxfp4.py:84, 113-121): {kernels_why}"
    if use_kernels and old_rule:
        return (
            f"use_kernels=True makes transformers {machine.software.version('transformers')} dequantize MXFP4 on "
            "CUDA (quantizer_mxfp4.py:171-177)"
        )
    return None


def _missing_packages(machine: Machine, checkpoint: CheckpointQuantization) -> str | None:
    """What from_pretrained's `validate_environment` would raise ImportError for; None when nothing."""
    if any(m.quant_method == checkpoint.method for m in QUANT_METHODS.values()):
        usable, why = method_status(machine, _by_quant_method(checkpoint.method))
        return None if usable else why
    needs: tuple[tuple[str, str], ...] = ()
    if checkpoint.method == "gptq":
        needs = (("optimum", "1.24.0"), ("gptqmodel", "1.4.3"))  # quantizer_gptq.py:35-36, 55-72
    elif checkpoint.method == "awq":
        needs = (("gptqmodel", "0"),)  # quantizer_awq.py:45-49
    elif checkpoint.method == "compressed-tensors":
        needs = (("compressed-tensors", "0.15.0"),)  # quantizer_compressed_tensors.py:68-72
    problems = [why for ok, why in (_at_least(machine, d, v) for d, v in needs) if not ok]
    return "; ".join(problems) or None


def _dequantized_why(machine: Machine, checkpoint: CheckpointQuantization, use_kernels: bool) -> str | None:
    """Why transformers would not keep this checkpoint's weights quantized here; None when it does."""
    if checkpoint.bits is None:
        return f"cudaload does not know how {checkpoint.method} stores weights: sized in the plan's dtype"
    if checkpoint.dequantize:
        return "its quantization_config asks for dequantize=True"
    if checkpoint.method == "mxfp4":
        return _mxfp4_blocker(machine, use_kernels)
    if checkpoint.method == "fp8":
        # quantizer_finegrained_fp8.py:39-57: no GPU, or below sm89, dequantizes to bf16.
        if not machine.gpus:
            return "FP8 weights need a GPU (quantizer_finegrained_fp8.py:39-46)"
        gpu = min(machine.gpus, key=lambda g: g.capability)
        if gpu.capability < (8, 9):
            return (
                f"FP8 matmuls need compute capability >= 8.9 and {gpu.name} is {gpu.sm} "
                "(quantizer_finegrained_fp8.py:48-57)"
            )
    if checkpoint.method == "compressed-tensors":
        # Without the FP8 kernel path the compressed weights are decompressed on the first forward
        # (quantizer_compressed_tensors.py, `_process_model_after_weight_loading`); the FP8 path needs
        # use_optimized_inference and sm89+ (`validate_environment`).
        fp8 = checkpoint.option("type") == "float" and checkpoint.option("num_bits") == "8"
        weakest = min(machine.gpus, key=lambda g: g.capability) if machine.gpus else None
        if not (fp8 and checkpoint.option("optimized") == "True" and weakest and weakest.capability >= (8, 9)):
            return (
                "compressed-tensors decompresses the weights on the first forward unless FP8 weights run its FP8 "
                "kernels (use_optimized_inference=True, compute capability >= 8.9)"
            )
    return None


def _refuse_unloadable(machine: Machine, model: ModelFacts, checkpoint: CheckpointQuantization) -> None:
    """Raise, with upstream's own reason, for a pre-quantized checkpoint transformers refuses to load here
    (its quantizer's `validate_environment` raises): planning a "dequantized" copy would be a plan that never loads."""
    what = f"{model.source} is a pre-quantized {checkpoint.label} checkpoint"
    if checkpoint.method == "nvfp4":
        raise QuantizationError(
            f'{what}, and transformers refuses to load one: "Loading pre-quantized NVFP4 checkpoints is not '
            'supported yet." (quantizers/quantizer_nvfp4.py:53-54, `validate_environment`, 5.22.2 and 5.25.0). '
            "Use the unquantized checkpoint (NVFP4 can quantize it at load on sm100+), or another format."
        )
    if checkpoint.method != "fbgemm_fp8":
        return
    if not machine.gpus:
        raise QuantizationError(
            f'{what}, and transformers refuses it without a GPU: "Using fbgemm fp8 quantization requires a GPU or '
            'XPU" (quantizers/quantizer_fbgemm_fp8.py:55-56). Plan it for a GPU with compute capability >= 9.0.'
        )
    # The quantizer reads torch.cuda.get_device_capability() of the current device (quantizer_fbgemm_fp8.py:68-74):
    # cudaload makes the GPU it places the model on current (the `cuda_device` decision), the weakest of a spread.
    gpu = min(machine.gpus, key=lambda g: g.capability)
    if gpu.capability < (9, 0):
        raise QuantizationError(
            f'{what}, and {gpu.name} is {gpu.sm}: transformers refuses it, "FP8 quantized models is only supported '
            'on GPUs with compute capability >= 9.0 (e.g H100)" (quantizers/quantizer_fbgemm_fp8.py:68-74). '
            "Use a Hopper or newer GPU, or the unquantized checkpoint."
        )
    if not any(machine.software.version(d) for d in ("fbgemm-gpu", "fbgemm-gpu-genai")):
        raise MissingPackageError(
            f'{what}, and fbgemm-gpu is not installed: transformers raises "Loading an FP8 fbgemm quantized model '
            'on CUDA requires fbgemm-gpu library" (quantizers/quantizer_fbgemm_fp8.py:59-63). Install fbgemm-gpu '
            "(https://pytorch.org/FBGEMM/fbgemm_gpu-development/InstallationInstructions.html)."
        )


@dataclass(frozen=True)
class CheckpointPlan:
    """What happens to an already-quantized checkpoint here.

    Attributes:
        decision: The "checkpoint_quantization" Decision.
        dequantized_to: The dtype transformers dequantizes the quantized weights to; None when they stay
            quantized.
        missing: Why from_pretrained would raise ImportError (a package the method needs); None if nothing.
        trainable: Its quantizer allows training (`HfQuantizer.is_trainable`).
        warnings: What to tell the user.
    """

    decision: Decision
    dequantized_to: str | None
    missing: str | None
    trainable: bool
    warnings: tuple[str, ...] = ()


def decide_checkpoint_quantization(
    machine: Machine, model: ModelFacts, dtype: str, use_kernels: bool, dequantize: bool = False
) -> CheckpointPlan | None:
    """Whether transformers keeps an already-quantized checkpoint's weights quantized on this machine
    (their size, the plan's weight bytes, follows), or dequantizes them; None for a checkpoint that is
    not quantized. `dequantize`: your own quantization_config asks for it."""
    checkpoint = model.quantization
    if checkpoint is None:
        return None
    _refuse_unloadable(machine, model, checkpoint)
    why = "your quantization_config asks for dequantize=True" if dequantize else None
    why = why or _dequantized_why(machine, checkpoint, use_kernels)
    missing = _missing_packages(machine, checkpoint)
    warnings: tuple[str, ...] = ()
    if missing is not None:
        warnings = (
            f"{model.source} is a {checkpoint.label} checkpoint and {missing}: from_pretrained will raise. "
            "Install what it needs (transformers' quantization docs list it).",
        )
    rest = model.parameters - checkpoint.quantized_parameters
    if why is None:
        stored = checkpoint.stored_bytes()
        unquantized = f"~{format_bytes(checkpoint.quantized_parameters * BYTES[dtype])} in {dtype} instead"
        reason = (
            f"the checkpoint is {checkpoint.label}: {checkpoint.quantized_parameters:,} weights stay quantized at "
            f"{checkpoint.bits:.3g} bits (~{format_bytes(stored)}), the other {rest:,} parameters in {dtype}; "
            "cudaload never quantizes it again"
        )
        trainable = checkpoint.method != "mxfp4"  # quantizer_mxfp4.py:208-213: is_trainable is False
        return CheckpointPlan(
            Decision(
                "checkpoint_quantization",
                checkpoint.method,
                reason,
                (Rejected("dequantized", unquantized),),
            ),
            None,
            missing,
            trainable,
            warnings,
        )
    # MXFP4 and FP8 dequantize to bf16 (quantizer_mxfp4.py:99-120 "dequantizing the model to bf16",
    # integrations/mxfp4.py `_convert_moe_packed_tensors(dtype=torch.bfloat16)`; quantizer_finegrained_fp8.py:42, 54).
    target = "bfloat16" if checkpoint.method in ("mxfp4", "fp8") else dtype
    decision = Decision(
        "checkpoint_quantization",
        "dequantized",
        f"the checkpoint is {checkpoint.label}, but {why}: its quantized weights are sized in {target} "
        f"(~{format_bytes(checkpoint.quantized_parameters * BYTES[target])})",
        (Rejected(checkpoint.method, why),),
    )
    if checkpoint.bits is not None and not dequantize:
        warnings += (
            f"{model.source}: {checkpoint.label} weights will be dequantized to {target} here ({why}), "
            f"~{format_bytes(checkpoint.quantized_parameters * (BYTES[target] - checkpoint.bits / 8))} more memory.",
        )
    return CheckpointPlan(decision, target, missing, True, warnings)


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
