"""The installed software a plan depends on, as frozen data: package versions and the GPU build of torch.

Apart from `Machine` (machine.py, which re-exports it as before) because a GPU vendor's record (platform.py)
reads it, and machine.py imports the records through `Gpu`: here it sits below both, importing nothing of
cudaload but upstream's version comparison. Probes nothing (capability/software.py reads the installed
packages into one).
"""

from __future__ import annotations

from ..frozen import frozen
from ..upstream import version_at_least

__all__ = ["Software"]


@frozen
class Software:
    """Installed distribution versions (name -> version), plus what transformers accepts.

    Attributes:
        packages: (distribution, version) pairs of the installed packages cudaload cares about
            (torch, transformers, accelerate, peft, bitsandbytes, kernels, ...), sorted by name.
        torch_cuda: CUDA version torch was built with (None for a CPU build).
        torch_hip: ROCm (HIP) version torch was built with (`torch.version.hip`; None unless a ROCm build).
        torch_xpu: The oneAPI release an XPU torch was built with (`torch.version.xpu`; None unless an XPU build).
        torch_mps: torch runs on Metal (MPS): the macOS arm64 wheels are built with it.
        driver: The NVIDIA driver version NVML reports; None without NVML (or simulated).
        kernels_range: [min, max) of `kernels` that the installed transformers accepts; None if unknown.
        torch_arch_list: The GPU architectures the installed CUDA torch was built for
            (`torch.cuda.get_arch_list()`, e.g. ("sm_75", "sm_80", ..., "compute_120")); None when not read
            (no GPU, a CPU build, or a simulated machine).
        assumed: For a simulated machine, where its packages come from ("as installed here" or
            cudaload's defaults, and what `packages=` / `--with` changed); None when detected.
        bitsandbytes_builds: The native builds the installed bitsandbytes ships, from its file names
            ("cuda128", "rocm64", "xpu2025", "cpu"); None when not read (not installed, or simulated).
        torchao_extensions: The `_C*.so` extensions the installed torchao ships; None when not read.

    Examples:
        >>> import cudaload
        >>> software = cudaload.Machine.simulated(packages={"peft": "0.17.0"}, installed_packages=False).software
        >>> software.version("peft"), software.has("bitsandbytes")
        ('0.17.0', False)
        >>> software.assumed
        'the defaults (torch 2.13.0, transformers 5.22.2, accelerate 1.16.0), with peft 0.17.0'
    """

    packages: tuple[tuple[str, str], ...] = ()
    torch_cuda: str | None = None
    """CUDA version torch was built with (None for a CPU build)."""
    torch_hip: str | None = None
    """ROCm (HIP) version torch was built with (None unless a ROCm build)."""
    torch_xpu: str | None = None
    """The oneAPI release an XPU torch was built with (None unless an XPU build)."""
    torch_mps: bool = False
    """torch runs on Metal (MPS)."""
    driver: str | None = None
    kernels_range: tuple[str, str] | None = None
    """[min, max) of `kernels` that the installed transformers accepts; None if unknown."""
    torch_arch_list: tuple[str, ...] | None = None
    """The architectures the installed CUDA torch was built for; None when not read."""
    assumed: str | None = None
    """For a simulated machine, where its packages come from; None when detected."""
    bitsandbytes_builds: tuple[str, ...] | None = None
    """The native builds the installed bitsandbytes ships ("rocm64", ...); None when not read."""
    torchao_extensions: tuple[str, ...] | None = None
    """The `_C*.so` extensions the installed torchao ships; None when not read."""

    def version(self, dist: str) -> str | None:
        for name, version in self.packages:
            if name == dist:
                return version
        return None

    def has(self, dist: str) -> bool:
        return self.version(dist) is not None

    def assumed_packages(self) -> str | None:
        """A simulated machine's packages, as a plan shows them: where they come from, then each version;
        None when detected."""
        if self.assumed is None:
            return None
        return f"{self.assumed}: " + ", ".join(f"{name} {version}" for name, version in self.packages)

    def at_least(self, dist: str, minimum: str) -> bool:
        """`dist` is installed at `minimum` or newer (PEP 440); False when it is missing or its version
        does not parse. A bare "X.Y.dev0" minimum admits every X.Y release, pre-releases included."""
        version = self.version(dist)
        return version is not None and version_at_least(version, minimum)
