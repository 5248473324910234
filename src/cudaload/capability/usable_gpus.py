"""Which GPUs torch in this process can drive: a fact about the machine, read once by `detect()` and carried
on `Machine.gpus_unusable` (with its reason), so that the planner, the policy and the CLI read it instead of
working it out again. A GPU that NVML sees but this torch cannot drive (a CPU-only torch build, or a CUDA
build newer than the driver supports) is planned around, loudly (policy/devices.py `usable_machine`)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from ..facts.machine import Gpu, Software

__all__ = ["MIN_DRIVER", "gpus_unusable"]

# The oldest Linux driver each CUDA major runs on with minor-version compatibility (NVIDIA's
# "CUDA Compatibility" guide, table "CUDA Toolkit and Minimum Required Driver Version").
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def gpus_unusable(gpus: tuple[Gpu, ...], software: Software) -> str | None:
    """Why this torch cannot use the GPUs NVML sees (None when it can, or there are none)."""
    if not gpus:
        return None
    names = ", ".join(sorted({g.name for g in gpus}))
    torch = software.version("torch") or "?"
    if software.torch_cuda is None:
        return f"{len(gpus)} NVIDIA GPU(s) ({names}) are present, but torch {torch} is a CPU-only build"
    if software.driver is None:
        return None
    try:
        major = Version(software.torch_cuda).release[0]
        needed = MIN_DRIVER.get(major)
        too_old = needed is not None and Version(software.driver) < Version(needed)
    except InvalidVersion:
        return None
    if too_old:
        return (
            f"torch {torch} is built for CUDA {software.torch_cuda}, which needs NVIDIA driver >= {needed}, and "
            f"this machine has {software.driver}"
        )
    return None
