"""Does it fit? One answer, used by placement (which GPU) and by quantize="auto" (whether 4-bit is
needed), so both judge the same GPU.

A single process puts a model that fits one GPU on the GPU with the most usable memory. Under a
data-parallel launch every rank holds a whole copy on its own GPU, so the copy must fit the
smallest GPU a rank may get.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..facts.machine import GiB, Gpu, Machine

__all__ = ["HEADROOM", "TRAINING_SHARE", "Fit", "fit_one_gpu", "gib"]

HEADROOM = 0.8
"""Weights may use at most this share of a device's free memory: the rest holds activations, the
KV cache and the CUDA context (~0.5 GiB). accelerate's own default keeps 10% free."""
TRAINING_SHARE = 0.9
"""A training estimate already counts activations, LoRA/optimizer states and the CUDA context, so
it may use more of the device."""


def gib(n: float) -> str:
    """ "12.3 GiB", or "512.0 MiB" below a tenth of a GiB."""
    return f"{n / GiB:.1f} GiB" if abs(n) >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def percent(share: float) -> str:
    return f"{share:.0%}"


@dataclass(frozen=True)
class Fit:
    """Whether `need` bytes fit the GPU a plan would use, judged once for every decision.

    Attributes:
        gpu: The GPU judged on (None without a GPU).
        need: Bytes asked for.
        budget: Bytes usable on `gpu`: `share` of its free memory.
        share: The share of free memory allowed (HEADROOM or TRAINING_SHARE).
        per_rank: Judged for a data-parallel rank (each holds a whole copy on its own GPU).
    """

    gpu: Gpu | None
    need: int
    budget: int
    share: float
    per_rank: bool = False

    @property
    def fits(self) -> bool:
        return self.gpu is not None and self.need <= self.budget

    def describe(self) -> str:
        """ "<budget> usable on <gpu> (cuda:<i>, <share> of <free> free)"."""
        if self.gpu is None:
            return "no GPU"
        who = "each rank's GPU, the smallest being " if self.per_rank else ""
        return (
            f"{gib(self.budget)} usable on {who}{self.gpu.name} (cuda:{self.gpu.index}, "
            f"{percent(self.share)} of {gib(self.gpu.usable_memory)} free)"
        )


def fit_one_gpu(machine: Machine, need: int, share: float) -> Fit:
    """Judge `need` bytes against the one GPU a plan would put the whole model on.

    Single process: the GPU with the most usable memory (the lowest index on a tie), as placement
    chooses. A data-parallel launch: the smallest GPU, since every rank must hold its copy.
    """
    if not machine.gpus:
        return Fit(None, need, 0, share)
    per_rank = machine.launch.distributed
    if per_rank:
        gpu = min(machine.gpus, key=lambda g: (g.usable_memory, g.index))
    else:
        gpu = min(machine.gpus, key=lambda g: (-g.usable_memory, g.index))
    return Fit(gpu, need, int(gpu.usable_memory * share), share, per_rank)
