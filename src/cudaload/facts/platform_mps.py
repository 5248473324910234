"""Apple's record: what torch, transformers and bitsandbytes document for the Metal (MPS) backend on an M-series Mac.

One device, "mps" (no index), sharing the Mac's unified memory with the CPU. Architecture is the chip generation
("m1" ... "m4"). Sources, each by symbol:

- torch 2.13 backends/mps/__init__.py: `is_available`, `get_name`, `get_core_count` (the Metal device queried,
  nothing allocated); `is_macos_or_newer` (bf16 on MPS needs macOS 14: torch refuses it below, "MPS BFloat16 is
  only supported on MacOS 14 or newer"); mps/__init__.py: `recommended_max_memory` (Metal's
  recommendedMaxWorkingSetSize, the share of unified memory the GPU may hold). The first tensor placed on "mps"
  starts the MPS allocator and command queue.
- transformers 5.22-5.25 pipelines/base.py: `Pipeline.__init__` (an integer device becomes "mps:N" when neither CUDA
  nor XPU is available and MPS is: what pipeline() runs on there); utils/import_utils.py:
  `is_torch_tf32_available` (False: no CUDA);
  modeling_flash_attention_utils.py: FLASH_ATTN_KERNEL_DEVICES (kernels-community/metal-flash-sdpa for "mps", which
  FLASH_ATTN_KERNEL_FALLBACK never picks for flash_attention_2/3/4: SDPA is planned).
- bitsandbytes 0.50.2 backends/mps (its README's support table: LLM.int8 and QLoRA 4-bit on Metal, 8-bit
  optimizers in progress): no paged optimizers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .platform import Platform, PlatformGpu, Tf32, bitsandbytes_since

if TYPE_CHECKING:
    from .software import Software

__all__ = ["APPLE", "BITSANDBYTES_SINCE", "MACOS_BF16"]

MACOS_BF16 = (14, 0)
"""The macOS release from which torch runs bf16 on MPS (torch.backends.mps.is_macos_or_newer(14, 0))."""

_DEVICES = "transformers 5.22-5.25 modeling_flash_attention_utils.py: FLASH_ATTN_KERNEL_DEVICES"


def _flash_generation(gpu: PlatformGpu, name: str, installed: str | None) -> str | None:
    return (
        f'{name} has no Metal build transformers falls back to: its Hub kernel for "mps" is '
        f"kernels-community/metal-flash-sdpa, which FLASH_ATTN_KERNEL_FALLBACK never picks ({_DEVICES}); "
        f"SDPA runs on {gpu.name}"
    )


def _tf32(gpu: PlatformGpu, current: PlatformGpu | None) -> Tf32:
    return None, "", ""  # no TF32 on Metal: the plan sets nothing, transformers' default is off


def _quant_backend(package: str) -> str | None:
    if package == "bitsandbytes":
        return None  # bitsandbytes 0.50.2 backends/mps; README: LLM.int8 and QLoRA 4-bit on Metal
    return f"{package} has no Metal backend documented here: not planned on an Apple GPU"


BITSANDBYTES_SINCE = "0.50.2"
"""The first bitsandbytes release planned on Metal: 0.50.2 has a Metal backend (backends/mps) and its README lists
Metal; older releases are not checked here."""


def _simulate(software: Software) -> Software:
    return replace(software, torch_mps=True)


APPLE = Platform(
    vendor="apple",
    label="Apple",
    runtime="MPS",
    torch_build=lambda software: "mps" if software.torch_mps else None,
    simulate_build=_simulate,
    # macOS is not a fact cudaload reads yet: bf16 is planned on every M-series GPU, which macOS 14+ runs (a Mac
    # on macOS 13 refuses it at the first bf16 op; pass dtype="float16" there).
    bf16=lambda gpu: gpu.arch.startswith("m"),
    bf16_since="m1",
    bf16_missing=lambda gpu: f"{gpu.name} ({gpu.arch}) is not an M-series GPU",
    fp16_tensor_cores=lambda gpu: True,
    matrix_since="m1",
    tf32=_tf32,
    paged_optimizers=(
        "bitsandbytes' 8-bit optimizers are in progress on Metal (0.50.2 README support table) and unified memory "
        "has nothing to page to: fused AdamW"
    ),
    quant_backend=_quant_backend,
    quant_installed=bitsandbytes_since(BITSANDBYTES_SINCE, "Metal"),
    flash_order=lambda gpu: ("flash_attention_2", "flash_attention_3", "flash_attention_4"),
    flash_generation=_flash_generation,
    flash_arch_rules=False,
    device_type="mps",
    sources=(
        "torch 2.13 backends/mps/__init__.py: is_macos_or_newer",
        _DEVICES,
        "bitsandbytes 0.50.2 README support table (Metal)",
    ),
)
"""The Apple record (MPS)."""
