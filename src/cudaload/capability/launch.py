"""The distributed launch, read from the environment torchrun / accelerate / SLURM set."""

from __future__ import annotations

from collections.abc import Mapping

from .facts import Launch

__all__ = ["read_launch"]

_TRUE = {"1", "true", "yes", "on"}


def read_launch(env: Mapping[str, str]) -> Launch:
    problems: list[str] = []

    def _int(*names: str) -> int | None:
        """The first of `names` that is set, as a non-negative int; a malformed one is a problem."""
        for name in names:
            value = env.get(name)
            if value is None or not value.strip():
                continue
            if value.strip().isdigit():
                return int(value)
            problems.append(f"{name}={value!r} is not a non-negative integer")
            return None
        return None

    if "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env:
        launcher: str | None = "torchrun"
    elif any(k.startswith("ACCELERATE_") for k in env) and "RANK" in env:
        launcher = "accelerate"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "slurm"
    elif "RANK" in env and "WORLD_SIZE" in env:
        launcher = "env"
    else:
        launcher = None

    world_size = _int("WORLD_SIZE", "SLURM_NTASKS") or 1
    rank = _int("RANK", "SLURM_PROCID") or 0
    local_rank = _int("LOCAL_RANK", "SLURM_LOCALID") or 0
    local_world_size = _int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE") or min(world_size, 1 + local_rank)
    if rank >= world_size:
        problems.append(f"RANK={rank} is not below WORLD_SIZE={world_size}")

    strategy: str | None = None
    zero_stage: int | None = None
    if env.get("ACCELERATE_USE_FSDP", "").lower() in _TRUE or env.get("FSDP_SHARDING_STRATEGY"):
        strategy = "fsdp"
    elif env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in _TRUE or "DEEPSPEED_ZERO_STAGE" in env:
        strategy = "deepspeed"
        zero_stage = _int("ACCELERATE_DEEPSPEED_ZERO_STAGE", "DEEPSPEED_ZERO_STAGE")
    elif world_size > 1:
        strategy = "ddp"
    return Launch(
        launcher=launcher,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=max(local_world_size, 1),
        strategy=strategy,
        zero_stage=zero_stage,
        problems=tuple(problems),
    )
