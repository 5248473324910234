"""Capability detection: every side effect of cudaload lives in this package.

`detect()` reads the machine once per process (cached) and returns a frozen `Machine`.
Nothing runs at import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..facts.machine import Machine
from .cpu import probe_cpu
from .dtype_probe import dtype_probe_for, probe_enabled, shape_bucket, torch_threads
from .gpus import GpuProbe, NvmlProbe, TorchProbe, probe_gpus
from .launch import read_launch
from .rocm import AmdSmiProbe, RocmTorchProbe
from .software import probe_hub, probe_software
from .tuning_records import read_tuning_records
from .usable_gpus import gpus_unusable, torch_arch_list
from .xpu_mps import MpsProbe, XpuTorchProbe

if TYPE_CHECKING:
    from ..facts.model import ModelFacts

__all__ = [
    "GPU_PROBES",
    "detect",
    "detect_uncached",
    "measure_for",
]


GPU_PROBES: dict[str, tuple[Callable[[], GpuProbe], ...]] = {
    "nvidia": (NvmlProbe, TorchProbe),
    "amd": (AmdSmiProbe, RocmTorchProbe),
    "intel": (XpuTorchProbe,),
    "apple": (MpsProbe,),
}
"""Each GPU vendor's probes, asked in this order (a vendor's management library first, torch as its fallback)
until one vendor finds GPUs. A new vendor is one entry here (and its record, facts/platforms.py)."""


def detect_uncached(
    env: Mapping[str, str] | None = None,
    probes: Sequence[Callable[[], GpuProbe]] | None = None,
    vendor_probes: Mapping[str, Sequence[Callable[[], GpuProbe]]] | None = None,
) -> Machine:
    """Read the machine now. `env` defaults to os.environ. The GPU boundary: `vendor_probes` (default
    GPU_PROBES), whose "nvidia" entry `probes` replaces when given; the first vendor whose probes find GPUs
    gives the machine's GPUs."""
    env = dict(os.environ) if env is None else env
    every = dict(GPU_PROBES if vendor_probes is None else vendor_probes)
    if probes is not None:
        every["nvidia"] = tuple(probes)
    first, *others = every.values()
    report = probe_gpus(env, first)
    notes = report.notes
    for vendor_list in others if report.source == "none" else ():  # no probe of the first vendor answered
        found = probe_gpus(env, vendor_list)
        notes += () if found.no_driver else found.notes  # no driver of a vendor asked later is not news
        if found.source != "none":
            report = found
            break
    report = replace(report, notes=notes)
    software = probe_software(report.driver)
    if report.gpus and software.torch_cuda is not None:
        software = replace(software, torch_arch_list=torch_arch_list())
    return Machine(
        gpus=report.gpus,
        cpu=probe_cpu(),
        software=software,
        hub=probe_hub(env, software),
        launch=read_launch(env),
        source=report.source,
        warnings=report.warnings,
        gpu_notes=report.notes,
        gpus_unusable=gpus_unusable(report.gpus, software),
    )


@functools.cache
def detect() -> Machine:
    """The machine this process runs on, read once (NVML, /proc, package metadata, env).

    The GPUs come from NVML (else torch, else none: on Linux without an NVIDIA driver node NVML
    is not even imported; when no NVIDIA probe answers, amdsmi, else a ROCm torch's device properties:
    `GPU_PROBES`), filtered and ordered by CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER (HIP_VISIBLE_DEVICES for
    AMD) as torch sees them; the CPU from /proc; installed versions from package metadata; the Hub state (offline
    mode, cached attention kernels) and the distributed launch from the environment. The result
    is cached for the process: a changed environment needs a new process. A GPU probe that fails
    is recorded in `Machine.gpu_notes`, not raised. No measurement runs here (`plan()` adds those
    for the model it plans).

    Returns:
        The frozen `Machine` (the same object on every call).

    Examples:
        >>> import cudaload
        >>> machine = cudaload.detect()
        >>> machine is cudaload.detect()  # read once per process
        True
        >>> machine.source in ("nvml", "torch", "none"), machine.cpu.cores >= 1
        (True, True)
    """
    return detect_uncached()


def measure_for(
    machine: Machine,
    model: ModelFacts,
    *,
    probe: bool = True,
    dtype_chosen: bool = False,
    on_cpu: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> Machine:
    """`machine` with the measurements that planning `model` on it can use: the tuning records
    saved for the model's shape (any fingerprint: the policy says why it ignores a stale one)
    and, on a CPU-only machine, the dtype probe for the model's shape bucket (cached).

    The probe is skipped when `probe` is False or CUDALOAD_PROBE=0, when the dtype was chosen
    by the caller (`dtype_chosen`), and when a record of this model matches this machine.
    `on_cpu` says the plan runs on the CPU (default: no GPU seen; the planner also passes True
    when torch cannot drive the GPUs it sees). Processes that plan at once (N workers, the ranks of a
    distributed launch) take turns through a lock beside the record: the first measures while the
    others wait asleep, then they read its record, so they plan the same dtype. A rank measures with
    its own thread count (torchrun sets OMP_NUM_THREADS=1), the record a single process with the same
    OMP_NUM_THREADS reads too.
    """
    env = os.environ if env is None else env
    machine = replace(machine, threads=torch_threads(env, machine.cpu.cores, machine.cpu.physical_cores))
    records = read_tuning_records(model.shape_key, env)
    matched = any(not machine.fingerprint_differences(r.fingerprint) for r in records)
    measured, unmeasured = None, ""
    cpu_plan = not machine.gpus if on_cpu is None else on_cpu
    if probe and probe_enabled(env) and cpu_plan and not dtype_chosen and not matched:
        bucket = shape_bucket(model.hidden_size, model.intermediate_size)
        measured, unmeasured = dtype_probe_for(machine, bucket, env, model=model.source)
    return replace(machine, tuning=records, dtype_probe=measured, unmeasured=unmeasured)
