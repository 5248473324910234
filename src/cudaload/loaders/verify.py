"""The test forward after loading: 8 token ids through the model, and whether its logits are finite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import describe_error

__all__ = ["NON_FINITE", "input_device"]


def input_device(model: Any) -> Any:
    """Where inputs go: the first device of a dispatched model (accelerate's hooks move the
    rest; "cpu"/"disk" entries mean CPU), else the model's device."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        first = next(iter(device_map.values()))
        if isinstance(first, int):
            return f"cuda:{first}"
        return "cpu" if str(first) in ("cpu", "disk") else str(first)
    return model.device


NON_FINITE = "the test forward gave non-finite logits"

_Phase = Literal["load", "verify", "switch"]


@dataclass(frozen=True)
class _Failure:
    """One attention option's failed attempt: the phase (as in `Fallback.phase`), the problem in one
    line, and what was raised (None when nothing was: non-finite logits)."""

    phase: _Phase
    problem: str
    error: BaseException | None = None


@dataclass(frozen=True)
class _Verification:
    """What the test forward found: "passed" (finite logits), "skipped" (the model takes no token
    ids or returns no logits) or "failed" (`problem`; `error` is what it raised, None for
    non-finite logits)."""

    status: Literal["passed", "skipped", "failed"]
    problem: str = ""
    error: BaseException | None = None

    @property
    def verified(self) -> bool | None:
        """`AppliedPlan.verified`: True when passed, None when skipped, False when failed."""
        return {"passed": True, "skipped": None}.get(self.status, False)

    @property
    def failure(self) -> _Failure | None:
        """The failure to attribute when the forward failed (phase "verify"), else None."""
        return _Failure("verify", self.problem, self.error) if self.status == "failed" else None


_PASSED = _Verification("passed")
_SKIPPED = _Verification("skipped")


def _verify(model: Any, training: bool) -> _Verification:
    """A short forward of 8 token ids, and whether its logits are finite.

    For a model about to be trained the forward runs in train mode under no_grad: an
    eval-mode inference forward lets bitsandbytes (0.50, AVX512-BF16 CPUs) repack 4-bit
    weights into an inference-only layout with no backward, after which no gradient flows
    through the base layers (found here: layer-0 LoRA gradients were all zero).
    """
    import torch

    vocab = int(getattr(model.config.get_text_config(), "vocab_size", 0) or 0)
    if vocab < 8:
        return _SKIPPED
    ids = (torch.arange(1, 9).unsqueeze(0) % vocab).to(input_device(model))
    model.train(training)
    try:
        with torch.no_grad() if training else torch.inference_mode():
            out = model(input_ids=ids)
    except Exception as exc:  # any failure in the forward is a verification failure
        return _Verification("failed", describe_error(exc), exc)
    logits = getattr(out, "logits", None)
    if logits is None:
        return _SKIPPED
    if not torch.isfinite(logits).all():
        return _Verification("failed", NON_FINITE)
    return _PASSED
