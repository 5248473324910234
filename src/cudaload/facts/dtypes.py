"""The floating-point dtypes cudaload plans with: their names, spellings and sizes. Data only."""

from __future__ import annotations

__all__ = ["BYTES", "DTYPES", "canonical_dtype"]

DTYPES = ("float32", "bfloat16", "float16")
"""Every dtype cudaload plans, probes and benchmarks."""

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each dtype."""

_SPELLINGS = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def canonical_dtype(value: object) -> str | None:
    """The dtype's name ("bfloat16" for torch.bfloat16, "bf16", ...), or None when `value` names
    no dtype cudaload plans with (e.g. "auto", "int8")."""
    return _SPELLINGS.get(str(value).removeprefix("torch."))
