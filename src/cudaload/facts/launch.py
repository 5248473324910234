"""How this process was launched (torchrun, accelerate, SLURM) and what it shards with, as frozen data."""

from __future__ import annotations

from typing import Literal

from ..frozen import frozen

__all__ = ["Launch", "Strategy", "zero_stage"]


Strategy = Literal["ddp", "fsdp", "deepspeed"]
"""How a distributed launch shares the model: data parallel, FSDP, or DeepSpeed ZeRO."""

_ZERO = "deepspeed-zero"


def zero_stage(strategy: str) -> int | None:
    """The ZeRO stage of a planned "deepspeed-zero<stage>[-offload]" strategy, the digit after "deepspeed-zero";
    None for any other strategy. The one reader of the stage in a strategy's name (policy, loaders, launch)."""
    digit = strategy.removeprefix(_ZERO)[:1] if strategy.startswith(_ZERO) else ""
    return int(digit) if digit.isdigit() else None


@frozen
class Launch:
    """How this process was launched (torchrun, accelerate, SLURM) and what it shards with.

    Read by `detect()` from the environment variables the launchers set.

    Attributes:
        launcher: "accelerate", "torchrun", "mpirun", "slurm", "env" (RANK and WORLD_SIZE set by
            hand), or None for a plain single process.
        rank: This process's global rank (0 for a single process).
        local_rank: Its rank on this node: the GPU it loads onto (`device_map={"": local_rank}`).
        world_size: Processes in the job (1 for a single process).
        local_world_size: Processes on this node.
        strategy: "ddp", "fsdp" or "deepspeed" when known; None for a single process.
        zero_stage: The DeepSpeed ZeRO stage, when launched with DeepSpeed; else None.
        problems: Launch variables that are present but invalid (negative, non-numeric, rank >=
            world size); planning raises PlacementError when there are any.
        notes: A launch that works but not as its command line asked (plan warnings).
        mixed_precision: The launcher's mixed precision ("no", "fp16", "bf16", "fp8";
            ACCELERATE_MIXED_PRECISION), which a fine-tuning plan's TrainingArguments flags follow;
            None when not set.

    Examples:
        >>> import cudaload
        >>> launch = cudaload.Launch(launcher="torchrun", rank=1, local_rank=1, world_size=2, strategy="fsdp")
        >>> launch.distributed, launch.shards_parameters
        (True, True)
        >>> cudaload.Machine.simulated("A100", count=2, launch=launch).launch.world_size
        2
    """

    launcher: str | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    strategy: Strategy | None = None
    """"ddp", "fsdp" or "deepspeed" when known; None for a single process."""
    zero_stage: int | None = None
    problems: tuple[str, ...] = ()
    """Launch variables that are present but invalid (negative, non-numeric, rank >= world size)."""
    notes: tuple[str, ...] = ()
    """A launch that works but not as its command line asked (plan warnings)."""
    mixed_precision: str | None = None
    """`accelerate launch --mixed_precision` ("no", "fp16", "bf16" or "fp8", from ACCELERATE_MIXED_PRECISION);
    None when not launched with one. TrainingArguments' bf16/fp16 flags override it, so the plan follows it."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def shards_parameters(self) -> bool:
        """FSDP and DeepSpeed ZeRO-3 place parameters themselves: no device_map."""
        return self.strategy == "fsdp" or (self.strategy == "deepspeed" and self.zero_stage == 3)
