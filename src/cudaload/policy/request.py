"""What the caller asked for. `None` everywhere means "decide for me"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Request"]


@dataclass(frozen=True)
class Request:
    attn_implementation: str | None = None
    dtype: str | None = None
    device_map: Any = None
    max_memory: Mapping[Any, Any] | None = None
    use_kernels: bool | None = None
    quantize: str | None = None
    """None (no quantization), "4bit", "8bit" or "auto" (fine-tuning only)."""
    training: bool = False
    lora: Mapping[str, Any] | None = None
    """LoraConfig keyword overrides (fine-tuning only)."""
    gradient_checkpointing: bool = True
    seq_len: int = 2048
    """Sequence length and batch the training-memory estimate assumes."""
    batch_size: int = 1
    passthrough: Mapping[str, Any] = field(default_factory=dict)
    """Other from_pretrained kwargs the caller gave: passed on untouched."""
