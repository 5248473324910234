"""A pre-quantized checkpoint: whether transformers keeps its weights quantized here or dequantizes them,
what it needs installed, and which checkpoints it refuses to load at all."""

from __future__ import annotations

from ..errors import MissingPackageError, QuantizationError
from ..facts.dtypes import BYTES
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..facts.stored_weights import CheckpointQuantization
from ..plans import Decision, Rejected
from ..plans.checkpoint import CheckpointPlan
from .checkpoint_rocm import check_on_rocm
from .fit import format_bytes
from .kernels import kernels_status
from .quantization import quant_method_status

__all__ = ["decide_checkpoint_quantization"]


# transformers 5.22.2 dequantizes MXFP4 when use_kernels=True on CUDA and requires it on the CPU
# (transformers 5.22 quantizers/quantizer_mxfp4.py: Mxfp4HfQuantizer._process_model_before_weight_loading);
# 5.25.0 dropped both rules (5.23/5.24 not checked: treated as 5.22).
MXFP4_USE_KERNELS_RULE_UNTIL = "5.25.0"
# Where transformers decides, cited in the reasons shown to users.
_MXFP4_CHECK = "transformers 5.22-5.25 quantizer_mxfp4.py: Mxfp4HfQuantizer.validate_environment"
_FP8_CHECK = "transformers 5.22-5.25 quantizer_finegrained_fp8.py: FineGrainedFP8HfQuantizer.validate_environment"
_FBGEMM_CHECK = "5.22-5.25 quantizer_fbgemm_fp8.py: FbgemmFp8HfQuantizer.validate_environment"


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
    """Why transformers would dequantize an MXFP4 checkpoint here
    (transformers 5.22-5.25 quantizers/quantizer_mxfp4.py: Mxfp4HfQuantizer.validate_environment, and in 5.22
    quantizers/quantizer_mxfp4.py: Mxfp4HfQuantizer._process_model_before_weight_loading); None when it keeps it
    quantized."""
    old_rule = _transformers_before(machine, MXFP4_USE_KERNELS_RULE_UNTIL)
    kernels_ok, kernels_why = kernels_status(machine)
    if not machine.gpus:
        triton_ok, triton_why = _at_least(machine, "triton", "3.5.0")
        if not triton_ok:
            return f"MXFP4 on a CPU needs triton >= 3.5.0 ({_MXFP4_CHECK}): {triton_why}"
        if not kernels_ok:
            return f"MXFP4 needs the `kernels` package ({_MXFP4_CHECK}): {kernels_why}"
        if old_rule and not use_kernels:
            return (
                f"on a CPU transformers {machine.software.version('transformers')} runs MXFP4 only with "
                "use_kernels=True "
                "(5.22 quantizers/quantizer_mxfp4.py: Mxfp4HfQuantizer._process_model_before_weight_loading), "
                "which fetches kernels-community/megablocks from the Hub: pass use_kernels=True to keep it quantized"
            )
        return None
    gpu = min(machine.gpus, key=lambda g: g.capability)
    if gpu.capability < (7, 5):
        return f"MXFP4 kernels need compute capability >= 7.5 and {gpu.name} is {gpu.sm} ({_MXFP4_CHECK})"
    triton_ok, triton_why = _at_least(machine, "triton", "3.4.0")
    if not triton_ok:
        return f"MXFP4 on CUDA needs triton >= 3.4.0 ({_MXFP4_CHECK}): {triton_why}"
    if not kernels_ok:
        return f"MXFP4 needs the `kernels` package ({_MXFP4_CHECK}): {kernels_why}"
    if use_kernels and old_rule:
        return (
            f"use_kernels=True makes transformers {machine.software.version('transformers')} dequantize MXFP4 on "
            "CUDA (5.22 quantizer_mxfp4.py: Mxfp4HfQuantizer._process_model_before_weight_loading)"
        )
    return None


