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

if TYPE_CHECKING:
    from ..facts.model import ModelFacts

__all__ = [
    "detect",
    "detect_uncached",
    "measure_for",
]


def detect_uncached(
    env: Mapping[str, str] | None = None,
    probes: Sequence[Callable[[], GpuProbe]] = (NvmlProbe, TorchProbe),
    rocm_probes: Sequence[Callable[[], GpuProbe]] = (AmdSmiProbe, RocmTorchProbe),
) -> Machine:
    """Read the machine now. `env` defaults to os.environ; `probes` (NVIDIA's) and `rocm_probes` (AMD's, asked
    when NVIDIA's find no GPU) are the GPU boundary."""
    env = dict(os.environ) if env is None else env
    report = probe_gpus(env, probes)
    if not report.gpus and rocm_probes:
        amd = probe_gpus(_rocm_env(env), rocm_probes)
        if amd.gpus:
            report = replace(amd, notes=report.notes + amd.notes)
        elif not amd.no_driver:  # an AMD driver whose probes failed is worth a note; no AMD driver is not
            report = replace(report, notes=report.notes + amd.notes)
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


def _rocm_env(env: Mapping[str, str]) -> dict[str, str]:
    """The visibility amdsmi's list is filtered by: HIP numbers GPUs in PCI order (no FASTEST_FIRST) and reads
    HIP_VISIBLE_DEVICES before CUDA_VISIBLE_DEVICES. (ROCR_VISIBLE_DEVICES, applied below HIP, is not read.)"""
    rocm = {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if "HIP_VISIBLE_DEVICES" in env:
        rocm["CUDA_VISIBLE_DEVICES"] = env["HIP_VISIBLE_DEVICES"]
    return rocm


@functools.cache
def detect() -> Machine:
    """The machine this process runs on, read once (NVML, /proc, package metadata, env).

    The GPUs come from NVML (else torch, else none: on Linux without an NVIDIA driver node NVML
    is not even imported; without NVIDIA GPUs, amdsmi, else a ROCm torch's device properties), filtered and ordered by CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER as torch
    sees them; the CPU from /proc; installed versions from package metadata; the Hub state (offline
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
    machine = replace(machine, threads=torch_threads(env, machine.cpu.cores))
    records = read_tuning_records(model.shape_key, env)
    matched = any(not machine.fingerprint_differences(r.fingerprint) for r in records)
    measured, unmeasured = None, ""
    cpu_plan = not machine.gpus if on_cpu is None else on_cpu
    if probe and probe_enabled(env) and cpu_plan and not dtype_chosen and not matched:
        bucket = shape_bucket(model.hidden_size, model.intermediate_size)
        measured, unmeasured = dtype_probe_for(machine, bucket, env, model=model.source)
    return replace(machine, tuning=records, dtype_probe=measured, unmeasured=unmeasured)
