"""GPU probing: NVML first (no CUDA context), torch.cuda as a fallback.

The probe is the single boundary tests replace: anything with `devices()` and
`driver_version()` that returns raw records. Ordering and CUDA_VISIBLE_DEVICES are
applied afterwards by the pure `visible.visible_gpus`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..facts.machine import Gpu
from ..frozen import frozen

if TYPE_CHECKING:  # visible.py's records and rules are imported where a probe found a GPU (~2 ms a load)
    from .visible import RawDevice, RawMigSlice

__all__ = [
    "GpuProbe",
    "GpuReport",
    "NvmlProbe",
    "ProbeFailed",
    "TorchProbe",
    "TorchRuntimeProbe",
    "late_visibility_warning",
    "probe_gpus",
]


class ProbeFailed(Exception):
    """A probe could not answer (library missing, no driver, driver error).

    `no_driver` means no NVIDIA driver is installed at all: no later probe can find a GPU,
    so probing stops there (and torch is not imported just to learn that).
    """

    def __init__(self, message: str, *, no_driver: bool = False) -> None:
        super().__init__(message)
        self.no_driver = no_driver


class GpuProbe(Protocol):
    """One way of reading the GPUs. Used as a context manager: what it started (NVML) is shut down
    on exit, whether or not reading succeeded."""

    name: str

    def __enter__(self) -> GpuProbe: ...

    def __exit__(self, *exc: object) -> None: ...

    def devices(self) -> list[RawDevice]: ...

    def driver_version(self) -> str | None: ...


@frozen
class GpuReport:
    """What GPU detection found, which probe answered, and what it noticed on the way."""

    gpus: tuple[Gpu, ...]
    source: str
    """"nvml", "torch" or "none"."""
    driver: str | None
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()
    """Why each probe that did not answer failed."""
    no_driver: bool = False
    """Probing stopped because the vendor's driver is not installed at all."""


# CUDA cores per SM by compute capability (CUDA C Programming Guide, "Arithmetic
# Instructions" throughput table): NVML reports cores, not SMs, for a whole GPU.
_CORES_PER_SM = {(7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64}
_CORES_PER_SM_DEFAULT = 128  # sm86, sm87, sm89, sm90, sm100, sm120


def multiprocessors_from_cores(cores: int | None, capability: tuple[int, int]) -> int | None:
    if not cores:
        return None
    return cores // _CORES_PER_SM.get(capability, _CORES_PER_SM_DEFAULT)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


DRIVER_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia/version", "/dev/dxg")
"""What a Linux machine with an NVIDIA driver has: the control device (also in containers run with
the NVIDIA container toolkit), the kernel module's /proc entry, or WSL2's GPU paravirtualisation
device (where libnvidia-ml comes from /usr/lib/wsl/lib)."""


def nvidia_driver_absent(platform: str = sys.platform, exists: Callable[[str], bool] = os.path.exists) -> bool:
    """On Linux, no NVIDIA driver node exists: NVML cannot start, so not even pynvml is imported
    (importing it costs 40-60 ms, most of `detect()` on a machine without a GPU)."""
    return platform.startswith("linux") and not any(exists(node) for node in DRIVER_NODES)


class NvmlProbe:
    """Reads every physical GPU through NVML (nvidia-ml-py). Creates no CUDA context."""

    name = "nvml"

    def __init__(self) -> None:
        if nvidia_driver_absent():
            raise ProbeFailed(f"no NVIDIA driver (none of {', '.join(DRIVER_NODES)})", no_driver=True)
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py is a dependency, but may be broken
            raise ProbeFailed(f"nvidia-ml-py is not importable: {exc}") from exc
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            no_driver = isinstance(exc, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded))
            raise ProbeFailed(f"NVML could not start: {exc}", no_driver=no_driver) from exc
        self._started = True

    def __enter__(self) -> NvmlProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        # NVML counts nvmlInit calls; each needs its nvmlShutdown, or the library (and its handle
        # on the driver) stays loaded for the life of the process (vLLM wraps it the same way).
        if self._started:
            self._started = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return None

    def _optional(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except (self._nvml.NVMLError, AttributeError):
            return None

    def _mig_slices(self, handle: Any) -> tuple[RawMigSlice, ...]:
        from .visible import RawMigSlice

        nvml = self._nvml
        mode = self._optional("nvmlDeviceGetMigMode", handle)
        if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        slices = []
        for i in range(self._optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = self._optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            if mig is None:
                continue
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            attrs = self._optional("nvmlDeviceGetAttributes", mig)
            slices.append(
                RawMigSlice(
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    name=_text(nvml.nvmlDeviceGetName(mig)),
                    total_memory=int(memory.total),
                    free_memory=int(memory.free),
                    multiprocessors=getattr(attrs, "multiprocessorCount", None),
                )
            )
        return tuple(slices)

    def devices(self) -> list[RawDevice]:
        from .visible import RawDevice

        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            found = []
            for i in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                pci = self._optional("nvmlDeviceGetPciInfo", handle)
                capability = tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle))
                cores = self._optional("nvmlDeviceGetNumGpuCores", handle)
                found.append(
                    RawDevice(
                        nvml_index=i,
                        name=_text(nvml.nvmlDeviceGetName(handle)),
                        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                        capability=capability,
                        total_memory=int(memory.total),
                        free_memory=int(memory.free),
                        multiprocessors=multiprocessors_from_cores(cores, capability),
                        pci_bus_id=_text(pci.busId) if pci is not None else None,
                        mig_slices=self._mig_slices(handle),
                    )
                )
            return found
        except nvml.NVMLError as exc:
            raise ProbeFailed(f"NVML failed while listing GPUs: {exc}") from exc


