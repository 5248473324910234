"""Which GPUs torch in this process can drive: a fact about the machine, read once by `detect()` and carried
on `Machine.gpus_unusable` (with its reason), so that the planner, the policy and the CLI read it instead of
working it out again. A GPU that NVML (or amdsmi) sees but this torch cannot drive (a CPU-only torch build,
another vendor's build, or a CUDA build newer than the driver supports) is planned around, loudly
(policy/devices.py `usable_machine`)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from ..facts.machine import Gpu, Software

__all__ = ["gpus_unusable", "runs_on", "torch_arch_list"]


def gpus_unusable(gpus: tuple[Gpu, ...], software: Software) -> str | None:
    """Why this torch cannot use the GPUs the probes see (None when it can, or there are none): the GPUs'
    vendor record says which torch build drives them (CUDA for NVIDIA, ROCm for AMD) and, for CUDA, the oldest
    driver each major runs on (`Platform.min_driver`)."""
    if not gpus:
        return None
    names = ", ".join(sorted({g.name for g in gpus}))
    torch = software.version("torch") or "?"
    platform = gpus[0].platform
    build = platform.torch_build(software)
    if build is None:
        other = (
            f"built for CUDA {software.torch_cuda}, not {platform.runtime}"
            if software.torch_cuda
            else f"built for ROCm {software.torch_hip}, not {platform.runtime}"
            if software.torch_hip
            else "a CPU-only build"
        )
        return f"{len(gpus)} {platform.label} GPU(s) ({names}) are present, but torch {torch} is {other}"
    if software.driver is None or not platform.min_driver:
        return arch_unusable(gpus, software)
    try:
        major = Version(build).release[0]
        needed = platform.min_driver.get(major)
        too_old = needed is not None and Version(software.driver) < Version(needed)
    except InvalidVersion:
        return arch_unusable(gpus, software)
    if too_old:
        return (
            f"torch {torch} is built for {platform.runtime} {build}, which needs {platform.label} driver >= {needed}, "
            f"and this machine has {software.driver}"
        )
    return arch_unusable(gpus, software)


def arch_unusable(gpus: tuple[Gpu, ...], software: Software) -> str | None:
    """Why this CUDA torch has no kernels for some of these GPUs (None when it has, or the list is unknown)."""
    archs = software.torch_arch_list
    if not gpus or not archs:
        return None
    missing = sorted({g.name + f" ({g.sm})" for g in gpus if not runs_on(archs, g.capability)})
    if not missing:
        return None
    return (
        f"torch {software.version('torch') or '?'} is built for {' '.join(archs)} only "
        f"(torch.cuda.get_arch_list()), which cannot run on {', '.join(missing)}: install a torch built for it"
    )


def runs_on(archs: tuple[str, ...], capability: tuple[int, int]) -> bool:
    """Whether code built for `archs` runs on a GPU of `capability`: a cubin `sm_XY` runs on the same major
    from minor Y up (CUDA's binary compatibility); PTX `compute_XY` is compiled at load for any GPU from X.Y up.
    (sm_90a / sm_100a style names run only on that exact architecture.)"""
    major, minor = capability
    for arch in archs:
        kind, _, number = arch.partition("_")
        exact = number.endswith("a")
        digits = number.rstrip("af")
        if not digits.isdigit() or len(digits) < 2:
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and (built == capability or (not exact and built[0] == major and built[1] <= minor)):
            return True
        if kind == "compute" and built <= (major, minor):
            return True
    return False


def torch_arch_list() -> tuple[str, ...] | None:
    """The installed torch's compiled architectures. Importing torch starts no CUDA context, and
    `torch.cuda.get_arch_list()` reads a compile-time string (`torch._C._cuda_getArchFlags`); called by
    detect() only when NVML found GPUs and torch is a CUDA build."""
    try:
        import torch

        return tuple(torch.cuda.get_arch_list()) or None
    except Exception:  # a broken torch install: the load will say more than we can here
        return None
