"""`Placer`: where transformers' own `device_map="auto"` puts a model, as a fact the policy asks for.

Placement depends on the dtype the policy picks (the bytes to place), so this fact cannot be gathered
before the policy runs: the planner hands the policy a callable instead (built from
capability/upstream_placement.py, with the model's source, revision and trust bound), and the policy
calls it with the dtype and max_memory of the plan it composed (policy/settle.py). Simulated machines
and tests pass a fake, or None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["Landing", "Placer"]

Landing = Mapping[str, int]
"""Bytes of weights per device where transformers puts them: "0", "1", ... (GPU indices), "cpu", "disk"."""


class Placer(Protocol):
    """Where transformers' device_map="auto" puts the model in `dtype` under `max_memory` (accelerate's
    keys: GPU index, "cpu"), or None when it cannot tell (the plan then keeps its own estimate)."""

    def __call__(self, dtype: str, max_memory: Mapping[Any, Any]) -> Landing | None: ...
