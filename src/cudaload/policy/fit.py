"""Does it fit? One answer, used by placement (which GPU, or a spread over several) and by
quantize="auto" (whether 4-bit is needed), so both judge the same GPU with the same budget.

A single process puts a model that fits one GPU on the GPU with the most usable memory (or on the
GPU your device_map pins it to). Under a distributed launch every rank holds a whole copy on its
own GPU (cuda:LOCAL_RANK), and every rank must make the same choice (a 4-bit copy on one rank and
a 16-bit one on another cannot be averaged), so the copy must fit the smallest GPU this node shows.
All of the node's GPUs count, not only the first LOCAL_WORLD_SIZE: when a launcher does not set
LOCAL_WORLD_SIZE it is guessed per rank, and a guess would let ranks disagree. Ranks on other
nodes judge their own GPUs.

Spreading a copy over the GPUs (device_map="auto" with max_memory) gives each GPU the same share
of its free memory, divided among the node's ranks when each of them spreads its own copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from ..errors import PlacementError
from ..facts.machine import GiB, Gpu, Machine
from ..frozen import frozen
from .devices import cuda_index

__all__ = [
    "HEADROOM",
    "TRAINING_SHARE",
    "Fit",
    "format_bytes",
    "judge_fit",
    "max_memory_size",
    "percent",
    "pinned_gpu",
    "size_bytes",
]

HEADROOM = 0.8
"""Weights may use at most this share of a device's free memory: the rest holds activations, the
KV cache and the CUDA context (~0.5 GiB). accelerate's own default keeps 10% free."""
TRAINING_SHARE = 0.9
"""A training estimate already counts activations, LoRA/optimizer states and the CUDA context, so
it may use more of the device."""


def format_bytes(n: float) -> str:
    """cudaload's one byte formatter (reasons, warnings, doctor): GiB from a tenth of one, then MiB,
    KiB, bytes.

    Examples:
        >>> [format_bytes(n) for n in (12.34 * 2**30, 2**29, 3 * 2**20, 256 * 1024, 256)]
        ['12.3 GiB', '0.5 GiB', '3.0 MiB', '256.0 KiB', '256 B']
    """
    size = abs(n)
    if size >= GiB / 10:
        return f"{n / GiB:.1f} GiB"
    if size >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if size >= 1024 else f"{int(n)} B"


def max_memory_size(n: float) -> str:
    """A `max_memory` value as accelerate parses it ("12.0GiB", no space).

    Examples:
        >>> max_memory_size(12 * 2**30)
        '12.0GiB'
    """
    return f"{n / GiB:.1f}GiB"


_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def size_bytes(value: int | str) -> int:
    """A `max_memory` value in bytes, as accelerate reads it (`convert_file_size_to_int`: "GB" is 10**9,
    "GiB" 2**30); the value was checked by devices.py `check_max_memory`.

    Examples:
        >>> size_bytes("100MiB"), size_bytes("1.5GB"), size_bytes(1024)
        (104857600, 1500000000, 1024)
    """
    if isinstance(value, int):
        return value
    text = value.strip().upper()
    unit = next(u for u in sorted(_UNITS, key=len, reverse=True) if text.endswith(u))
    return int(float(text[: -len(unit)]) * _UNITS[unit])


def percent(share: float) -> str:
    """A share as reasons write it, so the text follows HEADROOM / TRAINING_SHARE.

    Examples:
        >>> percent(HEADROOM), percent(TRAINING_SHARE)
        ('80%', '90%')
    """
    return f"{share:.0%}"


