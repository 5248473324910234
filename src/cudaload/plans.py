"""The Plan: the single contract between the policy (which decides) and the loaders (which apply).

A Plan holds the exact `from_pretrained` keyword arguments (JSON-ready: dtypes as strings,
quantization as the BitsAndBytesConfig keyword arguments), the attention fallback chain,
and one Decision per setting: its value, why, and what was rejected and why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .generation import GenerationPlan

__all__ = ["Decision", "Plan", "Rejected"]


@dataclass(frozen=True)
class Rejected:
    value: Any
    reason: str


@dataclass(frozen=True)
class Decision:
    setting: str
    value: Any
    reason: str
    rejected: tuple[Rejected, ...] = ()
    source: str = "auto"
    """"auto" when cudaload decided, "user" when the caller set it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "value": jsonable(self.value),
            "reason": self.reason,
            "source": self.source,
            "rejected": [{"value": jsonable(r.value), "reason": r.reason} for r in self.rejected],
        }


def jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(jsonable(v) for v in value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


VALUE_WIDTH = 36  # fits "kernels-community/vllm-flash-attn3"


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(jsonable(value))
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class Plan:
    model: str
    machine: str
    """One line describing the machine planned for."""
    kwargs: Mapping[str, Any]
    """The `from_pretrained` keyword arguments, JSON-ready."""
    attention_chain: tuple[str, ...]
    """Attention implementations to try in order; the first is the choice."""
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...] = ()
    explicit: frozenset[str] = frozenset()
    """Settings the caller set: they never fall back."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Plan facts that are not from_pretrained kwargs (fine-tuning settings, estimates)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent planning on measurements: "probe" when the CPU dtype probe ran (not cached)."""
    generation: GenerationPlan | None = None
    """Generation settings (KV cache, batch x context that fits, cache implementation, compile,
    padding side), each a Decision; None for plans that do not generate (fine-tuning, encoders)."""

    def decision(self, setting: str) -> Decision:
        for d in self.decisions:
            if d.setting == setting:
                return d
        raise KeyError(setting)

    @property
    def attn_implementation(self) -> str:
        return str(self.kwargs["attn_implementation"])

    @property
    def dtype(self) -> str:
        return str(self.kwargs["dtype"])

    def with_attention(self, implementation: str) -> Plan:
        """This plan with another attention implementation (used when falling back)."""
        return replace(self, kwargs={**self.kwargs, "attn_implementation": implementation})

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The kwargs as objects transformers takes (a BitsAndBytesConfig for quantization)."""
        kwargs = dict(self.kwargs)
        quant = kwargs.get("quantization_config")
        if isinstance(quant, Mapping):
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(**quant)  # type: ignore[no-untyped-call]
        if "tp_plan" in kwargs and "distributed_config" not in kwargs and "tp_size" not in kwargs:
            # transformers >= 5.1x takes TP through DistributedConfig (a bare tp_plan= warns FutureWarning).
            try:
                from transformers.distributed import DistributedConfig  # type: ignore[attr-defined]
            except ImportError:  # older 5.x: tp_plan= is the API
                return kwargs
            kwargs["distributed_config"] = DistributedConfig(tp_plan=kwargs.pop("tp_plan"))
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "machine": self.machine,
            "kwargs": jsonable(self.kwargs),
            "attention_chain": list(self.attention_chain),
            "decisions": [d.to_dict() for d in self.decisions],
            "warnings": list(self.warnings),
            "extras": jsonable(self.extras),
            "timings": dict(self.timings),
            "generation": self.generation.to_dict() if self.generation is not None else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def explain(self) -> str:
        """A short table: one line per setting with its reason, rejected options indented below."""
        lines = [f"cudaload plan for {self.model} on {self.machine}"]
        width = max(len(d.setting) for d in self.decisions) if self.decisions else 10
        for d in self.decisions:
            lines.append(f"  {d.setting:<{width}}  {_short(d.value, VALUE_WIDTH):<{VALUE_WIDTH}}  {d.reason}")
            for r in d.rejected:
                rejected = _short(r.value, VALUE_WIDTH - 2)
                lines.append(f"  {'':<{width}}  x {rejected:<{VALUE_WIDTH - 2}}  {r.reason}")
        estimate = self.extras.get("memory_estimate")
        if estimate:
            assumes = estimate["assumes"]
            lines.append(
                f"  training memory estimate (seq_len {assumes['seq_len']}, batch {assumes['batch_size']}, "
                f"checkpointing {'on' if assumes['gradient_checkpointing'] else 'off'}):"
            )
            for option, parts in estimate.items():
                if option != "assumes":
                    detail = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts.items() if k != "total")
                    lines.append(f"    {option:<5} LoRA  {parts['total'] / 2**30:7.2f} GiB  ({detail})")
        if len(self.attention_chain) > 1:
            lines.append(f"  attention fallback chain: {' -> '.join(self.attention_chain)}")
        if self.generation is not None:
            lines += self.generation.explain_lines(VALUE_WIDTH)
        for warning in self.warnings:
            lines.append(f"  WARNING: {warning}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()
