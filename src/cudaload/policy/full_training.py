"""Full fine-tuning (`train="full"`): the `train` decision, the quantization it plans (none) and its
training-memory estimate; LoRA's are in training.py and quantization.py."""

from __future__ import annotations

from ..errors import SettingError
from ..facts.dtypes import BYTES
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
from ..plans.checkpoint import CheckpointPlan
from ..request import TrainingRequest
from .memory import TrainingMemory, estimate_full_training_memory

__all__ = ["decide_train", "full_training_estimate", "full_training_quantize"]


def decide_train(training: TrainingRequest, dtype: str) -> Decision:
    """LoRA (the default) or full training, as asked; the reason says what each trains and holds."""
    if training.train == "full":
        d = BYTES[dtype]
        return Decision(
            "train",
            "full",
            f"your choice: every weight trained in {dtype}, no adapters; each holds its gradient and AdamW's two "
            f"moments in {dtype} ({d} + {d} + {2 * d} = {4 * d} bytes a weight, torch's AdamW keeps its state in "
            "the weight's dtype)",
            (Rejected("lora", "you asked for every weight to be trained"),),
            source="user",
        )
    return Decision(
        "train",
        "lora",
        "LoRA adapters on a frozen base: only the adapters take gradients and optimizer state",
        (Rejected("full", "not asked: pass train='full' (--train full) to train every weight"),),
    )


def full_training_quantize(training: TrainingRequest, checkpoint: CheckpointPlan | None, source: str) -> Decision:
    """No quantization: a quantized weight takes no gradient (planner/arguments.py refused quantize="4bit"/"8bit"
    with train="full"); a checkpoint that is quantized as stored and kept so is refused here."""
    if checkpoint is not None and checkpoint.dequantized_to is None:
        raise SettingError(
            f"train='full' for {source}, whose checkpoint is quantized and stays quantized here: a quantized weight "
            "cannot be trained. Fine-tune it with train='lora' (adapters on the quantized base), or load a 16-bit "
            "checkpoint of the model."
        )
    return Decision(
        "quantize",
        None,
        "full training updates every weight, and a quantized weight takes no gradient",
        tuple(Rejected(method, "a quantized base cannot be fully trained") for method in ("4bit", "8bit")),
        source="user" if training.quantize is None else "auto",
    )


def full_training_estimate(
    machine: Machine, model: ModelFacts, training: TrainingRequest, dtype: str, dequantized_to: str | None
) -> dict[str | None, TrainingMemory]:
    """The estimates a full-training plan weighs: its one option, unquantized (keyed None, as LoRA's 16-bit)."""
    estimate = estimate_full_training_memory(
        model,
        dtype=dtype,
        seq_len=training.seq_len,
        batch=training.batch_size,
        checkpointing=training.gradient_checkpointing,
        on_gpu=bool(machine.gpus),
        dequantized_to=dequantized_to,
    )
    return {None: estimate}
