"""The README's main job: build a tiny Qwen3-shaped model locally, plan it for this machine,
print the plan. Nothing is downloaded (the weights are random)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_tiny_model", "run_demo"]


def build_tiny_model(directory: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Save a ~1M-parameter Qwen3 causal LM (random weights) to `directory`, if not there yet."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = Path(directory)
    if (path / "config.json").exists():
        return path
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))  # type: ignore[no-untyped-call]
    model.save_pretrained(path)
    return path


def run_demo(directory: str | Path) -> str:
    from .planner import plan

    path = build_tiny_model(directory)
    return plan(str(path)).explain()
