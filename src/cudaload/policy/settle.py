"""The placement step of the policy: compose a plan, place it, judge it again where it landed.

dtype, attention and the training flags are judged for the GPUs the weights go on (current_device.py), but
where they go depends on the bytes to place, which depend on the dtype: on GPUs of different compute
capability the two decide each other. `settle_placement` is the one place that resolves it, a bounded
iteration to a fixed point. Each round composes a plan judged on some GPUs, places it (the GPU its
device_map pins; for a spread, where transformers' own device_map="auto" puts it, asked of the `Placer`
fact provider, facts/placer.py) and compares: landed on the GPUs it was judged on, it is settled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..facts.placer import Landing, Placer
from ..frozen import frozen
from ..plans import Plan
from ..request import Request
from .current_device import landed_machine, placed_machine
from .placement import judge_upstream_placement

__all__ = ["PLACEMENT_ROUNDS", "settle_placement"]

PLACEMENT_ROUNDS = 3
"""At most three plans are composed (and the placer asked three times): the first guess (the GPU a 16-bit
copy fits, or the one your device_map pins), every GPU (a plan judged on every GPU it may touch is always
valid: the weakest decides), and the GPUs that plan landed on. A fourth would chase a placement that moves
with the dtype judged for it (a dtype judged on one GPU puts the weights on another); the plan judged on
every GPU is kept instead, and its device_map reason says so."""


@frozen
class _Round:
    """One composed plan, with the GPUs its dtype and attention were judged on and those its weights land on."""

    plan: Plan
    judged: Machine  # the GPUs dtype and attention were judged on
    landed: Machine  # the GPUs its weights land on
    landing: Landing | None  # upstream's bytes per device, when the placer was asked and answered


def settle_placement(
    machine: Machine,
    model: ModelFacts,
    request: Request,
    compose: Callable[[Machine], Plan],
    placer: Placer | None = None,
) -> Plan:
    """The plan `compose` makes for the GPUs its weights land on, found in at most `PLACEMENT_ROUNDS` rounds.

    `compose(judged)` is decide_plan's composition with dtype, attention and the training flags judged on
    `judged` (device_map and max_memory are always decided for the whole machine). Each round:

    1. compose a plan judged on the current guess (first: current_device.py `placed_machine`);
    2. place it: the GPU its device_map pins, or, for cudaload's unquantized spread (device_map "auto" with
       max_memory), the GPUs that hold weights where `placer(dtype, max_memory)` says transformers puts them
       (a spread of unknown landing may touch every GPU; current_device.py `landed_machine`);
    3. judge it again: landed exactly on the judged GPUs, it is settled. Landed on fewer, it is valid (every
       GPU it touches runs its dtype and attention) and the next round judges those GPUs; landed beyond them,
       it is not, and the next round judges every GPU.

    A round never judges the same GPUs twice. Unsettled after the bound (or with nothing new to judge), the
    last valid plan is kept and its device_map reason says where it was judged and where it landed. The
    kept plan is then judged against upstream's landing (placement.py `judge_upstream_placement`: CPU or
    disk offload the budgets missed). On uniform GPUs, and under a distributed launch, every GPU decides:
    one round. decide_plan adds only the generation sections after this step; nothing judges the Plan once
    it is returned.
    """
    judged = placed_machine(machine, model, request)
    tried: list[frozenset[int]] = []
    kept: _Round | None = None
    for _ in range(PLACEMENT_ROUNDS):
        plan = compose(judged)
        landing: Landing | None = None
        if placer is not None and _asks_upstream(plan):
            landing = placer(str(plan.kwargs["dtype"]), plan.kwargs["max_memory"])
        landed = landed_machine(machine, plan, landing)
        tried.append(_gpus(judged))
        if _gpus(landed) <= _gpus(judged):
            kept = _Round(plan, judged, landed, landing)
            if _gpus(landed) == _gpus(judged):
                break
            following = landed
        else:
            following = machine
        if _gpus(following) in tried:
            break
        judged = following
    # Round 1 is valid or round 2 judges every GPU (always valid): with PLACEMENT_ROUNDS >= 2 one is kept.
    assert kept is not None
    plan = kept.plan if kept.landing is None else judge_upstream_placement(kept.plan, kept.landing)
    if _gpus(kept.landed) != _gpus(kept.judged):
        plan = _unsettled(plan, kept)
    return plan


def _asks_upstream(plan: Plan) -> bool:
    """Whether transformers' own placement of `plan` is asked: cudaload's unquantized spread with max_memory.
    A quantizer sizes its own weights (and adjusts max_memory), which the meta model does not model."""
    kwargs = plan.kwargs
    return (
        kwargs.get("device_map") == "auto"
        and "max_memory" in kwargs
        and "quantization_config" not in kwargs
        and not any(d.setting == "checkpoint_quantization" for d in plan.decisions)
    )


def _gpus(machine: Machine) -> frozenset[int]:
    return frozenset(g.index for g in machine.gpus)


def _names(machine: Machine) -> str:
    return ", ".join(f"{g.name} (cuda:{g.index})" for g in machine.gpus)


def _unsettled(plan: Plan, kept: _Round) -> Plan:
    """The kept plan, its device_map reason saying it did not settle and on which GPUs it was judged."""
    placed = plan.decision("device_map")
    note = (
        f"; dtype and attention judged on {_names(kept.judged)} while the weights land on {_names(kept.landed)} "
        "alone: judged there, the plan moved elsewhere, so the placement did not settle "
        f"(at most {PLACEMENT_ROUNDS} rounds, policy/settle.py) and the GPUs judged cover every one it touches"
    )
    decisions = tuple(replace(d, reason=d.reason + note) if d is placed else d for d in plan.decisions)
    return replace(plan, decisions=decisions)
