"""What every benchmark result records about where it ran, and where results are filed.

Results go to `benchmarks/results/<machine>/<date>[-<kind>].json` (and a `.png` chart beside it),
where <machine> is `cpu-<cpu model>-<widest ISA>` or `cuda-<gpu name>`: hardware names only, no
host name, so results from different machines sit side by side and a run on the same day replaces
that day's file. The ISA is part of a CPU's name because hypervisors report one model name for
several generations ("AMD EPYC" was Zen 3 with AVX2 on one of our machines and Zen 4 with AVX512-BF16 on another),
and those measured opposite bf16 results.
"""

from __future__ import annotations

import platform
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["machine_facts", "machine_slug", "result_path", "versions", "write_benchmark_record"]


def _sanitise(text: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:60] or "unknown"


ISA_TIERS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "asimd")
"""The instruction sets that change CPU results, widest first: a CPU is named by the first it has."""


def machine_slug(machine: Any) -> str:
    """`cuda-<first GPU's name>` when a CUDA GPU is visible, else `cpu-<cpu model>[-<widest ISA>]`."""
    if machine.gpus:
        return f"cuda-{_sanitise(machine.gpus[0].name)}"
    tier = next((flag for flag in ISA_TIERS if flag in machine.cpu.flags), "")
    return "-".join(part for part in ("cpu", _sanitise(machine.cpu.model), _sanitise(tier) if tier else "") if part)


def result_path(root: str | Path, machine: Any, kind: str = "", when: datetime | None = None) -> Path:
    """`<root>/<machine slug>/<YYYY-MM-DD>[-<kind>].json`, or, when a record of that day and kind is already there,
    the first free `...-2.json`, `...-3.json`: a second run the same day is a second record, never written over the
    first (a benchmark run with `--json results` replaced a committed record of the morning's that way)."""
    day = (when or datetime.now(timezone.utc)).strftime("%Y-%m-%d")
    stem = Path(root) / machine_slug(machine) / f"{day}{'-' + kind if kind else ''}"
    path, count = stem.with_name(f"{stem.name}.json"), 1
    while path.exists():
        count += 1
        path = stem.with_name(f"{stem.name}-{count}.json")
    return path


def machine_facts(machine: Any) -> dict[str, Any]:
    """The hardware a result was measured on, as detected (plus what torch itself reports)."""
    import torch

    cpu = machine.cpu
    return {
        "description": machine.describe(),
        "cpu": {
            "model": cpu.model,
            "arch": cpu.arch,
            "cores": cpu.cores,
            "isa_flags": sorted(cpu.flags),
            "fast_bf16": cpu.fast_bf16,
            "memory_total_bytes": cpu.memory_total,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_default_threads": torch.get_num_threads(),
        },
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "capability": f"{g.capability[0]}.{g.capability[1]}",
                "total_memory_bytes": g.total_memory,
            }
            for g in machine.gpus
        ],
        "platform": platform.platform(),
    }


def versions() -> dict[str, str | None]:
    """Versions of everything a number depends on (None: not installed)."""
    from ..installed import installed_versions
    from ..version import __version__

    installed = installed_versions()
    import torch

    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "torch_cuda": torch.version.cuda,
        **{name: installed.get(name) for name in ("transformers", "accelerate", "peft", "bitsandbytes", "kernels")},
        "cudaload": __version__,
    }


def write_benchmark_record(destination: str | Path, results_root: Path, kind: str, fields: dict[str, Any]) -> Path:
    """Write a benchmark script's record, led by the machine and the versions it ran on: to
    `result_path(results_root, <this machine>, kind)` when `destination` is "results", else to `destination`.
    Returns the path written."""
    import json

    from ..capability import detect

    machine = detect()
    out = result_path(results_root, machine, kind) if str(destination) == "results" else Path(destination)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine_facts(machine), "versions": versions(), **fields}
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return out
