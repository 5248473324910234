"""`CheckpointPlan`: what happens to an already-quantized checkpoint here, the record the policy's two
quantization steps share (policy/checkpoint_quantization.py decides it, policy/quantization.py and
parallelism.py read it). It lives below both, so neither imports the other for its type."""

from __future__ import annotations

from ..frozen import frozen
from .decision import Decision

__all__ = ["CheckpointPlan"]


@frozen
class CheckpointPlan:
    """What happens to an already-quantized checkpoint here.

    Attributes:
        decision: The "checkpoint_quantization" Decision.
        dequantized_to: The dtype transformers dequantizes the quantized weights to; None when they stay
            quantized.
        missing: Why from_pretrained would raise ImportError (a package the method needs); None if nothing.
        trainable: Its quantizer allows training (`HfQuantizer.is_trainable`).
        warnings: What to tell the user.
    """

    decision: Decision
    dequantized_to: str | None
    missing: str | None
    trainable: bool
    warnings: tuple[str, ...] = ()
