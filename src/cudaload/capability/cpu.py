"""CPU facts from /proc (Linux) or platform, without importing torch."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from pathlib import Path

from ..facts.machine import Cpu

__all__ = ["parse_cpuinfo", "parse_meminfo", "physical_cores", "probe_cpu"]

SYSFS_CPU = Path("/sys/devices/system/cpu")

# The flags that decide CPU dtype and matmul paths; the rest of /proc/cpuinfo is noise here.
RELEVANT_FLAGS = frozenset(
    {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8", "amx_fp16"}
)


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """(model name, relevant ISA flags) from the text of /proc/cpuinfo."""
    model = ""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split()) & RELEVANT_FLAGS
    return model, flags


def parse_meminfo(text: str) -> tuple[int | None, int | None]:
    """(total, available) bytes from the text of /proc/meminfo."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * 1024
    return values.get("MemTotal"), values.get("MemAvailable")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


def physical_cores(cpus: Iterable[int], sysfs: Path = SYSFS_CPU) -> int | None:
    """How many physical cores the logical CPUs `cpus` are on: distinct (package, core) pairs of their sysfs
    topology, so a core's hyperthreads count once. None when a CPU's topology cannot be read (not Linux).

    torch's default CPU thread count is this number, not `os.cpu_count()`: its CPU wheels size the OpenMP pool from
    MKL (torch 2.13 C++ `at::init_num_threads`: `omp_set_num_threads(mkl_get_max_threads())`), which counts
    physical cores within the affinity mask, and without MKL from cpuinfo's cores
    (`TaskThreadPoolBase::defaultNumThreads`). Measured here (AMD EPYC, 2 cores, no SMT): torch 2.13.0 says 2
    threads, and 1 under `taskset -c 0`."""
    found = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        package, core = _read(str(topology / "physical_package_id")).strip(), _read(str(topology / "core_id")).strip()
        if not core:
            return None
        found.add((package, core))
    return len(found) or None


def probe_cpu() -> Cpu:
    model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    total, available = parse_meminfo(_read("/proc/meminfo"))
    try:
        usable = sorted(os.sched_getaffinity(0))
        cores, physical = len(usable), physical_cores(usable)
    except AttributeError:  # not Linux
        cores, physical = os.cpu_count() or 1, None
    return Cpu(
        model=model or platform.processor() or platform.machine(),
        cores=cores,
        arch=platform.machine(),
        flags=flags,
        memory_total=total,
        memory_available=available,
        physical_cores=physical,
    )
