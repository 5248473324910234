"""Training-memory estimates: weights + LoRA (weights, grads, Adam states) + activations.

Rough by design, and said so: the aim is "does bf16 LoRA fit, or do we need 4-bit?", not a
byte-exact forecast. Activations follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation"): with full gradient checkpointing each layer keeps its input (2·s·b·h bytes
in 16-bit) and one layer at a time is recomputed (~34·s·b·h bytes, without the s² term that
fused/flash attention avoids); the fp32 logits for the loss add 4·s·b·vocab (often the
largest single tensor for small models with big vocabularies).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model_facts import ModelFacts

__all__ = ["TrainingMemory", "estimate_training_memory", "lora_parameters", "weight_bytes"]

CUDA_OVERHEAD = 1 << 30  # CUDA context + allocator slack
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def weight_bytes(model: ModelFacts, dtype: str, quantize: str | None) -> int:
    """Bytes of the base weights: linear layers at 4 or 8 bits when quantized, the rest in dtype."""
    if quantize is None:
        return model.parameters * BYTES[dtype]
    linear = model.linear_parameters
    rest = model.parameters - linear
    # nf4 with double quantization: 4 bits + ~0.127 bits of scales per weight (QLoRA paper).
    bits = 4.127 if quantize == "4bit" else 8.0 + 32 / 64  # int8 + per-row fp32 scale, approx
    return int(linear * bits / 8) + rest * BYTES[dtype]


def lora_parameters(model: ModelFacts, r: int, targets: tuple[str, ...]) -> int:
    return sum(
        r * (fan_in + fan_out) * count for name, fan_in, fan_out, count in model.linear_shapes if name in targets
    )


@dataclass(frozen=True)
class TrainingMemory:
    weights: int
    lora: int
    """LoRA weights, gradients and AdamW states, all fp32: 16 bytes per parameter."""
    activations: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.lora + self.activations + self.overhead

    def as_dict(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "lora": self.lora,
            "activations": self.activations,
            "overhead": self.overhead,
            "total": self.total,
        }


def estimate_training_memory(
    model: ModelFacts,
    *,
    dtype: str,
    quantize: str | None,
    r: int,
    targets: tuple[str, ...],
    seq_len: int = 2048,
    batch: int = 1,
    checkpointing: bool = True,
    on_gpu: bool = True,
) -> TrainingMemory:
    hidden = model.hidden_size or 0
    layers = model.num_layers or 0
    act_bytes = BYTES[dtype]
    tokens = seq_len * batch
    per_layer_full = 34 * tokens * hidden * act_bytes // 2
    # Checkpointing keeps each layer's input and recomputes one layer at a time.
    kept = layers * tokens * hidden * act_bytes + per_layer_full
    activations = kept if checkpointing else layers * per_layer_full
    activations += 4 * tokens * (model.vocab_size or 0)
    return TrainingMemory(
        weights=weight_bytes(model, dtype, quantize),
        lora=16 * lora_parameters(model, r, targets),
        activations=activations,
        overhead=CUDA_OVERHEAD if on_gpu else 0,
    )
