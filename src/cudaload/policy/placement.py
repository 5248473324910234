"""device_map (and max_memory): one GPU when the model fits with headroom, spread with an
explicit max_memory when it must, loud about CPU/disk offload; per-rank under torchrun."""

from __future__ import annotations

from typing import Any

from ..capability.facts import GiB, Machine
from ..errors import PlacementError
from ..plans import Decision, Rejected
from .devices import check_device_map

__all__ = ["HEADROOM", "TRAINING_SHARE", "decide_placement"]

# Weights may use at most this share of a device's free memory: the rest holds activations,
# the KV cache and the CUDA context (~0.5 GiB). accelerate's own default keeps 10% free.
HEADROOM = 0.8
# A training estimate already counts activations, LoRA/optimizer states and the CUDA context,
# so it may use more of the device; the quantization decision uses the same share.
TRAINING_SHARE = 0.9


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def _user_placement(machine: Machine, device_map: Any, quantized: bool) -> Decision:
    launch = machine.launch
    if launch.distributed and device_map == "auto":
        if quantized:
            raise PlacementError(
                f"device_map='auto' was asked for a quantized model under {launch.launcher or 'a launcher'} with "
                f"WORLD_SIZE={launch.world_size}: 'auto' splits the model across this node's GPUs and breaks data "
                f"parallelism. Leave device_map unset (cudaload gives each rank {{'': LOCAL_RANK}})."
            )
        raise PlacementError(
            f"device_map='auto' was asked under WORLD_SIZE={launch.world_size}: transformers refuses to train a "
            "model loaded with device_map='auto' in any distributed mode. Leave device_map unset."
        )
    check_device_map(machine, device_map)
    return Decision("device_map", device_map, "your choice", source="user")


def decide_placement(
    machine: Machine,
    weight_bytes: int,
    requested: Any = None,
    quantized: bool = False,
    training_bytes: int | None = None,
) -> tuple[Decision, dict[Any, str] | None, tuple[str, ...]]:
    """(device_map decision, max_memory or None, warnings).

    Whether the model fits one GPU is judged on `training_bytes` (the whole training estimate,
    against TRAINING_SHARE of free memory) when fine-tuning, else on the weights (against HEADROOM).
    """
    if requested is not None:
        return _user_placement(machine, requested, quantized), None, ()
    launch = machine.launch
    size = f"~{_gib(weight_bytes)} of weights"
    if launch.distributed and launch.shards_parameters:
        what = "FSDP" if launch.strategy == "fsdp" else "DeepSpeed ZeRO-3"
        return (
            Decision(
                "device_map",
                None,
                f"{what} shards and places parameters itself: no device_map",
                (Rejected("auto", f"conflicts with {what} sharding"),),
            ),
            None,
            (),
        )
    if launch.distributed:
        if not machine.gpus:
            return Decision("device_map", "cpu", f"rank {launch.rank}/{launch.world_size} on CPU (gloo)"), None, ()
        # One visible GPU per rank (CUDA_VISIBLE_DEVICES set per process) means cuda:0.
        index = 0 if len(machine.gpus) == 1 else launch.local_rank
        if index >= len(machine.gpus):
            raise PlacementError(
                f"LOCAL_RANK={launch.local_rank} but this process sees {len(machine.gpus)} GPU(s): start at most "
                "one process per visible GPU (torchrun --nproc_per_node), or fix CUDA_VISIBLE_DEVICES."
            )
        return (
            Decision(
                "device_map",
                {"": index},
                f"{launch.strategy or 'data'}-parallel rank {launch.rank}/{launch.world_size}: the whole model on this "
                f"rank's GPU (LOCAL_RANK={launch.local_rank}, not the global rank)",
                (Rejected("auto", "splits the model across GPUs and breaks data parallelism"),),
            ),
            None,
            (),
        )
    if not machine.gpus:
        warnings: tuple[str, ...] = ()
        available = machine.cpu.memory_available
        if available is not None and weight_bytes > available * HEADROOM:
            warnings = (f"{size} but only {_gib(available)} of RAM available: expect swapping or an OOM kill.",)
        return Decision("device_map", "cpu", f"no CUDA GPU: {size} in RAM"), None, warnings
    budgets = {g.index: int(g.usable_memory * HEADROOM) for g in machine.gpus}
    if training_bytes is None:
        need, fits, what = weight_bytes, budgets, size
    else:
        need = training_bytes
        fits = {g.index: int(g.usable_memory * TRAINING_SHARE) for g in machine.gpus}
        what = f"~{_gib(training_bytes)} to train (weights, LoRA + AdamW, activations)"
    for gpu in sorted(machine.gpus, key=lambda g: (-fits[g.index], g.index)):
        if need <= fits[gpu.index]:
            return (
                Decision(
                    "device_map",
                    f"cuda:{gpu.index}",
                    f"{what} fit on {gpu.name} (cuda:{gpu.index}, {_gib(gpu.usable_memory)} free) with headroom",
                    (Rejected("auto", "splitting a model that fits on one GPU only adds transfers"),),
                ),
                None,
                (),
            )
    max_memory: dict[Any, str] = {i: f"{b / GiB:.1f}GiB" for i, b in budgets.items()}
    total = sum(budgets.values())
    if weight_bytes <= total:
        return (
            Decision(
                "device_map",
                "auto",
                f"{size} exceed one GPU: spread over {len(budgets)} GPUs with an explicit max_memory "
                "(80% of each one's free memory)",
            ),
            max_memory,
            (),
        )
    available = machine.cpu.memory_available or 0
    max_memory["cpu"] = f"{available * HEADROOM / GiB:.1f}GiB"
    spill = weight_bytes - total
    warning = (
        f"{size} exceed all GPU memory: ~{_gib(spill)} will be offloaded to CPU"
        f"{' and disk' if spill > available * HEADROOM else ''}, and every forward copies them back (very slow). "
        "Quantize (4-bit), use more GPUs, or a smaller model."
    )
    return Decision("device_map", "auto", f"{size} exceed GPU memory: offloading to CPU"), max_memory, (warning,)
