"""tp_plan: tensor parallelism for an inference load under a multi-process launch, or data parallel."""

from __future__ import annotations

from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
from .fit import HEADROOM, format_bytes, judge_fit
from .placement import weights_phrase

__all__ = ["decide_tensor_parallel"]


def decide_tensor_parallel(
    machine: Machine, model: ModelFacts, weight_bytes: int, training: bool, requested: bool
) -> Decision | None:
    """`tp_plan="auto"` or not, for an inference load under a multi-process launch with several GPUs;
    None where tensor parallelism is not a question (one process, training, no GPUs, FSDP/ZeRO-3, or
    the caller chose a device_map or tp_plan).

    TP splits every layer's heads and MLP across the ranks and all-reduces twice per layer, so it is
    for a model that does not fit one GPU, on GPUs of one node (NVLink/PCIe, not the network).
    """
    launch = machine.launch
    if requested or training or not launch.distributed or launch.shards_parameters or len(machine.gpus) < 2:
        return None
    world = launch.world_size
    # Judged per rank (fit.py): every rank holds a copy or a shard on its own GPU, the smallest counts.
    budget = judge_fit(machine, weight_bytes, HEADROOM).budget
    size = weights_phrase(weight_bytes)
    if weight_bytes <= budget:
        return Decision(
            "tp_plan",
            None,
            f"{size} fit one GPU: each rank holds a whole copy (data parallel), no per-layer all-reduce",
            (Rejected("auto", "TP pays two all-reduces per layer; only worth it when a model does not fit one GPU"),),
        )
    data_parallel = Rejected({"": launch.local_rank}, f"{size} exceed one GPU ({format_bytes(budget)} usable)")
    why_not = _why_not_tensor_parallel(machine, model, weight_bytes, budget)
    if why_not is None:
        return Decision(
            "tp_plan",
            "auto",
            f"{size} exceed one GPU ({format_bytes(budget)} usable) but a 1/{world} shard fits: {model.model_class}'s "
            f"base_model_tp_plan splits its {model.attention_heads} heads ({model.kv_heads} key/value) across the "
            f"{world} ranks, each on its GPU (cuda:LOCAL_RANK)",
            (data_parallel, Rejected("auto (device_map)", "one rank at a time computes: the other GPUs wait")),
        )
    return Decision(
        "tp_plan",
        None,
        f"not tensor parallel: {why_not}",
        (Rejected("auto", why_not), data_parallel),
    )


def _why_not_tensor_parallel(machine: Machine, model: ModelFacts, weight_bytes: int, budget: int) -> str | None:
    """What rules out sharding a model too big for one GPU across this launch's ranks (None: nothing)."""
    launch = machine.launch
    world = launch.world_size
    heads, kv = model.attention_heads, model.kv_heads
    if not model.tp_plan:
        return f"{model.model_class} has no base_model_tp_plan in its config: transformers cannot shard it"
    if heads is None or kv is None or heads % world or kv % world:
        return (
            f"{heads} attention heads and {kv} key/value heads do not both divide WORLD_SIZE={world}: TP splits "
            "whole heads across ranks"
        )
    if launch.local_world_size != world:
        return (
            f"the {world} ranks span {world // max(launch.local_world_size, 1)} nodes: TP all-reduces every layer, "
            "which the network between nodes makes slow"
        )
    if len(machine.gpus) < launch.local_world_size:
        return (
            f"this process sees {len(machine.gpus)} GPUs for {launch.local_world_size} local ranks: TP puts rank r "
            "on cuda:LOCAL_RANK"
        )
    if weight_bytes / world > budget:
        shard = format_bytes(weight_bytes / world)
        return f"a 1/{world} shard (~{shard}) still exceeds one GPU ({format_bytes(budget)} usable)"
    return None
