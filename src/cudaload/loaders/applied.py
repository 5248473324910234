"""What `apply_plan()` records: the `AppliedPlan` read back from the loaded model, each `Fallback`, and the
`Failure` of an attempt it is made from (here, not in verify.py: a load whose test forward is proven imports none)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal

from ..frozen import frozen
from ..plans import Plan
from .check_record import FORCE_HINT

if TYPE_CHECKING:
    from ..plans import GenerationPlan

__all__ = ["AppliedPlan", "Failure", "Fallback", "Phase", "listed_keys"]


Phase = Literal["load", "verify", "switch"]


@frozen
class Failure:
    """One attention option's failed attempt: the phase (as in `Fallback.phase`), the problem in one
    line, and what was raised (None when nothing was: non-finite logits)."""

    phase: Phase
    problem: str
    error: BaseException | None = None


@frozen
class Fallback:
    """An attention option that failed while loading, and why (`AppliedPlan.fallbacks`).

    `load()` records one for each link of the plan's attention chain it had to leave before one
    worked; `explain()` shows them as "fell back from ...".

    Attributes:
        option: The attention implementation that failed (e.g. "flash_attention_2").
        phase: Where it failed: "load" (from_pretrained raised), "verify" (the test forward
            raised or gave non-finite logits) or "switch" (set_attn_implementation refused it on
            the loaded model).
        error: The error, as "ExceptionType: first line of its message".

    Examples:
        >>> import cudaload
        >>> fallback = cudaload.Fallback("flash_attention_2", "load", "ImportError: flash_attn is not installed")
        >>> fallback.phase
        'load'
    """

    option: str
    phase: str
    """"load" (from_pretrained raised), "verify" (the test forward raised or gave non-finite
    logits) or "switch" (set_attn_implementation refused it on the loaded model)."""
    error: str


@frozen
class AppliedPlan:
    """What `load()` actually applied, read back from the loaded model (`model.cudaload_plan`).

    Attributes:
        plan: The plan as applied: its kwargs carry the attention implementation that worked, and
            a failed link appears among the attention decision's rejections.
        attn_implementation: The attention implementation the loaded model uses.
        dtype: The dtype of the model's first floating parameter (e.g. "bfloat16").
        device: The model's device as torch reports it (e.g. "cpu", "cuda:0").
        device_map: accelerate's `hf_device_map` when the model was dispatched; None otherwise.
        fallbacks: The attention options that failed before this one, in order.
        offloaded: Modules `device_map="auto"` put on CPU or disk, as "module -> place".
        verified: True: a test forward gave finite logits (now, or under the same key before:
            `check_proven`); None: not run (verify=False, or the test forward was skipped: `verify_note`
            says why).
        verify_note: Why the test forward was skipped (no input cudaload can build for the model, or
            no logits to check); empty when it ran or verify=False.
        check_proven: When the test forward was not run again: "proven on this machine at <time> for
            <versions>" (a record of it passing under the same config, weights, kwargs, versions and
            machine; `verified` is then True). Empty when it ran, was skipped or verify=False.
        missing_weights: Weights the checkpoint lacked (or held in another shape), initialized at
            random; only ever non-empty with `allow_missing_weights=True` (else loading raises).
        unexpected_weights: Checkpoint weights the loaded class has no place for (e.g. a head when
            loading a base model); with the checkpoint's own class, loading raises instead.
        timings: Seconds per step: "plan", "probe" (when the CPU dtype probe ran), "load",
            "load[option]" for a failed option, "verify".
        warnings: The plan's warnings and any offload warning, each issued as a CudaloadWarning.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> applied = cudaload.load(path, dtype="float32", attn_implementation="sdpa").cudaload_plan
        >>> applied.attn_implementation, applied.dtype, applied.verified, applied.fallbacks
        ('sdpa', 'float32', True, ())
        >>> "applied:" in applied.explain()
        True
    """

    plan: Plan
    """The plan as applied: its kwargs carry the attention implementation that worked."""
    attn_implementation: str
    dtype: str
    device: str
    device_map: Mapping[str, Any] | None
    fallbacks: tuple[Fallback, ...] = ()
    offloaded: tuple[str, ...] = ()
    """Modules `device_map="auto"` put on CPU or disk."""
    verified: bool | None = None
    """True: a test forward gave finite logits; None: not run (verify=False, or skipped: `verify_note`)."""
    verify_note: str = ""
    """Why the test forward was skipped; empty when it ran or verify=False."""
    check_proven: str = ""
    """When the test forward was not run again: the record that proved it ("proven on this machine at ...")."""
    missing_weights: tuple[str, ...] = ()
    """Weights the checkpoint lacked, initialized at random (only with allow_missing_weights=True)."""
    unexpected_weights: tuple[str, ...] = ()
    """Checkpoint weights the model did not use (e.g. a head, when loaded as a base model)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def generation(self) -> GenerationPlan | None:
        """The generation settings as applied: the plan's section for the attention the loaded model
        really has (the policy decided one per link of the chain; a fallback selects another). None for
        models that do not generate."""
        return self.plan.generation

    def explain(self, width: int | None = None) -> str:
        """The plan's explanation, then what was applied: fallbacks, offloading, verification, timings.

        Args:
            width: Columns to fit, as `Plan.explain`'s (None: the terminal's, COLUMNS, else 100); each line of the
                `applied:` block wraps hanging 4 further in.
        """
        from ..plans.layout import terminal_width, wrap

        width = terminal_width(width)
        said = [f"attn_implementation={self.attn_implementation} dtype={self.dtype} device={self.device}"]
        said += [f"fell back from {fb.option} ({fb.phase}): {fb.error}" for fb in self.fallbacks]
        if self.offloaded:
            said.append(f"offloaded to CPU/disk: {', '.join(self.offloaded)}")
        if self.missing_weights:
            said.append(f"initialized at random (not in the checkpoint): {listed_keys(self.missing_weights)}")
        if self.unexpected_weights:
            said.append(f"checkpoint weights not used: {listed_keys(self.unexpected_weights)}")
        verdict = {True: "test forward gave finite logits", None: "not run"}.get(self.verified, "failed")
        if self.check_proven:
            said.append(f"verified: test forward not run again, {self.check_proven} ({FORCE_HINT})")
        else:
            said.append(f"verified: {verdict}" + (f" ({self.verify_note})" if self.verify_note else ""))
        said.append("timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()))
        lines = [self.plan.explain(width), "applied:", *(line for text in said for line in wrap(text, width, "  "))]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "attn_implementation": self.attn_implementation,
            "dtype": self.dtype,
            "device": self.device,
            "device_map": dict(self.device_map) if self.device_map else None,
            "fallbacks": [vars(f) for f in self.fallbacks],
            "offloaded": list(self.offloaded),
            "verified": self.verified,
            "verify_note": self.verify_note,
            "check_proven": self.check_proven,
            "missing_weights": list(self.missing_weights),
            "unexpected_weights": list(self.unexpected_weights),
            "timings": dict(self.timings),
            "warnings": list(self.warnings),
        }


def listed_keys(keys: tuple[str, ...], limit: int = 6) -> str:
    return ", ".join(keys[:limit]) + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")
