"""AMD's record: what transformers, flash-attn, bitsandbytes and kernels document for a ROCm (HIP) torch.

Architecture is the gfx target (`Gpu.arch`, e.g. "gfx942" for MI300X, "gfx90a" for MI200), the name
`torch.cuda.get_device_properties(i).gcnArchName` and amdsmi's `target_graphics_version` give, without feature
suffixes (":sramecc+:xnack-"). A rule cudaload cannot find documented for ROCm is not guessed: the option is not
planned and its reason says so ("not documented for ROCm"). Sources, each by symbol:

- transformers 5.22-5.25 utils/import_utils.py: `is_rocm_platform` (torch.version.hip) and
  `is_torch_tf32_available` (False when torch.version.cuda is None, so TrainingArguments(tf32=True) raises);
  modeling_flash_attention_utils.py: FLASH_ATTN_KERNEL_FALLBACK (FA2 and FA3 fall back to
  kernels-community/aiter-flash-attn on ROCm), FLASH_ATTN_KERNEL_DEVICES (flash-attn4, vllm-flash-attn3: "cuda").
- flash-attention README, "AMD ROCm Support": the CK backend for MI200 and MI300 (gfx90a, gfx942);
  flash_attn/flash_attn_triton_amd/README.md: a Triton backend for CDNA and RDNA, chosen at install time
  (FLASH_ATTENTION_TRITON_AMD_ENABLE), which the installed distribution does not tell apart.
- bitsandbytes 0.50.2 cextension.py (BNB_BACKEND "ROCm" when torch.version.hip is set, libbitsandbytes_rocm*.so
  shipped in the wheel), installation.md ("official support for ... AMD GPUs"); nothing on paged optimizers.
- kernels 0.17 backends.py: `ROCm` (a `rocm{major}{minor}` build variant, chosen when torch.version.hip is set).
- vLLM vllm/platforms/rocm.py: `RocmPlatform` (amdsmi `amdsmi_get_gpu_asic_info`, gcnArchName).
- bf16: AMD Instinct datasheets (MI250X: CDNA2 bf16 matrix cores; MI300X/MI325X: CDNA3).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..upstream_flash import FLASH_OPTIONS
from .platform import Platform, PlatformGpu, Tf32

if TYPE_CHECKING:
    from .software import Software

__all__ = ["AMD", "BF16_ARCHS", "CK_FLASH_ARCHS", "MATRIX_ARCHS"]

BF16_ARCHS = frozenset({"gfx90a", "gfx942"})
"""gfx targets with bf16 matrix cores documented here (CDNA2: MI200; CDNA3: MI300X, MI325X)."""

MATRIX_ARCHS = frozenset({"gfx908", *BF16_ARCHS})
"""gfx targets whose fp16 matmuls run on matrix cores (CDNA1-3)."""

CK_FLASH_ARCHS = frozenset({"gfx90a", "gfx942"})
"""Where flash-attn's ROCm build runs its default CK backend (flash-attention README, "AMD ROCm Support":
MI200 and MI300)."""

_HUB_FALLBACK = "kernels-community/aiter-flash-attn"
_FALLBACK_SOURCE = "transformers 5.22-5.25 modeling_flash_attention_utils.py: FLASH_ATTN_KERNEL_FALLBACK"


def _flash_generation(gpu: PlatformGpu, name: str, installed: str | None) -> str | None:
    """flash-attn's ROCm build (FA2) on the CK architectures; everything else is not documented for ROCm."""
    arch = gpu.arch
    if installed is None and name in ("flash_attention_2", "flash_attention_3"):
        return (
            f"on ROCm transformers fetches {_HUB_FALLBACK} instead of {FLASH_OPTIONS[name].hub_repo} "
            f"({_FALLBACK_SOURCE}), and which gfx targets that build runs on is not documented for ROCm: "
            f"not planned on {gpu.name} ({arch})"
        )
    if name == "flash_attention_2":
        if arch in CK_FLASH_ARCHS:
            return None
        return (
            f"flash-attn's ROCm build runs its CK backend on MI200/MI300 ({', '.join(sorted(CK_FLASH_ARCHS))}) only "
            f"(flash-attention README, AMD ROCm Support); {arch} needs its Triton backend, chosen when flash-attn was "
            "built (FLASH_ATTENTION_TRITON_AMD_ENABLE), which the installed distribution does not say: not documented "
            "for ROCm here"
        )
    if name == "flash_attention_3":
        return f"flash-attn-3 (hopper/) is built for CUDA sm80/sm90 only: not documented for ROCm ({gpu.name}, {arch})"
    return (
        f"FlashAttention-4 is written in CuTe DSL for NVIDIA GPUs, and transformers lists its Hub build for "
        f'"cuda" only (FLASH_ATTN_KERNEL_DEVICES): not documented for ROCm ({gpu.name}, {arch})'
    )


def _bf16_missing(gpu: PlatformGpu) -> str:
    return (
        f"bfloat16 matrix cores are documented here for {', '.join(sorted(BF16_ARCHS))} only and {gpu.name} "
        f"(cuda:{gpu.index}) is {gpu.arch}"
    )


def _tf32(gpu: PlatformGpu, current: PlatformGpu | None) -> Tf32:
    return (
        False,
        "TF32 is not available to TrainingArguments on ROCm: transformers' is_torch_tf32_available() is False when "
        "torch.version.cuda is None (utils/import_utils.py)",
        "TrainingArguments(tf32=True) raises ValueError on a ROCm torch",
    )


def _quant_backend(package: str) -> str | None:
    if package == "bitsandbytes":
        return None  # bitsandbytes 0.50.2 cextension.py: BNB_BACKEND = "ROCm", libbitsandbytes_rocm*.so
    return f"{package} has no ROCm backend documented here: not planned on an AMD GPU"


def _simulate(software: Software) -> Software:
    # The ROCm of torch's rocm6.4 wheels; a simulated machine's build, as 12.8 is NVIDIA's.
    return replace(software, torch_hip="6.4")


AMD = Platform(
    vendor="amd",
    label="AMD",
    runtime="ROCm",
    torch_build=lambda software: software.torch_hip,
    simulate_build=_simulate,
    bf16=lambda gpu: gpu.arch in BF16_ARCHS,
    bf16_since="gfx90a",
    bf16_missing=_bf16_missing,
    fp16_tensor_cores=lambda gpu: gpu.arch in MATRIX_ARCHS,
    tf32=_tf32,
    paged_optimizers=(
        "bitsandbytes documents no paged optimizers for ROCm (0.50.2 installation.md lists ROCm support, not which "
        "optimizers run there): not documented for ROCm"
    ),
    quant_backend=_quant_backend,
    flash_order=lambda gpu: ("flash_attention_2", "flash_attention_3", "flash_attention_4"),
    flash_generation=_flash_generation,
    flash_note=lambda gpu, name: (
        f" (its ROCm build: the CK backend on {gpu.arch}, flash-attention README: AMD ROCm Support)"
        if name == "flash_attention_2"
        else ""
    ),
    # FA3's Hopper-only sinks and FA4's sm100 head dims are CUDA architecture rules: FA3 and FA4 are not
    # planned on ROCm at all (above), so they add nothing here.
    flash_arch_rules=False,
    sources=(
        "transformers 5.22-5.25 modeling_flash_attention_utils.py: FLASH_ATTN_KERNEL_FALLBACK",
        "flash-attention README: AMD ROCm Support",
        "bitsandbytes 0.50.2 cextension.py: BNB_BACKEND",
        "kernels 0.17 backends.py: ROCm",
    ),
)
"""The AMD record (ROCm)."""
