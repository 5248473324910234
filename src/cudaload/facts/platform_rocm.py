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
  shipped in the wheel, chosen by `get_cuda_bnb_library_path`: facts/bnb_rocm.py), installation.md ("official
  support for ... AMD GPUs"); its README's support table marks 8-bit optimizers supported on AMD GPUs, and a ROCm
  build is a `CudaBNBNativeLibrary` (cextension.py), whose `cget_managed_ptr` backs the paged optimizers.
- kernels 0.17 backends.py: `ROCm` (a `rocm{major}{minor}` build variant, chosen when torch.version.hip is set).
- vLLM vllm/platforms/rocm.py: `RocmPlatform` (amdsmi `amdsmi_get_gpu_asic_info`, gcnArchName).
- bf16: AMD Instinct datasheets (MI100: CDNA1; MI250X: CDNA2; MI300X/MI325X: CDNA3; MI350X/MI355X: CDNA4), the
  RDNA3 ISA guide (WMMA bf16), vLLM vllm/platforms/rocm.py: `RocmPlatform.check_if_supports_dtype`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..upstream import version_at_least
from ..upstream_flash import FLASH_OPTIONS
from .bnb_rocm import ROCM_SINCE, rocm_build
from .platform import Platform, PlatformGpu, Tf32

if TYPE_CHECKING:
    from .software import Software

__all__ = ["AMD", "BF16_ARCHS", "CK_FLASH_ARCHS", "MATRIX_ARCHS"]

BF16_ARCHS = frozenset({"gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100"})
"""gfx targets with bf16 matrix instructions, each from its source: CDNA1 (MI100, gfx908: bf16 MFMA, AMD's MI100
datasheet), CDNA2 (MI200, gfx90a), CDNA3 (MI300X/MI325X, gfx942), CDNA4 (MI350X/MI355X, gfx950: AMD's MI350 series
datasheet), RDNA3 (RX 7900 XTX / PRO W7900, gfx1100: WMMA bf16, AMD's RDNA3 ISA guide). vLLM agrees: its
vllm/platforms/rocm.py: `RocmPlatform.check_if_supports_dtype` refuses bf16 below capability 8.0, and
`_capability_from_gcn_arch` gives every gfx9 and gfx11 target 9.x or 11.x; bitsandbytes 0.50.2's README support
table lists gfx908, gfx90a, gfx942, gfx950 and gfx110X."""

MATRIX_ARCHS = frozenset(BF16_ARCHS)
"""gfx targets whose fp16 matmuls run on matrix units (CDNA1-4 MFMA, RDNA3 WMMA): the same targets."""

CK_FLASH_ARCHS = frozenset({"gfx90a", "gfx942", "gfx950"})
"""Where flash-attn's ROCm build runs its default CK backend: the README's "AMD ROCm Support" (MI200, MI300) and
flash-attention 2.8.3 setup.py `validate_and_update_archs` (allowed_archs: native, gfx90a, gfx950, gfx942): a build
for any other target stops there."""

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


def _quant_installed(package: str, software: Software) -> str | None:
    """bitsandbytes: a release with a ROCm backend, with a build torch's HIP version loads (facts/bnb_rocm.py)."""
    if package != "bitsandbytes":
        return None
    version = software.version(package)
    if version is not None and not version_at_least(version, ROCM_SINCE):
        return (
            f"bitsandbytes {version} has no ROCm backend: ROCm support starts at {ROCM_SINCE} (experimental; official "
            f"in 0.50), while CUDA's minimum is 0.46.1 (pip install 'bitsandbytes>=0.50')"
        )
    if software.bitsandbytes_builds is None or software.torch_hip is None:
        return None  # a simulated machine: its wheel's files are not known
    build, why = rocm_build(software.bitsandbytes_builds, software.torch_hip)
    return None if build is not None else why


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
    matrix_since="gfx908",
    tf32=_tf32,
    # bitsandbytes 0.50.2 README support table (AMD GPU: 8-bit optimizers supported) and cextension.py:
    # CudaBNBNativeLibrary (a ROCm build too) with cget_managed_ptr, the memory paged optimizers live in.
    paged_optimizers=None,
    quant_backend=_quant_backend,
    quant_installed=_quant_installed,
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
        "bitsandbytes 0.50.2 cextension.py: get_cuda_bnb_library_path",
        "kernels 0.17 backends.py: ROCm",
    ),
)
"""The AMD record (ROCm)."""
