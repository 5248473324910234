"""The distributed launch, read from the environment torchrun / accelerate / SLURM set."""

from __future__ import annotations

from collections.abc import Mapping

from ..facts.machine import Launch, Strategy

__all__ = ["read_launch"]

_TRUE = {"1", "true", "yes", "on"}
_ACCELERATE_MARKERS = (
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_DYNAMO_BACKEND",
    "ACCELERATE_USE_CPU",
    "ACCELERATE_USE_FSDP",
    "ACCELERATE_USE_DEEPSPEED",
)


def read_launch(env: Mapping[str, str]) -> Launch:
    problems: list[str] = []

    read: dict[str, str] = {}  # which variable gave each value, for the messages

    def _int(*names: str, least: int = 0) -> int | None:
        """The first of `names` that is set, as an int >= `least`; a malformed one is a problem."""
        for name in names:
            value = env.get(name)
            if value is None or not value.strip():
                continue
            text = value.strip()
            if text.isascii() and text.isdigit() and int(text) >= least:  # "٢" is a digit to Python, not to torch
                read[names[0]] = f"{name}={int(text)}"
                return int(text)
            kind = "positive" if least > 0 else "non-negative"
            problems.append(f"{name}={value!r} is not a {kind} integer")
            return None
        return None

    # `accelerate launch` runs torchrun underneath for several processes (TORCHELASTIC_* set too), so
    # its own variables are checked first: it always sets these (accelerate/utils/launch.py).
    accelerate = any(name in env for name in _ACCELERATE_MARKERS)
    if accelerate:
        launcher: str | None = "accelerate"
    elif "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env:
        launcher = "torchrun"
    elif "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        launcher = "mpirun"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "slurm"
    elif "RANK" in env and "WORLD_SIZE" in env:
        launcher = "env"
    else:
        launcher = None

    # torchrun's names first, then mpirun's (what accelerate reads for multi-CPU, accelerate/state.py), then SLURM's.
    world_size = _int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", least=1) or 1
    rank = _int("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID") or 0
    local_rank = _int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID") or 0
    given_local = _int("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", least=1)
    nodes = _int("SLURM_NNODES", "SLURM_JOB_NUM_NODES", least=1) if given_local is None else None
    if given_local is None and nodes is not None and world_size % nodes == 0:
        given_local = world_size // nodes  # SLURM without --ntasks-per-node: its tasks over its nodes
    local_world_size = given_local or 1
    sizes = read.get("WORLD_SIZE", f"WORLD_SIZE={world_size}")
    if rank >= world_size:
        problems.append(f"{read.get('RANK', f'RANK={rank}')} is not below {sizes}")
    if given_local is not None and given_local > world_size:
        problems.append(f"{read['LOCAL_WORLD_SIZE']} is more than {sizes}: a node cannot run more processes than all")
    if given_local is None and world_size > 1:
        # Guessing from LOCAL_RANK gives each rank another layout (rank 0 one node of 1, rank 3 one of 4).
        problems.append(
            f"{read.get('WORLD_SIZE', f'WORLD_SIZE={world_size}')} but LOCAL_WORLD_SIZE is not set (nor "
            "OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE or SLURM_NNODES): set LOCAL_WORLD_SIZE to the number of "
            "processes on each node (torchrun and accelerate launch set it)"
        )
    notes: list[str] = []
    if accelerate and world_size == 1 and env.get("ACCELERATE_USE_CPU", "").lower() in _TRUE and "MASTER_PORT" in env:
        # accelerate sets MASTER_ADDR/PORT only for --num_processes > 1, but with --cpu it starts one
        # process itself and leaves the rest to mpirun (simple_launcher, accelerate/utils/launch.py).
        notes.append(
            "accelerate launch --cpu asked for several processes but started one (WORLD_SIZE unset): accelerate runs "
            "several CPU processes only through mpirun (--mpirun_hostfile). Training runs on this process alone. "
            "For gloo data parallelism on a CPU machine use `torchrun --nproc_per_node N` (or accelerate launch "
            "--multi_gpu --num_processes N, which runs torchrun)."
        )

    strategy: Strategy | None = None
    zero_stage: int | None = None
    fsdp = env.get("ACCELERATE_USE_FSDP", "").lower() in _TRUE or bool(env.get("FSDP_SHARDING_STRATEGY"))
    deepspeed = env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in _TRUE or "DEEPSPEED_ZERO_STAGE" in env
    if fsdp and deepspeed:
        problems.append("both FSDP and DeepSpeed are enabled (ACCELERATE_USE_FSDP/FSDP_* and DeepSpeed's variables)")
    if fsdp:
        strategy = "fsdp"
    elif deepspeed:
        strategy = "deepspeed"
        zero_stage = _int("ACCELERATE_DEEPSPEED_ZERO_STAGE", "DEEPSPEED_ZERO_STAGE")
        if zero_stage is not None and zero_stage > 3:  # DeepSpeed ZeRO has stages 0-3
            problems.append(f"{read['ACCELERATE_DEEPSPEED_ZERO_STAGE']} is not a ZeRO stage (0, 1, 2 or 3)")
            zero_stage = None
    elif world_size > 1:
        strategy = "ddp"
    # accelerate accepts these (accelerate/utils/dataclasses.py PrecisionType); TrainingArguments reads the
    # variable and lets its own bf16/fp16 flags override it (transformers training_args.py, "Mixed Precision").
    mixed_precision = env.get("ACCELERATE_MIXED_PRECISION")
    if mixed_precision is not None:
        mixed_precision = mixed_precision.strip().lower()
        if mixed_precision not in ("no", "fp16", "bf16", "fp8"):
            problems.append(f"ACCELERATE_MIXED_PRECISION={mixed_precision!r} is not one of no, fp16, bf16, fp8")
            mixed_precision = None
    return Launch(
        launcher=launcher,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=max(local_world_size, 1),
        strategy=strategy,
        zero_stage=zero_stage,
        problems=tuple(problems),
        notes=tuple(notes),
        mixed_precision=mixed_precision,
    )