@frozen
class Fit:
    """Where `need` bytes fit on a machine, judged once for every decision that asks.

    Attributes:
        need: Bytes asked for (weights, or a whole training estimate).
        share: The share of free memory allowed (HEADROOM or TRAINING_SHARE).
        gpu: The GPU a whole copy is judged on (None without a GPU).
        budget: Bytes usable on `gpu`: `share` of its free memory.
        per_rank: Judged for a distributed launch: every rank holds a copy, so `gpu` is the
            smallest GPU of the node.
        choices: How many GPUs `gpu` was chosen among (1: the only one, or the one you pinned).
        spread: GPU index -> bytes this process may put there when its copy spreads over every
            GPU: `share` of each one's free memory, divided among the node's ranks.
    """

    need: int
    share: float
    gpu: Gpu | None = None
    budget: int = 0
    per_rank: bool = False
    choices: int = 0
    spread: Mapping[int, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """A whole copy fits `gpu` (exactly the budget fits)."""
        return self.gpu is not None and self.need <= self.budget

    @property
    def fits_spread(self) -> bool:
        """The copy fits the GPUs together (what device_map="auto" with `spread` as max_memory holds)."""
        return bool(self.spread) and self.need <= sum(self.spread.values())

    @property
    def devices(self) -> tuple[int, ...]:
        """The GPU indices the copy goes on: `gpu` alone when it fits, every GPU when only a spread
        fits, none when it needs the CPU (or there is no GPU)."""
        if self.fits and self.gpu is not None:
            return (self.gpu.index,)
        return tuple(self.spread) if self.fits_spread else ()

    @property
    def where(self) -> str:
        """The GPU judged on, and why that one when there was a choice."""
        if self.gpu is None:
            return "no GPU"
        if self.choices <= 1:
            return self.gpu.name
        why = (
            f"the smallest of {self.choices} GPUs: every rank holds a whole copy"
            if self.per_rank
            else f"the most free memory of {self.choices} GPUs"
        )
        return f"{self.gpu.name} (cuda:{self.gpu.index}, {why})"

    @property
    def reason(self) -> str:
        """ "~<need> fit in / do not fit in <budget> usable on <where> (<share> of <free> free)"."""
        if self.gpu is None:
            return f"~{format_bytes(self.need)}: no GPU"
        verb = "fit in" if self.fits else "do not fit in"
        return (
            f"~{format_bytes(self.need)} {verb} {format_bytes(self.budget)} usable on {self.where} "
            f"({percent(self.share)} of {format_bytes(self.gpu.usable_memory)} free)"
        )


def pinned_gpu(device_map: Any) -> int | None:
    """The one CUDA index a device_map puts the whole model on (0, "cuda:1", {"": 1}); None for a
    strategy ("auto"), the CPU, or a map over several devices. Validity is placement's business:
    a value `check_device_map` would refuse pins nothing here."""
    values = list(device_map.values()) if isinstance(device_map, Mapping) else [device_map]
    try:
        indices = {cuda_index(value, "device_map") for value in values}
    except PlacementError:  # a strategy or not a device
        return None
    return indices.pop() if len(indices) == 1 else None  # {None}: the CPU or disk


def judge_fit(machine: Machine, need: int, share: float, pinned: int | None = None) -> Fit:
    """Judge `need` bytes on this machine and launch: the one GPU a whole copy would go on, and the
    per-GPU budgets of a spread.

    Single process: the GPU `pinned` names (a device_map you gave), else the one with the most usable
    memory (the lowest index on a tie), as placement chooses. Distributed: the smallest GPU, since
    every rank holds a copy and all must agree (`pinned` is ignored); a spread's budgets are divided
    by the node's ranks (LOCAL_WORLD_SIZE).

    Examples:
        >>> import cudaload
        >>> fit = judge_fit(cudaload.Machine.simulated(["T4", "A100"]), 20 * 2**30, TRAINING_SHARE)
        >>> fit.fits, fit.devices, fit.where
        (True, (1,), 'NVIDIA A100-SXM4-80GB (cuda:1, the most free memory of 2 GPUs)')
    """
    if not machine.gpus:
        return Fit(need, share)
    launch = machine.launch
    per_rank = launch.distributed
    ranks = max(launch.local_world_size, 1) if per_rank else 1
    spread = {g.index: int(g.usable_memory * share) // ranks for g in machine.gpus}
    by_index = {g.index: g for g in machine.gpus}
    if per_rank:
        gpu = min(machine.gpus, key=lambda g: (g.usable_memory, g.index))
        choices = len(machine.gpus)
    elif pinned is not None and pinned in by_index:
        gpu, choices = by_index[pinned], 1
    else:
        gpu = min(machine.gpus, key=lambda g: (-g.usable_memory, g.index))
        choices = len(machine.gpus)
    return Fit(need, share, gpu, int(gpu.usable_memory * share), per_rank, choices, spread)
