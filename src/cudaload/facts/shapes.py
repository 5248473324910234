"""Model facts of published Llama shapes (no weights, no config download), for tables that plan models
nobody here can load: docs/distributed.md's parallelism table and its tests.

Sizes from the models' config.json on the Hub: Llama-2-7B (hidden 4096, 32 layers, MLP 11008, 32 heads,
no GQA, vocabulary 32000), Llama-3-70B (8192, 80, 28672, 64 heads / 8 key-value, 128256) and
Llama-3.1-405B (16384, 126, 53248, 128 heads / 8 key-value, 128256); untied embeddings.
"""

from __future__ import annotations

from dataclasses import replace

from .model import ModelFacts, any_model

__all__ = ["LLAMA_SHAPES", "llama_shape"]


def llama_shape(
    name: str, *, hidden: int, layers: int, inter: int, vocab: int, heads: int, kv_heads: int
) -> ModelFacts:
    """A Llama-architecture model of this shape (bf16, untied embeddings, transformers' tp_plan)."""
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    shapes = (
        ("down_proj", inter, hidden, layers),
        ("gate_proj", hidden, inter, layers),
        ("k_proj", hidden, kv, layers),
        ("o_proj", hidden, hidden, layers),
        ("q_proj", hidden, hidden, layers),
        ("up_proj", hidden, inter, layers),
        ("v_proj", hidden, kv, layers),
    )
    linear = sum(i * o * n for _, i, o, n in shapes)
    norms = (2 * layers + 1) * hidden
    return replace(
        any_model(),
        source=name,
        model_class="LlamaForCausalLM",
        parameters=linear + 2 * vocab * hidden + norms,
        head_dim=head_dim,
        num_layers=layers,
        hidden_size=hidden,
        vocab_size=vocab,
        linear_names=tuple(n for n, *_ in shapes),
        linear_shapes=shapes,
        attention_heads=heads,
        kv_heads=kv_heads,
        tp_plan=True,
    )


LLAMA_SHAPES: dict[str, ModelFacts] = {
    "7B": llama_shape("Llama-2-7B shape", hidden=4096, layers=32, inter=11008, vocab=32000, heads=32, kv_heads=32),
    "70B": llama_shape("Llama-3-70B shape", hidden=8192, layers=80, inter=28672, vocab=128256, heads=64, kv_heads=8),
    "405B": llama_shape(
        "Llama-3.1-405B shape", hidden=16384, layers=126, inter=53248, vocab=128256, heads=128, kv_heads=8
    ),
}
