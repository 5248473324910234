"""The TrainingArguments a parallel job's engine needs, from the plan's `parallelism` decision: the micro-batch
each rank was sized for, and each engine's own settings (FSDP2's `fsdp` / `fsdp_config`, DeepSpeed's `deepspeed`
config). They are decisions named `training.<key>`: `cudaload plan --finetune` shows them, `training_arguments()`
returns them, and the launch files are written from the same values, so what is shown is what the ranks apply."""

from __future__ import annotations

from ..plans import Decision, Rejected
from ..request import TrainingRequest
from .engine_deepspeed import deepspeed_decision
from .parallelism import ParallelChoice

__all__ = ["engine_arguments"]

TRAINER_DEFAULT_BATCH = 8
"""transformers 5.22-5.25 `TrainingArguments.per_device_train_batch_size`'s default."""


def engine_arguments(choice: ParallelChoice | None, training: TrainingRequest) -> tuple[Decision, ...]:
    """The `training.*` decisions for the job's chosen strategy; none for one process with no layout asked, or
    when nothing fits."""
    if choice is None or choice.chosen is None:
        return ()
    micro = choice.sizes[choice.chosen].micro_batch
    decisions = [
        Decision(
            "training.per_device_train_batch_size",
            micro,
            f"the micro-batch each rank's memory was sized for ({choice.chosen}, batch_size={training.batch_size})",
            (Rejected(TRAINER_DEFAULT_BATCH, "TrainingArguments' default: not what the ranks were sized for"),),
        )
    ]
    # Each engine's own settings follow here (one function per engine).
    if choice.chosen.startswith("deepspeed-zero"):
        decisions.append(deepspeed_decision(choice.chosen))
    return tuple(decisions)
