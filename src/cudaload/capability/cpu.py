"""CPU facts from /proc (Linux) or platform, without importing torch."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from ..facts.machine import Cpu

__all__ = ["parse_cpuinfo", "parse_meminfo", "probe_cpu"]

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


def probe_cpu() -> Cpu:
    model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    total, available = parse_meminfo(_read("/proc/meminfo"))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return Cpu(
        model=model or platform.processor() or platform.machine(),
        cores=cores,
        arch=platform.machine(),
        flags=flags,
        memory_total=total,
        memory_available=available,
    )
