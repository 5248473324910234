"""Intel XPU and Apple MPS GPUs, through torch (neither vendor ships a management library torch uses, as NVML or
amdsmi are): the probes return raw records, as gpus.py's and rocm.py's do; `detect()` asks them after NVIDIA's and
AMD's found no GPU.

What starts the device, by torch 2.13's own code: for XPU, `torch.xpu.device_count()` counts through Level Zero
Sysman and starts nothing (xpu/__init__.py: `device_count`, "will NOT poison fork"), while
`torch.xpu.get_device_properties(i)` calls `_lazy_init()`, which starts the XPU runtime in this process: the XPU
probe reads the properties only after the count found a GPU. For MPS, `torch.backends.mps.is_available()`,
`get_name()` and `get_core_count()` ask the Metal device (no allocation, no command queue) and
`torch.mps.recommended_max_memory()` reads its recommendedMaxWorkingSetSize; the first tensor on "mps" starts the
MPS allocator. A torch built for neither is told from `torch.version.xpu` (module_constants.py: the loaded
module's, else torch/version.py's) or the platform (macOS arm64 wheels are built with MPS) without importing torch.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from typing import TYPE_CHECKING, Any

from .gpus import ProbeFailed, TorchRuntimeProbe
from .module_constants import torch_builds

if TYPE_CHECKING:  # imported where a probe found a GPU (gpus.py says why)
    from .visible import RawDevice

__all__ = ["MpsProbe", "XpuTorchProbe", "apple_chip", "intel_arch", "torch_mps_built", "torch_xpu_version"]


def torch_xpu_version() -> str | None:
    """`torch.version.xpu` (an XPU build's oneAPI release), without importing torch (module_constants.py)."""
    return torch_builds().xpu


def torch_mps_built() -> bool:
    """torch runs on Metal here: macOS on Apple silicon, whose torch wheels are built with MPS."""
    return sys.platform == "darwin" and platform.machine() == "arm64" and importlib.util.find_spec("torch") is not None


def intel_arch(name: str, matrix_engines: bool) -> str:
    """The architecture the Intel record reads: "xe-hpc" (Data Center GPU Max), "xe-hpg" (Arc A-series), "xe2"
    (Arc B-series and the other XMX parts), "xe-lp" without XMX engines (DPAS:
    `has_subgroup_matrix_multiply_accumulate`)."""
    if not matrix_engines:
        return "xe-lp"
    if "Max" in name:
        return "xe-hpc"
    return "xe-hpg" if re.search(r"Arc\S*\s+A\d", name) else "xe2"


def apple_chip(name: str) -> str:
    """The chip generation of a Metal device name: "Apple M3 Max" -> "m3"; "apple" when it names none."""
    match = re.search(r"\bM(\d+)\b", name)
    return f"m{match.group(1)}" if match else "apple"


class XpuTorchProbe(TorchRuntimeProbe):
    """Intel GPUs through an XPU torch: counted without starting the runtime, then read (which starts it)."""

    name = "xpu-torch"
    visible_only = True  # torch applied ZE_AFFINITY_MASK already

    def __init__(self, torch: Any = None) -> None:
        if torch is None:
            if torch_xpu_version() is None:
                raise ProbeFailed("torch is not an XPU build (torch.version.xpu is None)", no_driver=True)
            import torch
        if not getattr(torch.version, "xpu", None):
            raise ProbeFailed("torch is not an XPU build (torch.version.xpu is None)", no_driver=True)
        if torch.xpu.device_count() < 1:
            raise ProbeFailed("torch (XPU) sees no GPU")
        self._torch: Any = torch

    def devices(self) -> list[RawDevice]:
        from .visible import RawDevice

        xpu = self._torch.xpu
        found = []
        for i in range(xpu.device_count()):
            props = xpu.get_device_properties(i)  # starts the XPU runtime (_lazy_init)
            matrix = bool(getattr(props, "has_subgroup_matrix_multiply_accumulate", False))
            found.append(
                RawDevice(
                    nvml_index=i,
                    name=props.name,
                    uuid=f"xpu-{i}",
                    capability=(0, 0),  # no compute capability: the record reads `arch`
                    total_memory=int(props.total_memory),
                    multiprocessors=getattr(props, "max_compute_units", None),
                    vendor="intel",
                    arch=intel_arch(props.name, matrix),
                )
            )
        return found


class MpsProbe(TorchRuntimeProbe):
    """The Apple GPU through torch's Metal backend: one device, "mps", sharing the Mac's memory."""

    name = "mps-torch"
    visible_only = True

    def __init__(self, torch: Any = None) -> None:
        if torch is None:
            if not torch_mps_built():
                raise ProbeFailed("not a Mac with Apple silicon (no MPS)", no_driver=True)
            import torch
        if not torch.backends.mps.is_available():
            raise ProbeFailed("torch.backends.mps.is_available() is False")
        self._torch: Any = torch

    def devices(self) -> list[RawDevice]:
        from .visible import RawDevice

        mps = self._torch.backends.mps
        name = str(mps.get_name())
        return [
            RawDevice(
                nvml_index=0,
                name=name,
                uuid="mps",
                capability=(0, 0),
                # The share of unified memory Metal lets the GPU hold (recommendedMaxWorkingSetSize), not all of it.
                total_memory=int(self._torch.mps.recommended_max_memory()),
                multiprocessors=int(mps.get_core_count()),
                vendor="apple",
                arch=apple_chip(name),
            )
        ]
