"""`apply_plan()`: apply a Plan through `from_pretrained`, fall back along its attention chain,
verify with a short forward, and record what was applied. Loaders never decide (`load()`, which plans
and then applies, is in facade.py), and import neither the planner nor the policy, nor any probe: what
applying needs to know of the machine and the installed transformers is in the plan (`Plan.apply_facts`).

One module per job: applied.py (what was applied: `AppliedPlan`, `Fallback`), apply.py (the fallback
loop), attribution.py (whose failure it is), verify.py (the test forward), weights.py (the loading report,
offloading), kwargs.py (the objects from_pretrained takes, the rank's device), hub_code.py (consent to Hub code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .applied import AppliedPlan, Fallback
from .apply import apply_plan
from .kwargs import from_pretrained_kwargs, set_rank_device

if TYPE_CHECKING:
    from .verify import input_device

__all__ = ["AppliedPlan", "Fallback", "apply_plan", "from_pretrained_kwargs", "input_device", "set_rank_device"]


def __getattr__(name: str) -> Any:
    """`input_device` from verify.py, imported when first asked for: a load whose test forward is proven imports
    none of the test forward's code."""
    if name == "input_device":
        from .verify import input_device

        return input_device
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
