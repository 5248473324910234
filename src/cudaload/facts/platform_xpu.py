"""Intel's record: what torch, transformers, bitsandbytes and kernels document for an XPU torch (Intel Arc,
Data Center GPU Max).

Architecture is Intel's device name family as `torch.xpu.get_device_properties(i)` reports it; the rules read
whether the GPU has XMX matrix engines (DPAS: `has_subgroup_matrix_multiply_accumulate`), which every Arc (Xe-HPG)
and Data Center Max (Xe-HPC) GPU has, so `arch` is "xe-hpg" or "xe-hpc". Sources, each by symbol:

- torch 2.13 xpu/__init__.py: `is_bf16_supported` (bf16 conversions; DPAS runs bf16 and fp16), `device_count`
  (counted through Level Zero Sysman, "will NOT poison fork", no runtime start) and `get_device_properties` (calls
  `_lazy_init`: the first call that starts the XPU runtime in the process).
- transformers 5.22-5.25 utils/import_utils.py: `is_torch_tf32_available` (False unless torch.version.cuda is set:
  TrainingArguments(tf32=True) raises on an XPU torch); modeling_flash_attention_utils.py: FLASH_ATTN_KERNEL_DEVICES
  (kernels-community/flash-attn2 lists "xpu"; flash-attn3/4, vllm-flash-attn3: "cuda" only).
- bitsandbytes 0.50.2 cextension.py: `XpuBNBNativeLibrary` ("SYCL USM paged memory support"), the
  libbitsandbytes_xpu*.so builds in the wheel, and its README support table (Intel GPU: LLM.int8, QLoRA 4-bit and
  8-bit optimizers for Data Center GPU Max, Arc A- and B-series).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .platform import Platform, PlatformGpu, Tf32, bitsandbytes_since

if TYPE_CHECKING:
    from .software import Software

__all__ = ["BITSANDBYTES_SINCE", "INTEL", "XMX_ARCHS"]

XMX_ARCHS = frozenset({"xe-hpg", "xe-hpc"})
"""Intel GPU architectures with XMX matrix engines (DPAS): Arc A-series (Xe-HPG), Data Center GPU Max (Xe-HPC)."""

_HUB_FA2 = "kernels-community/flash-attn2"
_DEVICES = "transformers 5.22-5.25 modeling_flash_attention_utils.py: FLASH_ATTN_KERNEL_DEVICES"


def _flash_generation(gpu: PlatformGpu, name: str, installed: str | None) -> str | None:
    if name == "flash_attention_2" and installed is None:
        return None  # the Hub build: transformers lists flash-attn2 for "xpu"
    if name == "flash_attention_2":
        return f"the flash-attn package is a CUDA build; on XPU transformers runs {_HUB_FA2}'s xpu build ({_DEVICES})"
    return f'{name}: transformers lists its Hub build for "cuda" only ({_DEVICES}): not on XPU ({gpu.name})'


def _tf32(gpu: PlatformGpu, current: PlatformGpu | None) -> Tf32:
    return (
        False,
        "TF32 is not available to TrainingArguments on XPU: transformers' is_torch_tf32_available() is False when "
        "torch.version.cuda is None (utils/import_utils.py)",
        "TrainingArguments(tf32=True) raises ValueError on an XPU torch",
    )


def _quant_backend(package: str) -> str | None:
    if package == "bitsandbytes":
        return None  # bitsandbytes 0.50.2: libbitsandbytes_xpu*.so, XpuBNBNativeLibrary
    return f"{package} has no XPU backend documented here: not planned on an Intel GPU"


BITSANDBYTES_SINCE = "0.48.0"
"""The first bitsandbytes release planned on XPU: its installation guide (v0.48.1) lists Intel XPU among the
officially supported platforms; 0.50.2 ships libbitsandbytes_xpu*.so."""


def _simulate(software: Software) -> Software:
    # torch's xpu wheels report their oneAPI release as torch.version.xpu ("20250101" style): a simulated build.
    return replace(software, torch_xpu="20250101")


INTEL = Platform(
    vendor="intel",
    label="Intel",
    runtime="XPU",
    torch_build=lambda software: software.torch_xpu,
    simulate_build=_simulate,
    bf16=lambda gpu: gpu.arch in XMX_ARCHS,
    bf16_since="xe-hpg",
    bf16_missing=lambda gpu: (
        f"bfloat16 on XMX engines is documented here for Arc and Max GPUs only, and {gpu.name} is {gpu.arch}"
    ),
    fp16_tensor_cores=lambda gpu: gpu.arch in XMX_ARCHS,
    matrix_since="xe-hpg",
    tf32=_tf32,
    paged_optimizers=None,  # bitsandbytes 0.50.2 XpuBNBNativeLibrary: cget_managed_ptr (SYCL USM)
    quant_backend=_quant_backend,
    quant_installed=bitsandbytes_since(BITSANDBYTES_SINCE, "XPU"),
    flash_order=lambda gpu: ("flash_attention_2", "flash_attention_3", "flash_attention_4"),
    flash_generation=_flash_generation,
    flash_arch_rules=False,
    device_type="xpu",
    sources=(
        "torch 2.13 xpu/__init__.py: get_device_properties",
        _DEVICES,
        "bitsandbytes 0.50.2 cextension.py: XpuBNBNativeLibrary",
    ),
)
"""The Intel record (XPU)."""
