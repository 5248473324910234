"""NVIDIA's record: the CUDA rules the policy used to test compute-capability numbers for, in one place.

Architecture is the compute capability (`Gpu.capability`, "sm_90"), compared as a tuple, never a float or a name.
Sources: NVIDIA's CUDA GPUs list and "CUDA Compatibility" guide; transformers 5.22-5.25
utils/import_utils.py (`is_torch_tf32_available`), modeling_flash_attention_utils.py
(FLASH_ATTENTION_COMPATIBILITY_MATRIX); flash-attention's builds (upstream_flash.FLASH_OPTIONS); vLLM's FlashAttention
preference (vllm/platforms/cuda.py: `CudaPlatform.get_attn_backend_cls`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..upstream import version_at_least
from ..upstream_flash import FA4_MAJORS_WIDE, FA4_WIDE_VERSION, FLASH_OPTIONS
from .platform import Platform, PlatformGpu, Tf32

if TYPE_CHECKING:
    from .software import Software

__all__ = ["FLASH_ORDER", "MIN_DRIVER", "NVIDIA", "flash_preference"]

MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
"""The oldest Linux driver each CUDA major runs on with minor-version compatibility (NVIDIA's "CUDA
Compatibility" guide, table "CUDA Toolkit and Minimum Required Driver Version")."""

FLASH_ORDER: dict[int | None, tuple[str, ...]] = {
    9: ("flash_attention_3", "flash_attention_4", "flash_attention_2"),
    10: ("flash_attention_4", "flash_attention_2"),
    None: ("flash_attention_2", "flash_attention_3", "flash_attention_4"),
}
"""FlashAttention versions in the order a GPU generation (compute-capability major) tries them, vLLM's
order; None: every other generation (and no GPU)."""


def flash_preference(major: int) -> tuple[str, ...]:
    """FlashAttention versions in order of preference for a GPU generation (vLLM's order)."""
    return FLASH_ORDER.get(major, FLASH_ORDER[None])


def _built_for(gpu: PlatformGpu, name: str, installed: str | None) -> str | None:
    """The generation rule of a version with fixed builds: the package's or the Hub build's majors."""
    option = FLASH_OPTIONS[name]
    major = gpu.capability[0]
    if major in (option.hub_majors if installed is None else option.majors):
        return None
    # The Hub build lacks a generation the package has: say where the kernels are missing.
    note = f" in the Hub build {option.hub_repo}" if installed is None and major in option.majors else ""
    return f"no {name} kernels for {gpu.sm} ({gpu.name}){note}"


def _fa4_generation(gpu: PlatformGpu, name: str, installed: str | None) -> str | None:
    """FA4's builds grew by version (FA4_WIDE_VERSION); the Hub build and a wide package run only the forward
    on sm80."""
    option = FLASH_OPTIONS[name]
    major = gpu.capability[0]
    wide = installed is not None and version_at_least(installed, FA4_WIDE_VERSION)
    majors = option.hub_majors if installed is None else FA4_MAJORS_WIDE if wide else option.majors
    if major in majors:
        return None
    if (wide or installed is None) and major == 8:
        # transformers would not stop it: the major >= 9 check is only in its error path (upstream_flash.py).
        which = f"flash-attn-4 {installed}" if installed else f"{option.hub_repo} (4.0.0.beta8)"
        return (
            f"{which} runs only its forward on {gpu.sm} ({gpu.name}; backward needs sm90+), "
            "and FlashAttention-2 is the Ampere kernel (vLLM's choice below sm90)"
        )
    if installed is not None and major in FA4_MAJORS_WIDE:
        return (
            f"no {name} kernels for {gpu.sm} ({gpu.name}) before flash-attn-4 {FA4_WIDE_VERSION} "
            f"(installed: {installed})"
        )
    return _built_for(gpu, name, installed)


def _flash_generation(gpu: PlatformGpu, name: str, installed: str | None) -> str | None:
    return (_fa4_generation if name == "flash_attention_4" else _built_for)(gpu, name, installed)


def _bf16(gpu: PlatformGpu) -> bool:
    # Native bf16 arrived with Ampere (sm80). torch.cuda.is_bf16_supported() says True
    # on a T4 because it emulates it, so it must not be used to decide.
    return gpu.capability >= (8, 0)


def _bf16_missing(gpu: PlatformGpu) -> str:
    return (
        f"bfloat16 needs compute capability 8.0 or newer and {gpu.name} (cuda:{gpu.index}) has "
        f"{gpu.capability[0]}.{gpu.capability[1]}"
    )


def _tf32(gpu: PlatformGpu, current: PlatformGpu | None) -> Tf32:
    """TF32 tensor cores came with Ampere (sm80), as bf16 did; TrainingArguments(tf32=True) raises unless
    `is_torch_tf32_available()`, which reads `torch.cuda.current_device()` (transformers 5.22-5.25
    utils/import_utils.py), not the model's GPU."""
    if not _bf16(gpu):
        return None, "", ""
    if current is not None and not _bf16(current):
        return (
            False,
            f"the current CUDA device when TrainingArguments checks TF32 is cuda:{current.index} "
            f"({current.name}, {current.sm}), which has none (is_torch_tf32_available): tf32=True would raise",
            f"{gpu.sm} has TF32, but TrainingArguments judges the current device",
        )
    return True, f"{gpu.sm} has TF32 tensor cores: fp32 matmuls (LoRA, optimizer) run faster", ""


def _simulate(software: Software) -> Software:
    return replace(software, torch_cuda="12.8")


NVIDIA = Platform(
    vendor="nvidia",
    label="NVIDIA",
    runtime="CUDA",
    torch_build=lambda software: software.torch_cuda,
    simulate_build=_simulate,
    bf16=_bf16,
    bf16_since="sm80",
    bf16_missing=_bf16_missing,
    # Tensor cores came with Volta (sm70): below it fp16 only halves the memory.
    fp16_tensor_cores=lambda gpu: gpu.capability >= (7, 0),
    tf32=_tf32,
    paged_optimizers=None,
    quant_backend=lambda package: None,
    flash_order=lambda gpu: flash_preference(gpu.capability[0]),
    flash_generation=_flash_generation,
    flash_arch_rules=True,
    min_driver=MIN_DRIVER,
    sources=(
        "https://developer.nvidia.com/cuda-gpus",
        "transformers 5.22-5.25 utils/import_utils.py: is_torch_tf32_available",
        "vllm/platforms/cuda.py: CudaPlatform.get_attn_backend_cls",
    ),
)
"""The NVIDIA record."""
