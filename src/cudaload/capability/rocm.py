"""AMD GPU probing for a ROCm (HIP) torch: amdsmi first (AMD's management library: no HIP context, as NVML
for NVIDIA), torch's own device properties as a fallback. The probes return raw records, as gpus.py's do;
`detect()` asks them when the NVIDIA probes found no GPU.

vLLM reads AMD GPUs the same two ways (vllm/platforms/rocm.py: `RocmPlatform`, amdsmi's
`amdsmi_get_gpu_asic_info`, and torch's `gcnArchName`). Neither probe launches a kernel.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..facts.hardware import Gpu, gfx_capability
from .gpus import ProbeFailed, TorchRuntimeProbe
from .software import torch_hip_version

if TYPE_CHECKING:  # imported where a probe found a GPU (gpus.py says why)
    from .visible import RawDevice

__all__ = ["AMD_DRIVER_NODE", "AmdSmiProbe", "RocmTorchProbe", "gfx_capability", "gfx_target", "hip_visible_gpus"]

AMD_DRIVER_NODE = "/dev/kfd"
"""The ROCm kernel driver's device (amdgpu's KFD): every process that uses an AMD GPU through ROCm opens it."""

_GFX = r"(?i)gfx[0-9a-f]+"
"""An AMD architecture (compiled by `re` on first use: no AMD GPU, no compiling)."""


def gfx_target(name: str) -> str | None:
    """The gfx target of an architecture name: "gfx942:sramecc+:xnack-" (torch's gcnArchName) -> "gfx942";
    "GFX942" (amdsmi) -> "gfx942"; None when there is none."""
    match = re.search(_GFX, name or "")
    return match.group(0).lower() if match else None


def _driver_absent(exists: Callable[[str], bool]) -> bool:
    return sys.platform.startswith("linux") and not exists(AMD_DRIVER_NODE)


def hip_visible_gpus(raw: Sequence[RawDevice], env: Mapping[str, str]) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """The AMD GPUs a HIP process sees, as torch 2.13 `torch.cuda._parse_visible_devices` reads ROCm's variables:
    ROCR_VISIBLE_DEVICES first (ROCr's own filter, the documented Linux way, what SLURM's AMD gres sets), then
    HIP_VISIBLE_DEVICES among the devices ROCR left (HIP numbers them 0, 1, ... again), else CUDA_VISIBLE_DEVICES,
    which the HIP runtime reads when HIP_VISIBLE_DEVICES is unset; in PCI order (amdsmi's and HIP's: no
    FASTEST_FIRST). Each warning names the variable its value came from.

    torch's own count differs in one case: with ROCR set and HIP unset it counts ROCR's devices and ignores
    CUDA_VISIBLE_DEVICES, while the HIP runtime that places tensors applies it; that is said as a warning."""
    from .visible import as_visible_gpus, select_visible

    devices: list[RawDevice] = sorted(raw, key=lambda d: (d.pci_bus_id or "", d.nvml_index))
    warnings: list[str] = []
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    hip_variable = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env else "CUDA_VISIBLE_DEVICES"
    hip = env.get(hip_variable)
    if rocr is not None:
        chosen, said = select_visible(devices, rocr, "ROCR_VISIBLE_DEVICES", "ROCm")
        devices, warnings = [device for device, _ in chosen], said
        if hip is not None and hip_variable == "HIP_VISIBLE_DEVICES" and len(hip.split(",")) > len(rocr.split(",")):
            warnings.append(
                f"HIP_VISIBLE_DEVICES={hip!r} lists more devices than ROCR_VISIBLE_DEVICES={rocr!r}: HIP numbers only "
                "the GPUs ROCR_VISIBLE_DEVICES leaves (0, 1, ...), and torch refuses this pair (RuntimeError "
                "'HIP_VISIBLE_DEVICES contains more devices than ROCR_VISIBLE_DEVICES'). Index HIP_VISIBLE_DEVICES "
                "into ROCR's list, or set only one of the two."
            )
        elif hip is not None and hip_variable == "CUDA_VISIBLE_DEVICES":
            warnings.append(
                f"ROCR_VISIBLE_DEVICES={rocr!r} and CUDA_VISIBLE_DEVICES={hip!r} are both set: the HIP runtime "
                "applies the second among the GPUs the first leaves, but torch counts ROCR's devices only "
                "(torch.cuda._parse_visible_devices), so the two may disagree. Use HIP_VISIBLE_DEVICES, or one "
                "variable."
            )
    chosen, said = select_visible(devices, hip, hip_variable, "ROCm")
    gpus, mig_warnings = as_visible_gpus(chosen)
    return gpus, (*warnings, *said, *mig_warnings)


class AmdSmiProbe:
    """Reads every AMD GPU through amdsmi (the `amdsmi` module ROCm installs). Creates no HIP context."""

    name = "amdsmi"
    select = staticmethod(hip_visible_gpus)
    """Applies ROCm's visibility variables to the list (probe_gpus asks a probe's `select` when it has one)."""

    def __init__(self, amdsmi: Any = None, exists: Callable[[str], bool] = os.path.exists) -> None:
        if _driver_absent(exists):
            raise ProbeFailed(f"no AMD ROCm driver ({AMD_DRIVER_NODE})", no_driver=True)
        if amdsmi is None:
            try:
                import amdsmi  # type: ignore[import-not-found, no-redef]
            except ImportError as exc:
                raise ProbeFailed(f"amdsmi is not importable: {exc}") from exc
        self._smi: Any = amdsmi
        try:
            amdsmi.amdsmi_init()
        except Exception as exc:  # amdsmi raises its own AmdSmiException (and others on a broken install)
            raise ProbeFailed(f"amdsmi could not start: {exc}") from exc
        self._started = True

    def __enter__(self) -> AmdSmiProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._started = False
            with contextlib.suppress(Exception):
                self._smi.amdsmi_shut_down()

    def driver_version(self) -> str | None:
        return None

    def _optional(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._smi, fn)(*args)
        except Exception:
            return None

    def devices(self) -> list[RawDevice]:
        from .visible import RawDevice

        smi = self._smi
        try:
            found = []
            for i, handle in enumerate(smi.amdsmi_get_processor_handles()):
                asic = smi.amdsmi_get_gpu_asic_info(handle)
                arch = gfx_target(str(asic.get("target_graphics_version", "")))
                if arch is None:
                    raise ProbeFailed(f"amdsmi gave GPU {i} no gfx target ({asic.get('target_graphics_version')!r})")
                vram = smi.amdsmi_get_gpu_vram_usage(handle)  # MB
                total = int(vram["vram_total"]) * 1024**2
                uuid = self._optional("amdsmi_get_gpu_device_uuid", handle)
                name = str(asic.get("market_name") or "").strip()
                found.append(
                    RawDevice(
                        nvml_index=i,
                        name=name if name and name != "N/A" else f"AMD {arch}",
                        uuid=f"GPU-{uuid}" if uuid else f"amdsmi-{i}",
                        capability=gfx_capability(arch),
                        total_memory=total,
                        free_memory=total - int(vram["vram_used"]) * 1024**2,
                        multiprocessors=asic.get("num_compute_units"),
                        pci_bus_id=self._optional("amdsmi_get_gpu_device_bdf", handle),
                        vendor="amd",
                        arch=arch,
                    )
                )
            return found
        except ProbeFailed:
            raise
        except Exception as exc:
            raise ProbeFailed(f"amdsmi failed while listing GPUs: {type(exc).__name__}: {exc}") from exc


class RocmTorchProbe(TorchRuntimeProbe):
    """Fallback when amdsmi cannot answer: a ROCm torch's own device properties (name, gcnArchName,
    total_memory). On ROCm `torch.cuda.get_device_properties` starts HIP in this process (a context, as CUDA's
    torch fallback does), so it is asked only after amdsmi; it launches no kernel. HIP applies
    ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES itself."""

    name = "rocm-torch"
    visible_only = True
    """torch has already applied the visibility variables: the list is not filtered again."""

    def __init__(self, torch: Any = None, exists: Callable[[str], bool] = os.path.exists) -> None:
        if _driver_absent(exists):
            raise ProbeFailed(f"no AMD ROCm driver ({AMD_DRIVER_NODE})", no_driver=True)
        if torch is None:
            if torch_hip_version() is None:  # read from torch/version.py: a CUDA or CPU torch is not imported
                raise ProbeFailed("torch is not a ROCm build (torch.version.hip is None)")
            try:
                import torch
            except ImportError as exc:
                raise ProbeFailed("torch is not importable") from exc
        if not getattr(torch.version, "hip", None):
            raise ProbeFailed("torch is not a ROCm build (torch.version.hip is None)")
        if not torch.cuda.is_available():
            raise ProbeFailed("torch (ROCm) sees no GPU")
        self._torch: Any = torch

    def devices(self) -> list[RawDevice]:
        from .visible import RawDevice

        cuda = self._torch.cuda
        found = []
        for i in range(cuda.device_count()):
            props = cuda.get_device_properties(i)
            arch = gfx_target(str(getattr(props, "gcnArchName", "")))
            if arch is None:
                raise ProbeFailed(f"torch gave cuda:{i} ({props.name}) no gcnArchName")
            found.append(
                RawDevice(
                    nvml_index=i,
                    name=props.name,
                    uuid=f"GPU-{props.uuid}" if getattr(props, "uuid", None) else f"torch-{i}",
                    capability=(props.major, props.minor),
                    total_memory=int(props.total_memory),
                    free_memory=None,  # torch.cuda.mem_get_info would be one more runtime call: unknown here
                    multiprocessors=props.multi_processor_count,
                    vendor="amd",
                    arch=arch,
                )
            )
        return found
