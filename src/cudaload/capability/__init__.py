"""Capability detection: every side effect of cudaload lives in this package.

`detect()` reads the machine once per process (cached) and returns a frozen `Machine`.
Nothing runs at import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence

from .cpu import probe_cpu
from .facts import Cpu, Gpu, Hub, HubKernel, Launch, Machine, Software
from .gpus import GpuProbe, NvmlProbe, TorchProbe, probe_gpus
from .launch import read_launch
from .software import probe_hub, probe_software

__all__ = ["Cpu", "Gpu", "Hub", "HubKernel", "Launch", "Machine", "Software", "detect", "detect_uncached"]


def detect_uncached(
    env: Mapping[str, str] | None = None,
    probes: Sequence[Callable[[], GpuProbe]] = (NvmlProbe, TorchProbe),
) -> Machine:
    """Read the machine now. `env` defaults to os.environ; `probes` is the GPU boundary."""
    env = dict(os.environ) if env is None else env
    report = probe_gpus(env, probes)
    software = probe_software(report.driver)
    return Machine(
        gpus=report.gpus,
        cpu=probe_cpu(),
        software=software,
        hub=probe_hub(env, software),
        launch=read_launch(env),
        source=report.source,
        warnings=report.warnings,
        gpu_notes=report.notes,
    )


@functools.cache
def detect() -> Machine:
    """The machine this process runs on, read once (NVML, /proc, package metadata, env)."""
    return detect_uncached()
