"""The strategies a launched rank can run: those of the engine its launcher set up. An FSDP launch
(`ACCELERATE_USE_FSDP`, `FSDP_SHARDING_STRATEGY`) prepares FSDP, a DeepSpeed launch its ZeRO stage, an
`accelerate launch` without either DDP; plain torchrun (or SLURM, mpirun) names no engine, so the plan's own
choice, carried by the launch manifest, stands."""

from __future__ import annotations

from ..facts.launch import zero_stage
from ..facts.machine import Launch
from ..frozen import frozen
from .rank_sizing import STRATEGIES

__all__ = ["LaunchEngine", "launch_engine"]


@frozen
class LaunchEngine:
    """The engine a launch set up: the strategies it applies and the launch in words."""

    strategies: frozenset[str]
    what: str

    def refusal(self) -> str:
        """Why a strategy outside `strategies` is not an option on this launch's ranks."""
        kept = ", ".join(s for s in STRATEGIES if s in self.strategies) or "none cudaload plans"
        return f"this rank runs under {self.what}, whose engine applies {kept} only"


def launch_engine(launch: Launch) -> LaunchEngine | None:
    """The engine `launch` set up, or None where it names none (one process, or a launcher that leaves the
    engine to the training script: torchrun, SLURM, mpirun)."""
    if not launch.distributed:
        return None
    if launch.strategy == "fsdp":
        fsdp = frozenset(s for s in STRATEGIES if s.startswith("fsdp"))
        return LaunchEngine(fsdp, "an FSDP launch (ACCELERATE_USE_FSDP or FSDP_SHARDING_STRATEGY set)")
    if launch.strategy == "deepspeed":
        stage = launch.zero_stage
        if stage is None:
            any_stage = frozenset(s for s in STRATEGIES if zero_stage(s) is not None)
            return LaunchEngine(any_stage, "a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED set, no ZeRO stage given)")
        staged = frozenset(s for s in STRATEGIES if zero_stage(s) == stage)
        return LaunchEngine(staged, f"a DeepSpeed ZeRO-{stage} launch (zero stage {stage})")
    if launch.strategy == "ddp" and launch.launcher == "accelerate":
        # accelerate's MULTI_GPU (or MULTI_CPU) launch, with neither FSDP nor DeepSpeed configured: DDP.
        return LaunchEngine(frozenset({"ddp"}), "an accelerate launch without FSDP or DeepSpeed (DDP)")
    return None
