"""`apply_facts()`: what applying a plan needs to know of this process, read here so that apply never probes."""

from __future__ import annotations

from ..facts.machine import Machine
from ..plans import ApplyFacts, Plan

__all__ = ["apply_facts"]


def apply_facts(result: Plan, detected: Machine | None) -> ApplyFacts:
    """The facts `apply_plan()` and `load_for_finetune()` take from the plan instead of probing: this machine
    and its cached Hub kernels when the plan was made for it (`detected`, None for a machine the caller
    passed), and the installed transformers' API for what the plan uses (tensor parallelism, checkpointing),
    read only when the plan uses it."""
    tensor_parallel = checkpointing = None
    if "tp_plan" in result.kwargs:
        from ..capability.transformers_api import tensor_parallel_argument

        tensor_parallel = tensor_parallel_argument()
    if result.finetune is not None and result.finetune.gradient_checkpointing:
        from ..capability.transformers_api import checkpointing_method

        checkpointing = checkpointing_method()
    if detected is None:
        return ApplyFacts(tensor_parallel_argument=tensor_parallel, checkpointing_method=checkpointing)
    return ApplyFacts(
        machine_here=detected.usable().describe(),
        cached_kernels=frozenset(kernel.repo for kernel in detected.hub.kernels if kernel.cached),
        tensor_parallel_argument=tensor_parallel,
        checkpointing_method=checkpointing,
    )
