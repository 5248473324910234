"""Model facts of real shapes for policy tests (no weights, no config download)."""

from __future__ import annotations

from dataclasses import replace

from cudaload.facts.model import ModelFacts, any_model

PROJ = ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")


def tiny(model: ModelFacts, **changes: object) -> ModelFacts:
    """`model` shrunk to a tiny one (2 layers of width 64, 100k parameters): its matmuls take milliseconds,
    so a measured dtype lead is worth less than choosing is."""
    return replace(
        model,
        parameters=100_000,
        hidden_size=64,
        num_layers=2,
        vocab_size=256,
        linear_shapes=(("down_proj", 128, 64, 2), ("gate_proj", 64, 128, 2), ("up_proj", 64, 128, 2)),
        **changes,
    )


def llama(billions: float = 8, *, vocab: int = 128256, inter: int = 14336, kv: int = 1024) -> ModelFacts:
    """A Llama-shaped model (8B: hidden 4096, 32 layers, GQA 8 kv heads, MLP 14336, vocab 128256)."""
    layers = max(1, round(32 * billions / 8.0))
    shapes = (
        ("q_proj", 4096, 4096, layers),
        ("k_proj", 4096, kv, layers),
        ("v_proj", 4096, kv, layers),
        ("o_proj", 4096, 4096, layers),
        ("gate_proj", 4096, inter, layers),
        ("up_proj", 4096, inter, layers),
        ("down_proj", inter, 4096, layers),
    )
    linear = sum(i * o * n for _, i, o, n in shapes)
    return replace(
        any_model(),
        source=f"llama-{billions}b",
        model_class="LlamaForCausalLM",
        parameters=linear + 2 * vocab * 4096,
        checkpoint_dtype="bfloat16",
        head_dim=128,
        num_layers=layers,
        hidden_size=4096,
        linear_names=PROJ,
        linear_shapes=shapes,
        vocab_size=vocab,
    )
