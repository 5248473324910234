"""Frozen facts about a machine: what detection found, or what a simulation says.

This module only defines data. It probes nothing, so the policy layer can import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ..upstream import version_at_least
from .catalog import CatalogGpu, lookup_gpu

__all__ = [
    "Cpu",
    "DtypeProbe",
    "Gpu",
    "Hub",
    "HubKernel",
    "Launch",
    "Machine",
    "ProbeRound",
    "Software",
    "Strategy",
    "TunedVariant",
    "TuningRecord",
]

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


@dataclass(frozen=True)
class Software:
    """Installed distribution versions (name -> version), plus what transformers accepts.

    Attributes:
        packages: (distribution, version) pairs of the installed packages cudaload cares about
            (torch, transformers, accelerate, peft, bitsandbytes, kernels, ...), sorted by name.
        torch_cuda: CUDA version torch was built with (None for a CPU build).
        driver: The NVIDIA driver version NVML reports; None without NVML (or simulated).
        kernels_range: [min, max) of `kernels` that the installed transformers accepts; None if unknown.
        assumed: For a simulated machine, where its packages come from ("as installed here" or
            cudaload's defaults, and what `packages=` / `--with` changed); None when detected.

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
    driver: str | None = None
    kernels_range: tuple[str, str] | None = None
    """[min, max) of `kernels` that the installed transformers accepts; None if unknown."""
    assumed: str | None = None
    """For a simulated machine, where its packages come from; None when detected."""

    def version(self, dist: str) -> str | None:
        for name, version in self.packages:
            if name == dist:
                return version
        return None

    def has(self, dist: str) -> bool:
        return self.version(dist) is not None

    def at_least(self, dist: str, minimum: str) -> bool:
        """`dist` is installed at `minimum` or newer (PEP 440); False when it is missing or its version
        does not parse. A bare "X.Y.dev0" minimum admits every X.Y release, pre-releases included."""
        version = self.version(dist)
        return version is not None and version_at_least(version, minimum)


@dataclass(frozen=True)
class HubKernel:
    """Local availability of one Hub attention kernel repository.

    Attributes:
        repo: The Hub repository, e.g. "kernels-community/flash-attn2".
        version: The kernel version transformers asks for with this torch; None when unknown.
        cached_variant: The build variant found in the local cache for this torch/CUDA, if any
            ("simulated" when `Machine.simulated(cached_kernels=...)` names it); None: not cached.
        detail: A human note on what was found (e.g. "not in the local cache").

    Examples:
        >>> import cudaload
        >>> machine = cudaload.Machine.simulated("H100", cached_kernels=["kernels-community/flash-attn2"])
        >>> machine.hub.kernel("kernels-community/flash-attn2").cached
        True
    """

    repo: str
    version: int | None
    cached_variant: str | None = None
    """The build variant found in the local cache for this torch/CUDA, if any."""
    detail: str = ""

    @property
    def cached(self) -> bool:
        return self.cached_variant is not None


@dataclass(frozen=True)
class Hub:
    """What the Hugging Face Hub side allows: offline mode and the attention kernels in the cache.

    Attributes:
        offline: True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: nothing can be fetched.
        kernels: One `HubKernel` per Hub attention kernel repository cudaload knows.

    Examples:
        >>> import cudaload
        >>> hub = cudaload.Machine.simulated(offline=True).hub
        >>> hub.offline, hub.kernel("kernels-community/flash-attn2").cached
        (True, False)
    """

    offline: bool = False
    kernels: tuple[HubKernel, ...] = ()

    def kernel(self, repo: str) -> HubKernel | None:
        for kernel in self.kernels:
            if kernel.repo == repo:
                return kernel
        return None


Strategy = Literal["ddp", "fsdp", "deepspeed"]
"""How a distributed launch shares the model: data parallel, FSDP, or DeepSpeed ZeRO."""


@dataclass(frozen=True)
class Launch:
    """How this process was launched (torchrun, accelerate, SLURM) and what it shards with.

    Read by `detect()` from the environment variables the launchers set.

    Attributes:
        launcher: "accelerate", "torchrun", "mpirun", "slurm", "env" (RANK and WORLD_SIZE set by
            hand), or None for a plain single process.
        rank: This process's global rank (0 for a single process).
        local_rank: Its rank on this node: the GPU it loads onto (`device_map={"": local_rank}`).
        world_size: Processes in the job (1 for a single process).
        local_world_size: Processes on this node.
        strategy: "ddp", "fsdp" or "deepspeed" when known; None for a single process.
        zero_stage: The DeepSpeed ZeRO stage, when launched with DeepSpeed; else None.
        problems: Launch variables that are present but invalid (negative, non-numeric, rank >=
            world size); planning raises PlacementError when there are any.
        notes: A launch that works but not as its command line asked (plan warnings).
        mixed_precision: The launcher's mixed precision ("no", "fp16", "bf16", "fp8";
            ACCELERATE_MIXED_PRECISION), which a fine-tuning plan's TrainingArguments flags follow;
            None when not set.

    Examples:
        >>> import cudaload
        >>> launch = cudaload.Launch(launcher="torchrun", rank=1, local_rank=1, world_size=2, strategy="fsdp")
        >>> launch.distributed, launch.shards_parameters
        (True, True)
        >>> cudaload.Machine.simulated("A100", count=2, launch=launch).launch.world_size
        2
    """

    launcher: str | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    strategy: Strategy | None = None
    """"ddp", "fsdp" or "deepspeed" when known; None for a single process."""
    zero_stage: int | None = None
    problems: tuple[str, ...] = ()
    """Launch variables that are present but invalid (negative, non-numeric, rank >= world size)."""
    notes: tuple[str, ...] = ()
    """A launch that works but not as its command line asked (plan warnings)."""
    mixed_precision: str | None = None
    """`accelerate launch --mixed_precision` ("no", "fp16", "bf16" or "fp8", from ACCELERATE_MIXED_PRECISION);
    None when not launched with one. TrainingArguments' bf16/fp16 flags override it, so the plan follows it."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def shards_parameters(self) -> bool:
        """FSDP and DeepSpeed ZeRO-3 place parameters themselves: no device_map."""
        return self.strategy == "fsdp" or (self.strategy == "deepspeed" and self.zero_stage == 3)


@dataclass(frozen=True)
class ProbeRound:
    """One interleaved round of a `DtypeProbe`: every dtype timed once, back to back."""

    prefill_s: tuple[tuple[str, float], ...]
    decode_s: tuple[tuple[str, float], ...]
    cast_s: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True)
class DtypeProbe:
    """`F.linear` timed on this machine's CPU per dtype: a prefill-shaped GEMM, a decode-shaped GEMV,
    and the cast of a weight between dtypes (what loading a checkpoint in another dtype pays).

    Seconds are medians over interleaved repetitions. The shape bucket (in_features x out_features)
    comes from the model's hidden and intermediate sizes, rounded coarsely: the answer belongs to the
    machine, so a new model of a similar size reuses it. `plan()` measures one on a CPU-only machine
    (cached per machine) and keeps it as `Machine.dtype_probe`; pass one to `Machine.simulated()` to
    plan for another CPU's numbers.

    Attributes:
        in_features: Input width of the timed weight (the shape bucket).
        out_features: Output width of the timed weight.
        prefill_tokens: Rows of the prefill GEMM (tokens in one forward).
        prefill_s: (dtype, seconds) pairs for one [prefill_tokens x in] @ [in x out].
        decode_s: (dtype, seconds) pairs for one [1 x in] @ [in x out], weights not in cache.
        cast_s: (from dtype, to dtype, seconds) to cast one [out x in] weight.
        threads: torch CPU threads the measurement ran with.
        measured_at: ISO date of the measurement.
        fingerprint: (key, value) pairs of `Machine.fingerprint()` when measured: if any differs
            now, the measurement is stale.
        cost_s: Seconds this process spent probing (0 when read from the cache).
        from_cache: True when read from the cache rather than measured now.
        rounds: Each measured round's own timings (empty: only the medians are known, e.g. a
            probe built by hand). The policy compares dtypes round by round, so it can tell a
            real difference from timing noise and call a tie a tie.
        confidence: How far the numbers can be trusted: "quiet" (nothing else competed for the
            cores while measuring), "busy" (others did, but the rounds and a quick re-run agree:
            used, kept for a short while), "disturbed" (they did not: not used, the plan keeps the
            checkpoint's dtype and says so).
        conditions: What the probe saw while measuring, in words (time its threads waited for a
            core, steal, load average, a re-run's verdict).

    Examples:
        >>> import cudaload
        >>> probe = cudaload.DtypeProbe(
        ...     in_features=1024, out_features=4096, prefill_tokens=512,
        ...     prefill_s=(("float32", 0.004), ("bfloat16", 0.002)),
        ...     decode_s=(("float32", 0.0004), ("bfloat16", 0.0002)),
        ...     cast_s=(("bfloat16", "float32", 0.001),),
        ...     threads=8, measured_at="2026-01-01",
        ... )
        >>> probe.prefill("bfloat16"), probe.decode("float16"), probe.cast("bfloat16", "float32")
        (0.002, None, 0.001)
        >>> cudaload.Machine.simulated(dtype_probe=probe).dtype_probe is probe
        True
    """

    in_features: int
    out_features: int
    prefill_tokens: int
    """Rows of the prefill GEMM (tokens in one forward)."""
    prefill_s: tuple[tuple[str, float], ...]
    """dtype -> seconds for one [prefill_tokens x in] @ [in x out]."""
    decode_s: tuple[tuple[str, float], ...]
    """dtype -> seconds for one [1 x in] @ [in x out], weights not in cache."""
    cast_s: tuple[tuple[str, str, float], ...]
    """(from dtype, to dtype, seconds) to cast one [out x in] weight."""
    threads: int
    measured_at: str
    """ISO date of the measurement."""
    fingerprint: tuple[tuple[str, str], ...] = ()
    cost_s: float = 0.0
    """Seconds this process spent probing (0 when read from the cache)."""
    from_cache: bool = False
    rounds: tuple[ProbeRound, ...] = ()
    """Each measured round's timings; the medians above summarise them."""
    confidence: str = "quiet"
    """"quiet", "busy" (used, kept briefly) or "disturbed" (not used)."""
    conditions: str = ""
    """What the probe saw while measuring (waits for a core, steal, load, the re-run)."""

    @property
    def weight_elements(self) -> int:
        return self.in_features * self.out_features

    def prefill(self, dtype: str) -> float | None:
        return dict(self.prefill_s).get(dtype)

    def decode(self, dtype: str) -> float | None:
        return dict(self.decode_s).get(dtype)

    def cast(self, source: str, target: str) -> float:
        if source == target:
            return 0.0
        for a, b, seconds in self.cast_s:
            if (a, b) == (source, target):
                return seconds
        return 0.0

    def per_round(self) -> tuple[DtypeProbe, ...]:
        """This probe as one probe per measured round (just itself when no rounds are kept)."""
        return tuple(
            replace(self, prefill_s=r.prefill_s, decode_s=r.decode_s, cast_s=r.cast_s or self.cast_s, rounds=())
            for r in self.rounds
        ) or (self,)


@dataclass(frozen=True)
class TunedVariant:
    """One measured (dtype, attention) variant of a tuning record."""

    dtype: str
    attn_implementation: str
    load_s: float
    prefill_s: float
    decode_tokens_per_s: float


@dataclass(frozen=True)
class TuningRecord:
    """What `cudaload bench --save` measured for one model shape on one machine.

    `plan()` reads the records saved for the planned model's shape (`Machine.tuning`) and, when one
    matches this machine's fingerprint, picks the dtype and attention it measured fastest for the
    workload; pass records to `Machine.simulated(tuning=...)` to plan with them elsewhere.

    Attributes:
        model_key: The model's shape (architecture, sizes, checkpoint dtype) as one string: see
            `ModelFacts.shape_key`.
        prompt_tokens: Prompt length the variants were timed with.
        new_tokens: Tokens generated per timed run.
        variants: One measured (dtype, attention) variant each: load seconds, prefill seconds and
            decode tokens per second.
        fingerprint: (key, value) pairs of the measuring machine's `Machine.fingerprint()`.
        measured_at: ISO date of the measurement.
        path: The file it was read from ("" when built in memory).

    Examples:
        >>> import cudaload
        >>> record = cudaload.TuningRecord("Qwen3ForCausalLM params=1", 512, 128, (), (("cpu", "x"),), "2026-01-01")
        >>> record.prompt_tokens, record.path
        (512, '')
    """

    model_key: str
    """The model's shape (architecture, sizes, checkpoint dtype) as one string: see `model_key()`."""
    prompt_tokens: int
    new_tokens: int
    variants: tuple[TunedVariant, ...]
    fingerprint: tuple[tuple[str, str], ...]
    measured_at: str
    path: str = ""
    """The file it was read from."""


@dataclass(frozen=True)
class Machine:
    """The facts a plan is made from: GPUs, CPU, installed software, Hub state, launch, measurements.

    `detect()` returns the machine this process runs on; `Machine.simulated()` builds one you
    don't have, so `plan(..., machine=...)` can say what another machine would get.

    Attributes:
        gpus: The CUDA devices this process sees, in torch's order (empty: none).
        cpu: The CPU (model, usable cores, ISA flags, memory).
        software: Installed package versions and what transformers accepts.
        hub: Hub offline mode and which attention kernels are cached.
        launch: How the process was launched (single, torchrun, accelerate, ...).
        source: Where the GPU facts came from: "nvml", "torch", "none" (no GPU found) or
            "simulated" ("detected" only for a Machine built by hand without a source).
        warnings: Problems detection found that every plan repeats (e.g. how CUDA_VISIBLE_DEVICES
            or CUDA_DEVICE_ORDER was read).
        gpu_notes: Why GPU probes that did not answer failed (e.g. "nvml: NVML could not start: ...").
        dtype_probe: The CPU dtype measurement for the model being planned (None: not measured,
            e.g. simulated).
        tuning: Bench records for the model being planned's shape, matching this machine or not
            (the policy judges whether each is stale).
        threads: torch CPU threads this process uses (measurements depend on it); None when unknown.
        unmeasured: Why the CPU dtype was not measured for the model being planned although it could
            be (e.g. another process held the measurement lock too long); empty otherwise.

    Examples:
        >>> import cudaload
        >>> machine = cudaload.Machine.simulated("A100", count=2)
        >>> machine.describe(), machine.source
        ('2x NVIDIA A100-SXM4-80GB (sm_80)', 'simulated')
        >>> cudaload.Machine.simulated().describe()
        'CPU simulated CPU (8 cores), no CUDA GPU'
    """

    gpus: tuple[Gpu, ...]
    cpu: Cpu
    software: Software = field(default_factory=Software)
    hub: Hub = field(default_factory=Hub)
    launch: Launch = field(default_factory=Launch)
    source: str = "detected"
    """"nvml", "torch", "none" (no GPU found) or "simulated"."""
    warnings: tuple[str, ...] = ()
    gpu_notes: tuple[str, ...] = ()
    """Why GPU probes that did not answer failed (e.g. "nvml: NVML could not start: ...")."""
    dtype_probe: DtypeProbe | None = None
    """The CPU dtype measurement for the model being planned (None: not measured, e.g. simulated)."""
    tuning: tuple[TuningRecord, ...] = ()
    """Bench records for the model being planned's shape, matching this machine or not (the policy
    judges whether each is stale)."""
    threads: int | None = None
    """torch CPU threads this process uses (measurements depend on it); None when unknown."""
    unmeasured: str = ""
    """Why the CPU dtype was not measured although it could be; empty otherwise."""

    def fingerprint(self) -> dict[str, str]:
        """What a measurement on this machine depends on: if any of it changes, the numbers are stale.

        CPU model, ISA flags, usable cores, torch's CPU threads, torch version and the GPUs; string
        values, so a cached measurement can be compared field by field and say what differs.
        """
        cpu = self.cpu
        return {
            "cpu": cpu.model,
            "isa": " ".join(sorted(cpu.flags)),
            "cores": str(cpu.cores),
            "threads": str(self.threads),
            "torch": self.software.version("torch") or "none",
            "gpus": ", ".join(f"{g.name} {g.sm}" for g in self.gpus) or "none",
        }

    def fingerprint_differences(self, recorded: Iterable[tuple[str, str]]) -> tuple[str, ...]:
        """How a measurement's recorded `fingerprint` differs from this machine's, one
        "key 'there' there, 'here' here" per field; empty when the measurement applies here."""
        there = dict(recorded)
        return tuple(
            f"{key} {there.get(key, '?')!r} there, {value!r} here"
            for key, value in self.fingerprint().items()
            if there.get(key) != value
        )

    @property
    def weakest_gpu(self) -> Gpu | None:
        """The GPU every plan must be valid for: the lowest compute capability, then memory."""
        if not self.gpus:
            return None
        return min(self.gpus, key=lambda g: (g.capability, g.usable_memory))

    def describe(self) -> str:
        if not self.gpus:
            return f"CPU {self.cpu.model} ({self.cpu.cores} cores), no CUDA GPU"
        counts: dict[str, int] = {}
        for gpu in self.gpus:
            counts[gpu.name] = counts.get(gpu.name, 0) + 1
        names = " + ".join(
            f"{n}x {name}" for name, n in sorted(counts.items())
        )  # "1x A100 + 1x T4", not "2x A100 + T4"
        return f"{names} ({self.weakest_gpu.sm if self.weakest_gpu else ''})"

    @classmethod
    def simulated(
        cls,
        gpu: str | Sequence[str] | None = None,
        *,
        count: int = 1,
        packages: Mapping[str, str | None] | None = None,
        installed_packages: bool = True,
        offline: bool = False,
        cached_kernels: Iterable[str] = (),
        cpu_flags: Iterable[str] = ("avx2",),
        cpu_memory_gib: int = 64,
        launch: Launch | None = None,
        dtype_probe: DtypeProbe | None = None,
        tuning: Sequence[TuningRecord] = (),
    ) -> Machine:
        """A machine you don't have: catalog GPUs (by alias, e.g. "T4", "H100"), the packages of
        this machine (or cudaload's defaults) with `packages=` on top, Hub state.

        `gpu` may be a list of names for a mixed machine; `count` repeats a single name.
        `cached_kernels` names Hub kernel repos to treat as cached for this torch/CUDA.
        A simulated machine has no measurements unless `dtype_probe` / `tuning` give them.

        Args:
            gpu: A GPU name as `nvidia-smi` prints it, with or without "NVIDIA " ("H100 PCIe",
                "A100-SXM4-80GB"), or an alias ("T4", "A100", "H100", "GH200", ...); a GPU the
                catalog lacks described by its facts, "custom:sm90:80GiB" (compute capability,
                memory, optionally ":132sm"); a list of them for a mixed machine, or None (the
                default) for a CPU-only machine.
            count: How many of a single named GPU (default 1).
            packages: Distribution -> version, added to (or replacing) what the machine starts
                from; a version of None removes that distribution (e.g. `{"bitsandbytes": None}`).
            installed_packages: Start from the packages installed here (default True: a plan for
                an H100 from this laptop assumes the H100 has your bitsandbytes, kernels, peft, ...;
                torch and transformers at the versions installed here). False: start from torch
                2.13.0, transformers 5.22.2 and accelerate 1.16.0 only. `Software.assumed` (and a
                plan's explain() and JSON) say which.
            offline: Simulate HF_HUB_OFFLINE (default False).
            cached_kernels: Hub kernel repos to treat as cached (default none).
            cpu_flags: The CPU's ISA flags (default `("avx2",)`).
            cpu_memory_gib: RAM in GiB, total and available (default 64).
            launch: The launch (default: a single process).
            dtype_probe: A CPU dtype measurement to plan with (default None: the static table).
            tuning: Bench records to plan with (default none).

        Returns:
            A Machine with `source="simulated"`, an 8-core "simulated CPU" and, with GPUs, torch
            built for CUDA 12.8.

        Raises:
            UnknownGpuError: a GPU name the catalog does not know (the message suggests the nearest), or a
                "custom:" description that does not parse.
            SettingError: `count` not a whole number >= 1, `packages` not a mapping of
                distribution -> version strings, or `gpu` not a name or a list of names.

        Examples:
            >>> import cudaload
            >>> machine = cudaload.Machine.simulated(["A100", "T4"])
            >>> [gpu.sm for gpu in machine.gpus], machine.weakest_gpu.name
            (['sm_80', 'sm_75'], 'Tesla T4')
        """
        from ..upstream import FLASH_OPTIONS, KERNELS_RANGES, hub_kernel_version

        _check_simulated(gpu, count, packages)
        if not isinstance(installed_packages, bool):
            from ..errors import SettingError

            raise SettingError(f"installed_packages={installed_packages!r}: pass True or False.")
        names = [] if gpu is None else [gpu] * count if isinstance(gpu, str) else list(gpu)
        gpus = tuple(_catalog_gpu(lookup_gpu(name), i) for i, name in enumerate(names))
        versions, assumed = _simulated_packages(packages or {}, installed_packages)
        software = Software(
            packages=tuple(sorted(versions.items())),
            torch_cuda="12.8" if gpus else None,
            # the simulated transformers' range (None, i.e. unchecked, for a minor not in the table)
            kernels_range=KERNELS_RANGES.get(".".join(versions["transformers"].split(".")[:2])),
            assumed=assumed,
        )
        cached = set(cached_kernels)
        hub = Hub(
            offline=offline,
            kernels=tuple(
                HubKernel(
                    o.hub_repo,
                    hub_kernel_version(o.hub_repo, versions["torch"], versions["transformers"]),
                    "simulated" if o.hub_repo in cached else None,
                    "cached (simulated)" if o.hub_repo in cached else "not in the local cache",
                )
                for o in FLASH_OPTIONS.values()
            ),
        )
        cpu = Cpu(
            model="simulated CPU",
            cores=8,
            arch="x86_64",
            flags=frozenset(cpu_flags),
            memory_total=cpu_memory_gib * GiB,
            memory_available=cpu_memory_gib * GiB,
        )
        return cls(
            gpus=gpus,
            cpu=cpu,
            software=software,
            hub=hub,
            launch=launch or Launch(),
            source="simulated",
            dtype_probe=dtype_probe,
            tuning=tuple(tuning),
            threads=cpu.cores,
        )


SIMULATED_DEFAULTS = {"torch": "2.13.0", "transformers": "5.22.2", "accelerate": "1.16.0"}
"""What a simulated machine has when neither this machine nor `packages=` says otherwise (the tested set)."""


def _simulated_packages(told: Mapping[str, str | None], installed: bool) -> tuple[dict[str, str], str]:
    """A simulated machine's {distribution: version} and one line saying where it comes from."""
    from .. import installed as here  # reads dist-info folder names only: see installed.py

    base = {**SIMULATED_DEFAULTS, **(here.packages_here() if installed else {})}
    origin = (
        "as installed here"
        if installed
        else f"the defaults ({', '.join(f'{k} {v}' for k, v in SIMULATED_DEFAULTS.items())})"
    )
    versions = {k: v for k, v in {**base, **told}.items() if v is not None}
    if "transformers" not in versions or "torch" not in versions:
        from ..errors import SettingError

        raise SettingError(
            f"packages={dict(told)!r} removes torch or transformers: a machine cudaload plans for has both "
            "(give a version instead, e.g. {'transformers': '5.22.2'})."
        )
    added = ", ".join(f"{k} {v}" for k, v in sorted(told.items()) if v is not None)
    removed = ", ".join(k for k, v in sorted(told.items()) if v is None)
    return versions, origin + (f", with {added}" if added else "") + (f", without {removed}" if removed else "")


def _catalog_gpu(entry: CatalogGpu, index: int) -> Gpu:
    """A catalog GPU as a simulated machine's GPU `index`: all of its memory free, as far as anyone knows."""
    return Gpu(
        index=index,
        name=entry.name,
        capability=entry.capability,
        total_memory=int(entry.memory_gib * GiB),
        free_memory=None,
        physical_index=index,
        multiprocessors=entry.multiprocessors,
    )


def _check_simulated(gpu: object, count: object, packages: object) -> None:
    """Machine.simulated's arguments, checked before any is used (a str for packages would be
    iterated letter by letter, a float count would multiply a list)."""
    from ..errors import SettingError

    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SettingError(f"count={count!r}: pass a whole number of GPUs, 1 or more (e.g. count=8).")
    if (
        gpu is not None
        and not isinstance(gpu, str)
        and (not isinstance(gpu, Sequence) or not all(isinstance(name, str) for name in gpu))
    ):
        raise SettingError(f"gpu={gpu!r}: pass a GPU name ('H100'), a list of names (['A100', 'T4']) or None.")
    if packages is not None and (
        not isinstance(packages, Mapping)
        or not all(isinstance(k, str) and isinstance(v, (str, type(None))) for k, v in packages.items())
    ):
        raise SettingError(
            f"packages={packages!r}: pass a dict of distribution -> version, e.g. {{'flash-attn': '2.8.3'}} "
            "(not 'flash-attn==2.8.3')."
        )
