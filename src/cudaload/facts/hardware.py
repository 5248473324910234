"""The devices of a machine as frozen data: each `Gpu` this process sees (NVIDIA or AMD), and the `Cpu`.
Probes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..frozen import frozen

if TYPE_CHECKING:
    from .platform import Platform

__all__ = ["Cpu", "GiB", "Gpu", "gfx_capability"]

GiB = 1024**3


@frozen
class Gpu:
    """One GPU as this process sees it (after CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER), as torch's `cuda:N`.

    Found by `detect()` (NVML, else torch; amdsmi or a ROCm torch for AMD GPUs) or made by `Machine.simulated()`
    from the GPU catalog. Its vendor's record (`platform`, facts/platforms.py) holds the rules that depend on
    the vendor and the architecture; the policy asks it, never the capability numbers.

    Attributes:
        index: The ordinal torch uses: `cuda:{index}`.
        name: The device name as NVML/torch report it (e.g. "NVIDIA A100-SXM4-80GB", "Tesla T4").
        capability: CUDA compute capability (major, minor), e.g. (8, 0); `sm` is "sm_80". On an AMD GPU, what
            torch reports for it on ROCm (`torch.cuda.get_device_capability()`: (9, 4) for gfx942); no rule reads it.
        total_memory: Total device memory in bytes.
        free_memory: Bytes free when detected; None when unknown (simulated, or the torch fallback).
        physical_index: NVML's index (PCI bus order), which `nvidia-smi` shows; None when unknown.
        multiprocessors: Streaming multiprocessor count; None when unknown.
        uuid: The device UUID; None when unknown (and for simulated GPUs).
        pci_bus_id: The PCI bus id; None when unknown (and for simulated GPUs).
        mig: True when this device is a MIG slice (or a MIG-enabled parent).
        vendor: The vendor whose record (`platform`) holds its rules: "nvidia" (the default) or "amd".
        arch_name: The architecture as the vendor names it when it is not a compute capability (AMD's gfx target,
            "gfx942"); None for NVIDIA, whose `arch` is "sm_XY".

    Examples:
        >>> import cudaload
        >>> gpu = cudaload.Machine.simulated("A100").gpus[0]
        >>> gpu.name, gpu.capability, gpu.sm, gpu.bf16
        ('NVIDIA A100-SXM4-80GB', (8, 0), 'sm_80', True)
        >>> cudaload.Machine.simulated("T4").gpus[0].bf16  # sm_75: no native bf16
        False
        >>> mi300x = cudaload.Machine.simulated("MI300X").gpus[0]
        >>> mi300x.vendor, mi300x.arch, mi300x.bf16, mi300x.platform.runtime
        ('amd', 'gfx942', True, 'ROCm')
    """

    index: int
    """The ordinal torch uses: `cuda:{index}`."""
    name: str
    capability: tuple[int, int]
    total_memory: int
    """Bytes."""
    free_memory: int | None = None
    """Bytes free when detected; None when unknown (simulated, or torch fallback)."""
    physical_index: int | None = None
    """NVML's index (PCI bus order), which `nvidia-smi` shows."""
    multiprocessors: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    mig: bool = False
    """True when this device is a MIG slice (or a MIG-enabled parent)."""
    vendor: str = "nvidia"
    """The vendor whose record holds its rules ("nvidia", "amd")."""
    arch_name: str | None = None
    """The architecture as the vendor names it ("gfx942"); None for NVIDIA ("sm_XY" from the capability)."""

    @property
    def arch(self) -> str:
        """The architecture: "sm_90" for NVIDIA, the gfx target ("gfx942") for AMD."""
        return self.arch_name or f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def sm(self) -> str:
        """The architecture as messages show it: "sm_80" on NVIDIA (the name predates AMD), `arch` on any vendor."""
        return self.arch

    @property
    def device(self) -> str:
        """The device a device_map names for it: "cuda:0" (NVIDIA, and AMD under ROCm), "xpu:0", "mps" (one device,
        no index)."""
        kind = self.platform.device_type
        return kind if kind == "mps" else f"{kind}:{self.index}"

    @property
    def platform(self) -> Platform:
        """The vendor's record (facts/platforms.py): the rules the policy asks."""
        from .platforms import platform_of

        return platform_of(self.vendor)

    @property
    def bf16(self) -> bool:
        """Native bf16, as the vendor's record says (NVIDIA: sm80+; torch.cuda.is_bf16_supported() says True on
        a T4, which emulates it, so it is never asked)."""
        return self.platform.bf16(self)

    @property
    def usable_memory(self) -> int:
        return self.free_memory if self.free_memory is not None else self.total_memory


@frozen
class Cpu:
    """The CPU this process runs on, as `detect()` reads it from /proc (or the platform module).

    Attributes:
        model: The CPU model name (e.g. "AMD EPYC 7B13"; "simulated CPU" on a simulated machine).
        cores: CPUs this process may run on (affinity), not the machine's total.
        arch: The machine architecture (`platform.machine()`, e.g. "x86_64", "aarch64").
        flags: ISA feature flags as /proc/cpuinfo names them (e.g. "avx2", "avx512_bf16",
            "amx_bf16"); empty when unknown.
        memory_total: RAM in bytes; None when unknown.
        memory_available: RAM available when detected, in bytes; None when unknown.
        physical_cores: Physical cores among `cores` (a core's hyperthreads counted once), which is torch's
            default CPU thread count; None when the topology is unknown.

    Examples:
        >>> import cudaload
        >>> cpu = cudaload.Machine.simulated(cpu_flags=["avx2", "amx_bf16"], cpu_memory_gib=32).cpu
        >>> cpu.model, cpu.bf16_instructions, cpu.fast_bf16, cpu.memory_total // 2**30
        ('simulated CPU', True, True, 32)
    """

    model: str
    cores: int
    """CPUs this process may run on (affinity), not the machine's total."""
    arch: str
    flags: frozenset[str] = frozenset()
    memory_total: int | None = None
    memory_available: int | None = None
    physical_cores: int | None = None

    @property
    def bf16_instructions(self) -> bool:
        """The CPU has bf16 instructions at all (AVX512-BF16 or AMX)."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    @property
    def fast_bf16(self) -> bool:
        """The static table's guess that bf16 beats fp32 here (AMX tiles), used only when the
        dtype is not measured: flags do not decide it (benchmarks/README.md: AMX Xeon bf16 4.3x
        faster, an AVX512-BF16 Xeon 1.4x slower, a Zen 4 EPYC with the same flag 2.35x faster,
        an AVX2 EPYC 4.1x slower).
        """
        return "amx_bf16" in self.flags


def gfx_capability(arch: str) -> tuple[int, int]:
    """What HIP reports as (major, minor) for a gfx target (`hipDeviceProp_t.major/minor`, and so
    `torch.cuda.get_device_capability()` on ROCm): "gfx942" -> (9, 4), "gfx90a" -> (9, 0), "gfx1100" -> (11, 0).
    The last hex digit is the stepping; no rule of cudaload reads these numbers for an AMD GPU. Here, not in the
    GPU catalog (which re-exports it): detecting an AMD GPU needs it, and never the catalog."""
    digits = arch.lower().removeprefix("gfx")
    return int(digits[:-2]), int(digits[-2], 16)