_P = TypeVar("_P", bound="TorchRuntimeProbe")


class TorchRuntimeProbe:
    """What the probes that ask torch's own runtime (CUDA, ROCm, XPU, MPS) share: nothing to open or close (a
    runtime, once started, lives as long as the process) and no driver version torch reports."""

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def driver_version(self) -> str | None:
        return None


class TorchProbe(TorchRuntimeProbe):
    """Fallback when NVML cannot answer. torch.cuda applies CUDA_VISIBLE_DEVICES itself and
    initialises CUDA in this process, so it is used only when NVML failed."""

    name = "torch"

    def __init__(self) -> None:
        try:
            import torch
        except ImportError as exc:
            raise ProbeFailed("torch is not importable") from exc
        if getattr(torch.version, "hip", None):
            # A ROCm torch answers torch.cuda for AMD GPUs: those are the ROCm probes' (rocm.py).
            raise ProbeFailed("torch is a ROCm build: its GPUs are AMD's")
        if not torch.cuda.is_available():
            raise ProbeFailed("torch sees no CUDA device")
        self._torch: Any = torch

    def devices(self) -> list[RawDevice]:
        from .visible import RawDevice

        cuda = self._torch.cuda
        found = []
        for i in range(cuda.device_count()):
            props = cuda.get_device_properties(i)
            free, total = cuda.mem_get_info(i)
            found.append(
                RawDevice(
                    nvml_index=i,
                    name=props.name,
                    uuid=f"GPU-{props.uuid}" if getattr(props, "uuid", None) else f"torch-{i}",
                    capability=(props.major, props.minor),
                    total_memory=int(total),
                    free_memory=int(free),
                    multiprocessors=props.multi_processor_count,
                )
            )
        return found


def _initialised_cuda_device_count() -> int | None:
    """How many devices CUDA saw when it started in this process; None if it has not started.
    Never imports torch (if torch is not imported, CUDA cannot have started through it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.device_count())


def late_visibility_warning(initialised_count: int | None, visible_count: int) -> str | None:
    """torch reads CUDA_VISIBLE_DEVICES once, when CUDA starts; later changes are ignored."""
    seen = initialised_count
    if seen is None or seen == visible_count:
        return None
    return (
        f"CUDA was initialised in this process with {seen} GPU(s) visible, but CUDA_VISIBLE_DEVICES now "
        f"selects {visible_count}: the change is ignored until a new process. Set CUDA_VISIBLE_DEVICES "
        "before anything touches CUDA (at the top of the script, or in the shell)."
    )


def cuda_visibility(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(the visible devices, the order) CUDA reads: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER."""
    return env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER")


def probe_gpus(env: Mapping[str, str], probes: Sequence[Callable[[], GpuProbe]] = (NvmlProbe, TorchProbe)) -> GpuReport:
    """Ask each probe in turn (NVML, then torch.cuda); no GPU when none answers.

    A probe's constructor or `devices()` raising ProbeFailed moves on to the next one.
    """
    notes: list[str] = []
    no_driver = False
    for factory in probes:
        try:
            with factory() as candidate:
                raw = candidate.devices()
                driver = candidate.driver_version()
        except ProbeFailed as exc:
            notes.append(f"{getattr(factory, 'name', factory)}: {exc}")
            if exc.no_driver:
                no_driver = True
                break
            continue
        except Exception as exc:  # a broken NVML binding or driver library: report it, try the next probe
            notes.append(f"{getattr(factory, 'name', factory)}: failed unexpectedly: {type(exc).__name__}: {exc}")
            continue
        from .visible import visible_gpus

        if candidate.name == "torch" or getattr(candidate, "visible_only", False):
            # torch.cuda already applied CUDA_VISIBLE_DEVICES and CUDA's order.
            gpus, warnings = visible_gpus(raw, None, "PCI_BUS_ID")
        else:
            # A probe of another vendor's runtime applies its own variables (rocm.py: ROCR_, HIP_VISIBLE_DEVICES).
            select = getattr(candidate, "select", None)
            gpus, warnings = select(raw, env) if select is not None else visible_gpus(raw, *cuda_visibility(env))
        late = late_visibility_warning(_initialised_cuda_device_count(), len(gpus))
        return GpuReport(gpus, candidate.name, driver, (*warnings, *([late] if late else [])), tuple(notes))
    return GpuReport((), "none", None, (), tuple(notes), no_driver)
