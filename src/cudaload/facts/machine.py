"""Frozen facts about a machine: what detection found, or what a simulation says.

This module only defines data. It probes nothing, so the policy layer can import it. It re-exports the records a
machine is made of (`Gpu`, `Software`, `Hub`, ...) from their own modules, so `cudaload.facts.machine` names them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field, replace

from ..frozen import frozen
from .hardware import Cpu, GiB, Gpu
from .hub import Hub, HubKernel
from .launch import Launch, Strategy
from .measurements import DtypeProbe, ProbeRound, TunedVariant, TuningRecord
from .software import Software

__all__ = [
    "Cpu",
    "DtypeProbe",
    "GiB",
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


@frozen
class Machine:
    """The facts a plan is made from: GPUs, CPU, installed software, Hub state, launch, measurements.

    `detect()` returns the machine this process runs on; `Machine.simulated()` builds one you
    don't have, so `plan(..., machine=...)` can say what another machine would get.

    Attributes:
        gpus: The GPUs this process sees as torch's `cuda:N` devices (NVIDIA, or AMD under ROCm), in torch's
            order (empty: none).
        cpu: The CPU (model, usable cores, ISA flags, memory).
        software: Installed package versions and what transformers accepts.
        hub: Hub offline mode and which attention kernels are cached.
        launch: How the process was launched (single, torchrun, accelerate, ...).
        source: Where the GPU facts came from: "nvml", "torch", "amdsmi", "rocm-torch" (a ROCm torch's
            device properties), "none" (no GPU found) or "simulated" ("detected" only for a Machine built
            by hand without a source).
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
        gpus_unusable: Why torch in this process cannot drive `gpus` (a CPU-only build, a driver too
            old for its CUDA build); None when it can or there are none. Found once by `detect()`;
            `usable()` is the machine a plan may use.

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
    """"nvml", "torch", "amdsmi", "rocm-torch", "none" (no GPU found) or "simulated"."""
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
    gpus_unusable: str | None = None
    """Why torch in this process cannot drive `gpus`; None when it can (found once by `detect()`)."""

    def usable(self) -> Machine:
        """This machine as torch here can use it: without its GPUs when `gpus_unusable` says why not."""
        if self.gpus_unusable is None or not self.gpus:
            return self
        return replace(self, gpus=(), gpus_unusable=None)

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
        """ "2x NVIDIA A100-SXM4-80GB (sm_80)": the GPUs by name, and the weakest's architecture."""
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
                memory, optionally ":132sm"), or an AMD one by its gfx target, "custom:gfx942:192GiB"; a list
                of them for a mixed machine (of one vendor), or None (the
                default) for a CPU-only machine.
            count: How many of a single named GPU (default 1; an entry with several devices, as an MI250X
                board's two GCDs, gives that many GPUs each).
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
                distribution -> version strings (each a version pip accepts), `gpu` not a name or a list
                of names, `offline` not a bool, `cpu_flags`/`cached_kernels` a single string,
                `cpu_memory_gib` not a number above 0, `launch` not a `Launch`, GPUs of two vendors (one torch
                build drives one vendor's GPUs: simulate each machine on its own), `count` with a list, or a
                launch with more local ranks than the GPUs a count or a list names.

        Examples:
            >>> import cudaload
            >>> machine = cudaload.Machine.simulated(["A100", "T4"])
            >>> [gpu.sm for gpu in machine.gpus], machine.weakest_gpu.name
            (['sm_80', 'sm_75'], 'Tesla T4')
        """
        # The GPU catalog (a table built at import, ~3 ms) is for simulated machines: detection never reads it.
        from ..upstream_flash import FLASH_OPTIONS
        from ..upstream_kernels import KERNELS_RANGES, hub_kernel_version
        from .catalog import lookup_gpu
        from .simulated import catalog_gpu, check_gpus_and_launch, check_simulated, simulated_packages

        check_simulated(
            gpu,
            count,
            packages,
            {
                "offline": offline,
                "cpu_flags": cpu_flags,
                "cached_kernels": cached_kernels,
                "cpu_memory_gib": cpu_memory_gib,
            },
        )
        if not isinstance(installed_packages, bool):
            from ..errors import SettingError

            raise SettingError(f"installed_packages={installed_packages!r}: pass True or False.")
        names = [] if gpu is None else [gpu] * count if isinstance(gpu, str) else list(gpu)
        # An entry with several devices (an MI250X is two GCDs) is that many GPUs to torch.
        entries = [entry for entry in map(lookup_gpu, names) for _ in range(entry.devices)]
        check_gpus_and_launch(gpu, count, entries, launch)
        gpus = tuple(catalog_gpu(entry, i) for i, entry in enumerate(entries))
        versions, assumed = simulated_packages(packages or {}, installed_packages)
        software = Software(
            packages=tuple(sorted(versions.items())),
            # the simulated transformers' range (None, i.e. unchecked, for a minor not in the table)
            kernels_range=KERNELS_RANGES.get(".".join(versions["transformers"].split(".")[:2])),
            assumed=assumed,
        )
        for platform in {g.vendor: g.platform for g in gpus}.values():  # torch built for the GPUs' vendor
            software = platform.simulate_build(software)
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
            memory_total=int(cpu_memory_gib * GiB),
            memory_available=int(cpu_memory_gib * GiB),
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
