"""The sizing inputs of a training job (`TrainingShape`, policy/rank_sizing.py) from the model's facts: the
decoder layers, the largest layer DeepSpeed gathers, FSDP2's tail unit, and for full training the activations."""

from __future__ import annotations

from ..facts.dtypes import BYTES
from ..facts.model import ModelFacts
from .memory import logits_bytes_per_element
from .rank_sizing import TrainingShape

__all__ = ["full_training_shape", "training_shape"]


def training_shape(
    model: ModelFacts,
    *,
    dtype: str,
    weight_bytes: int,
    trained: int,
    full: bool,
    activations_per_sample: int,
    tokens: int,
    checkpointing: bool,
    lora_bytes: int | None = None,
    quantized: bool = False,
) -> TrainingShape:
    """The sizing inputs from the model's facts and the plan's numbers."""
    layers = model.num_layers or 1
    hidden = model.hidden_size or 0
    vocab = model.vocab_size or 0
    embeddings = vocab * hidden * 2  # input embeddings and lm_head (counted apart if untied)
    per_layer = max((model.parameters - embeddings) // layers, model.parameters // (2 * layers))
    scale = weight_bytes / max(model.parameters, 1)  # bytes per weight as loaded (quantized or not)
    # DeepSpeed's largest layer (runtime/zero/stage3.py: model_to_params): one module's own parameters, the
    # embeddings (vocab x hidden) or the widest projection.
    largest = max([vocab * hidden, *(fan_in * fan_out for _, fan_in, fan_out, _ in model.linear_shapes)])
    return TrainingShape(
        parameters=model.parameters,
        weight_bytes=weight_bytes,
        trained=trained,
        full=full,
        dtype_bytes=BYTES[dtype],
        layers=layers,
        layer_bytes=int(per_layer * scale),
        activations_per_sample=activations_per_sample,
        tokens_per_sample=tokens,
        checkpointing=checkpointing,
        lora_bytes=lora_bytes,
        largest_module=largest,
        # FSDP2's tail unit, gathered in the compute dtype (lm_head is never quantized): lm_head + the final norm.
        tail_bytes=(vocab * hidden + hidden) * BYTES[dtype] if vocab and hidden else None,
        quantized=quantized,
    )


def full_training_shape(model: ModelFacts, *, dtype: str, seq_len: int, checkpointing: bool) -> TrainingShape:
    """Full training (every weight trained, loaded in `dtype`) of `model`: activations per sequence from
    Korthikanti et al. 2022 (34·h bytes a token and layer in 16 bit, without the attention-scores term that
    fused attention never stores), each layer's input kept under checkpointing, and the loss's logits."""
    hidden, layers, d = model.hidden_size or 0, model.num_layers or 1, BYTES[dtype]
    layer = 17 * hidden * d * seq_len
    logits = logits_bytes_per_element(dtype) * seq_len * (model.vocab_size or 0)
    kept = layers * seq_len * hidden * d
    activations = kept + max(layer, logits) if checkpointing else layers * layer + logits
    return training_shape(
        model,
        dtype=dtype,
        weight_bytes=model.parameters * d,
        trained=model.parameters,
        full=True,
        activations_per_sample=activations,
        tokens=seq_len,
        checkpointing=checkpointing,
    )
