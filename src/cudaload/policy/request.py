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
    passthrough: Mapping[str, Any] = field(default_factory=dict)
    """Other from_pretrained kwargs the caller gave: passed on untouched."""
