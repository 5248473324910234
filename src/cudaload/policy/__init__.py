"""The pure policy: (machine facts, model facts, request) -> Plan.

No torch, no probing: every fact is an argument, so any machine can be planned for and
tests pass facts in. One module per decision; `make_plan` composes them.
"""

from __future__ import annotations

from typing import Any

from ..capability.facts import Machine
from ..model_facts import ModelFacts
from ..plans import Decision, Plan
from .attention import decide_attention
from .kernels import decide_use_kernels
from .placement import decide_placement
from .precision import BYTES_PER_PARAM, decide_dtype
from .request import Request

__all__ = ["Request", "make_plan"]


def make_plan(machine: Machine, model: ModelFacts, request: Request) -> Plan:
    warnings: list[str] = list(machine.warnings)
    dtype, dtype_warnings = decide_dtype(machine, model, request.dtype)
    warnings += dtype_warnings
    attention, chain = decide_attention(machine, model, dtype.value, request.attn_implementation)
    use_kernels = decide_use_kernels(machine, request.use_kernels)
    weight_bytes = model.weight_bytes(BYTES_PER_PARAM[dtype.value])
    placement, max_memory, placement_warnings = decide_placement(machine, weight_bytes, request.device_map)
    warnings += placement_warnings

    decisions = [dtype, attention, placement, use_kernels]
    kwargs: dict[str, Any] = {
        "dtype": dtype.value,
        "attn_implementation": attention.value,
    }
    if placement.value is not None:
        kwargs["device_map"] = placement.value
    if request.max_memory is not None:
        kwargs["max_memory"] = dict(request.max_memory)
        decisions.append(Decision("max_memory", kwargs["max_memory"], "your choice", source="user"))
    elif max_memory is not None:
        kwargs["max_memory"] = max_memory
        decisions.append(Decision("max_memory", max_memory, "per-device budget from detected free memory"))
    if use_kernels.value:
        kwargs["use_kernels"] = True
    for key, value in request.passthrough.items():
        kwargs[key] = value
        decisions.append(Decision(key, value, "passed to from_pretrained as given", source="user"))

    explicit = frozenset(d.setting for d in decisions if d.source == "user")
    return Plan(
        model=model.source,
        machine=machine.describe(),
        kwargs=kwargs,
        attention_chain=chain,
        decisions=tuple(decisions),
        warnings=tuple(warnings),
        explicit=explicit,
        extras={"weight_bytes": weight_bytes, "parameters": model.parameters, "model_class": model.model_class},
    )
