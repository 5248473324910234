"""The devices of a machine as frozen data: each CUDA `Gpu` this process sees, and the `Cpu`. Probes nothing."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Cpu", "GiB", "Gpu"]

GiB = 1024**3


@dataclass(frozen=True)
class Gpu:
    """One CUDA device as this process sees it (after CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER).

    Found by `detect()` (NVML, else torch) or made by `Machine.simulated()` from the GPU catalog.

    Attributes:
        index: The ordinal torch uses: `cuda:{index}`.
        name: The device name as NVML/torch report it (e.g. "NVIDIA A100-SXM4-80GB", "Tesla T4").
        capability: CUDA compute capability (major, minor), e.g. (8, 0); `sm` is "sm_80".
        total_memory: Total device memory in bytes.
        free_memory: Bytes free when detected; None when unknown (simulated, or the torch fallback).
        physical_index: NVML's index (PCI bus order), which `nvidia-smi` shows; None when unknown.
        multiprocessors: Streaming multiprocessor count; None when unknown.
        uuid: The device UUID; None when unknown (and for simulated GPUs).
        pci_bus_id: The PCI bus id; None when unknown (and for simulated GPUs).
        mig: True when this device is a MIG slice (or a MIG-enabled parent).

    Examples:
        >>> import cudaload
        >>> gpu = cudaload.Machine.simulated("A100").gpus[0]
        >>> gpu.name, gpu.capability, gpu.sm, gpu.bf16
        ('NVIDIA A100-SXM4-80GB', (8, 0), 'sm_80', True)
        >>> cudaload.Machine.simulated("T4").gpus[0].bf16  # sm_75: no native bf16
        False
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

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def bf16(self) -> bool:
        # Native bf16 arrived with Ampere (sm80). torch.cuda.is_bf16_supported() says True
        # on a T4 because it emulates it, so it must not be used to decide.
        return self.capability >= (8, 0)

    @property
    def usable_memory(self) -> int:
        return self.free_memory if self.free_memory is not None else self.total_memory


@dataclass(frozen=True)
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
