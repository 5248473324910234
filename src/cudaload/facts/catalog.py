"""Known GPUs, for planning on a machine you don't have (`cudaload plan --gpu T4`).

Values are the vendor's: compute capability, memory, SM count. Lookup is by a
normalised alias; a plan never decides by name, only by the facts here. Plain data:
`Machine.simulated()` turns an entry into a `Gpu`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnknownGpuError

__all__ = ["KNOWN_GPUS", "CatalogGpu", "lookup_gpu"]


@dataclass(frozen=True)
class CatalogGpu:
    name: str
    capability: tuple[int, int]
    memory_gib: int
    multiprocessors: int
    aliases: tuple[str, ...] = ()


KNOWN_GPUS: tuple[CatalogGpu, ...] = (
    CatalogGpu("Tesla V100-SXM2-32GB", (7, 0), 32, 80, ("v100",)),
    CatalogGpu("Tesla T4", (7, 5), 15, 40, ("t4",)),
    CatalogGpu("NVIDIA A10G", (8, 6), 22, 80, ("a10g",)),
    CatalogGpu("NVIDIA GeForce RTX 3090", (8, 6), 24, 82, ("rtx3090", "3090")),
    CatalogGpu("NVIDIA A100-SXM4-40GB", (8, 0), 40, 108, ("a100-40gb", "a100-40")),
    CatalogGpu("NVIDIA A100-SXM4-80GB", (8, 0), 80, 108, ("a100", "a100-80gb", "a100-80")),
    CatalogGpu("NVIDIA L4", (8, 9), 22, 58, ("l4",)),
    CatalogGpu("NVIDIA L40S", (8, 9), 45, 142, ("l40s",)),
    CatalogGpu("NVIDIA GeForce RTX 4090", (8, 9), 24, 128, ("rtx4090", "4090")),
    CatalogGpu("NVIDIA H100 80GB HBM3", (9, 0), 80, 132, ("h100", "h100-80gb")),
    CatalogGpu("NVIDIA H200", (9, 0), 141, 132, ("h200",)),
    CatalogGpu("NVIDIA B200", (10, 0), 180, 148, ("b200",)),
    CatalogGpu("NVIDIA GeForce RTX 5090", (12, 0), 32, 170, ("rtx5090", "5090")),
    CatalogGpu("Orin (nvgpu)", (8, 7), 64, 16, ("jetson-orin", "orin", "agx-orin")),
)


def _normalise(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def lookup_gpu(name: str) -> CatalogGpu:
    """Find a catalog GPU by alias or full name (case and punctuation ignored)."""
    wanted = _normalise(name)
    for gpu in KNOWN_GPUS:
        if wanted in {_normalise(a) for a in (gpu.name, *gpu.aliases)}:
            return gpu
    known = ", ".join(g.aliases[0] for g in KNOWN_GPUS)
    raise UnknownGpuError(f"Unknown GPU {name!r} for a simulated machine. Known GPUs: {known}.")
