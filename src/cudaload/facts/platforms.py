"""The vendor records by `Gpu.vendor`: NVIDIA (CUDA), AMD (ROCm), Intel (XPU) and Apple (MPS). A new vendor is one
entry here, its record, its probe (capability/) and its catalog entries (catalog.py); the policy asks
`Gpu.platform` and nothing else."""

from __future__ import annotations

from ..errors import UnknownGpuError
from .platform import Platform
from .platform_cuda import NVIDIA
from .platform_mps import APPLE
from .platform_rocm import AMD
from .platform_xpu import INTEL

__all__ = ["PLATFORMS", "platform_of"]

PLATFORMS: dict[str, Platform] = {p.vendor: p for p in (NVIDIA, AMD, INTEL, APPLE)}
"""Every vendor's record, by `Gpu.vendor`."""


def platform_of(vendor: str) -> Platform:
    """The record of `vendor`.

    Raises:
        UnknownGpuError: no record is registered for it.
    """
    try:
        return PLATFORMS[vendor]
    except KeyError:
        raise UnknownGpuError(
            f"No platform record for GPU vendor {vendor!r}: cudaload knows {', '.join(sorted(PLATFORMS))}. "
            "Register one in cudaload.facts.platforms.PLATFORMS (docs/platforms.md)."
        ) from None