def _missing_packages(machine: Machine, checkpoint: CheckpointQuantization) -> str | None:
    """What from_pretrained's `validate_environment` would raise ImportError for; None when nothing."""
    status = quant_method_status(machine, checkpoint.method)
    if status is not None:
        usable, why = status
        return None if usable else why
    needs: tuple[tuple[str, str], ...] = ()
    if checkpoint.method == "gptq":
        # transformers 5.22-5.25 quantizers/quantizer_gptq.py: GptqHfQuantizer.validate_environment
        # (and MIN_OPTIMUM_VERSION, MIN_GPTQ_VERSION)
        needs = (("optimum", "1.24.0"), ("gptqmodel", "1.4.3"))
    elif checkpoint.method == "awq":
        # transformers 5.22-5.25 quantizers/quantizer_awq.py: AwqQuantizer.validate_environment
        needs = (("gptqmodel", "0"),)
    elif checkpoint.method == "compressed-tensors":
        # transformers 5.22-5.25 quantizers/quantizer_compressed_tensors.py:
        # CompressedTensorsHfQuantizer.validate_environment
        needs = (("compressed-tensors", "0.15.0"),)
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
        # No GPU, or below sm89, dequantizes to bf16 (_FP8_CHECK).
        if not machine.gpus:
            return f"FP8 weights need a GPU ({_FP8_CHECK})"
        gpu = min(machine.gpus, key=lambda g: g.capability)
        if gpu.capability < (8, 9):
            return f"FP8 matmuls need compute capability >= 8.9 and {gpu.name} is {gpu.sm} ({_FP8_CHECK})"
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
            'supported yet." (5.22-5.25 quantizers/quantizer_nvfp4.py: NVFP4HfQuantizer.validate_environment). '
            "Use the unquantized checkpoint (NVFP4 can quantize it at load on sm100+), or another format."
        )
    if checkpoint.method != "fbgemm_fp8":
        return
    if not machine.gpus:
        raise QuantizationError(
            f'{what}, and transformers refuses it without a GPU: "Using fbgemm fp8 quantization requires a GPU or '
            f'XPU" ({_FBGEMM_CHECK}). Plan it for a GPU with compute capability >= 9.0.'
        )
    # The quantizer reads torch.cuda.get_device_capability() of the current device (_FBGEMM_CHECK):
    # cudaload makes the GPU it places the model on current (the `cuda_device` decision), the weakest of a spread.
    gpu = min(machine.gpus, key=lambda g: g.capability)
    if gpu.capability < (9, 0):
        raise QuantizationError(
            f'{what}, and {gpu.name} is {gpu.sm}: transformers refuses it, "FP8 quantized models is only supported '
            f'on GPUs with compute capability >= 9.0 (e.g H100)" ({_FBGEMM_CHECK}). '
            "Use a Hopper or newer GPU, or the unquantized checkpoint."
        )
    if not any(machine.software.version(d) for d in ("fbgemm-gpu", "fbgemm-gpu-genai")):
        raise MissingPackageError(
            f'{what}, and fbgemm-gpu is not installed: transformers raises "Loading an FP8 fbgemm quantized model '
            f'on CUDA requires fbgemm-gpu library" ({_FBGEMM_CHECK}). Install fbgemm-gpu '
            "(https://pytorch.org/FBGEMM/fbgemm_gpu-development/InstallationInstructions.html)."
        )


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
    on_rocm = check_on_rocm(machine, model, checkpoint, dequantize)  # raises for FP8 kept quantized on AMD
    why = "your quantization_config asks for dequantize=True" if dequantize else None
    why = why or _dequantized_why(machine, checkpoint, use_kernels)
    missing = _missing_packages(machine, checkpoint)
    warnings: tuple[str, ...] = ()
    if missing is not None:
        warnings = (
            f"{model.source} is a {checkpoint.label} checkpoint and {missing}: from_pretrained will raise. "
            "Install what it needs (transformers' quantization docs list it).",
        )
    warnings += on_rocm
    rest = model.parameters - checkpoint.quantized_parameters
    if why is None:
        stored = checkpoint.stored_bytes()
        unquantized = f"~{format_bytes(checkpoint.quantized_parameters * BYTES[dtype])} in {dtype} instead"
        reason = (
            f"the checkpoint is {checkpoint.label}: {checkpoint.quantized_parameters:,} weights stay quantized at "
            f"{checkpoint.bits:.3g} bits (~{format_bytes(stored)}), the other {rest:,} parameters in {dtype}; "
            "cudaload never quantizes it again"
        )
        # MXFP4 does not train quantized (transformers 5.22-5.25 quantizers/quantizer_mxfp4.py:
        # Mxfp4HfQuantizer.is_trainable is False).
        trainable = checkpoint.method != "mxfp4"
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
    # MXFP4 and FP8 dequantize to bf16: "dequantizing the model to bf16" in
    # transformers 5.22-5.25 quantizers/quantizer_mxfp4.py: Mxfp4HfQuantizer.validate_environment and
    # 5.22-5.25 quantizers/quantizer_finegrained_fp8.py: FineGrainedFP8HfQuantizer.validate_environment;
    # `dtype=torch.bfloat16` in 5.22-5.25 integrations/mxfp4.py: _convert_moe_packed_tensors.
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
