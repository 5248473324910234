"""The parallelism of a training job on `nodes` x `ranks_per_node`: DDP, FSDP2 (full or hybrid shard),
DeepSpeed ZeRO-2/3 (with CPU offload), or tensor parallel inside a node; sized by rank_sizing.py.

The rule, in order: DDP when a whole training state fits each GPU (the least communication: one gradient
all-reduce); else FSDP2 sharding, hybrid (shard inside a node, replicate across nodes) when its shard fits
and its step is not slower than full sharding over the network; else tensor parallel inside the node
(transformers' `base_model_tp_plan`) when sharding alone does not fit; else ZeRO-3 with its optimizer in
CPU RAM. You may ask for DeepSpeed (the cheapest ZeRO stage that fits) or for one strategy by name: it is
validated and kept, and refused with the numbers when it cannot fit.

The budget is each GPU's total memory (not its free memory), so a plan made before the launch and the
plans the launched ranks make agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PlacementError, SettingError
from ..facts.dtypes import BYTES
from ..facts.interconnect import ParallelLayout, gpu_link, gpu_tflops, interconnect
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
from ..plans.checkpoint import CheckpointPlan
from ..request import TrainingRequest
from .fit import TRAINING_SHARE, format_bytes
from .lora_targets import lora_leaves
from .memory import CUDA_OVERHEAD, TrainingMemory, logits_bytes_per_element, lora_parameters
from .rank_sizing import STRATEGIES, RankSize, TrainingShape, size_rank

__all__ = [
    "PARALLELISM_CHOICES",
    "SHARDS_WEIGHTS",
    "ParallelChoice",
    "decide_parallelism",
    "full_training_shape",
    "parallel_section",
    "planned_layout",
    "rank_budget",
    "sixteen_bit_when_sharded",
    "training_shape",
]

PARALLELISM_CHOICES = ("auto", "deepspeed", *STRATEGIES)
"""What `parallelism=` (`--parallelism`) accepts: "auto" (the default), "deepspeed" (its cheapest stage
that fits) or one strategy."""
MAX_MICRO_BATCH = 1024

_WHAT = {
    "ddp": "DDP: a whole copy per rank, gradients all-reduced",
    "fsdp": "FSDP2 full shard: weights, gradients and optimizer states split over every rank",
    "fsdp-hybrid": "FSDP2 hybrid shard: split inside a node, replicated across nodes",
    "deepspeed-zero2": "DeepSpeed ZeRO-2: gradients and optimizer states split, weights whole",
    "deepspeed-zero3": "DeepSpeed ZeRO-3: weights, gradients and optimizer states split",
    "deepspeed-zero3-offload": "DeepSpeed ZeRO-3 with the optimizer in CPU RAM",
    "tp+fsdp": "tensor parallel inside a node (tp_plan), FSDP2 across nodes",
}


@dataclass(frozen=True)
class ParallelChoice:
    """The decision's numbers: the layout, the per-rank budget and every strategy's size."""

    layout: ParallelLayout
    budget: int
    sizes: dict[str, RankSize]
    chosen: str | None

    def as_dict(self) -> dict[str, Any]:
        link = self.layout.interconnect
        return {
            "nodes": self.layout.nodes,
            "ranks_per_node": self.layout.ranks_per_node,
            "interconnect": link.name,
            "interconnect_assumed": not self.layout.interconnect_given,
            "budget_per_rank": self.budget,
            "strategy": self.chosen,
            "sizes": {name: size.as_dict() for name, size in self.sizes.items()},
        }


def training_shape(
    model: ModelFacts,
    *,
    dtype: str,
    weight_bytes: int,
    trained: int,
    full: bool,
    activations_per_sample: int,
    tokens: int,
    checkpointing: bool,
    lora_bytes: int | None = None,
) -> TrainingShape:
    """The sizing inputs from the model's facts and the plan's numbers."""
    layers = model.num_layers or 1
    hidden = model.hidden_size or 0
    embeddings = (model.vocab_size or 0) * hidden * 2  # input embeddings and lm_head (counted apart if untied)
    per_layer = max((model.parameters - embeddings) // layers, model.parameters // (2 * layers))
    scale = weight_bytes / max(model.parameters, 1)  # bytes per weight as loaded (quantized or not)
    return TrainingShape(
        parameters=model.parameters,
        weight_bytes=weight_bytes,
        trained=trained,
        full=full,
        dtype_bytes=BYTES[dtype],
        layers=layers,
        layer_bytes=int(per_layer * scale),
        activations_per_sample=activations_per_sample,
        tokens_per_sample=tokens,
        checkpointing=checkpointing,
        lora_bytes=lora_bytes,
    )


def full_training_shape(model: ModelFacts, *, dtype: str, seq_len: int, checkpointing: bool) -> TrainingShape:
    """Full training (every weight trained, mixed-precision AdamW) of `model`: activations per sequence from
    Korthikanti et al. 2022 (34·h bytes a token and layer in 16 bit, without the attention-scores term that
    fused attention never stores), each layer's input kept under checkpointing, and the loss's logits."""
    hidden, layers, d = model.hidden_size or 0, model.num_layers or 1, BYTES[dtype]
    layer = 17 * hidden * d * seq_len
    logits = logits_bytes_per_element(dtype) * seq_len * (model.vocab_size or 0)
    kept = layers * seq_len * hidden * d
    activations = kept + max(layer, logits) if checkpointing else layers * layer + logits
    return training_shape(
        model,
        dtype=dtype,
        weight_bytes=model.parameters * d,
        trained=model.parameters,
        full=True,
        activations_per_sample=activations,
        tokens=seq_len,
        checkpointing=checkpointing,
    )


SHARDS_WEIGHTS = frozenset({"fsdp", "fsdp-hybrid", "deepspeed-zero3", "deepspeed-zero3-offload", "tp+fsdp"})
"""Strategies that split the weights themselves: a 4-bit base must then be stored in the compute dtype."""


def planned_layout(machine: Machine, training: TrainingRequest) -> ParallelLayout | None:
    """The ranks a training plan is for: those of this launch (a rank plans the job it is in), else the
    `nodes` x `ranks_per_node` asked for; None for one process with no layout asked."""
    launch = machine.launch
    link = interconnect(training.interconnect)
    given = training.interconnect is not None
    if launch.distributed:
        local = max(launch.local_world_size, 1)
        if launch.world_size % local:
            raise PlacementError(
                f"This launch runs WORLD_SIZE={launch.world_size} processes, LOCAL_WORLD_SIZE={local} a node: not a "
                "whole number of nodes. Launch the same number of processes on every node."
            )
        nodes = launch.world_size // local
        # Explicit values are never replaced by the launch's: a difference is an error that names both.
        if training.nodes not in (None, nodes) or training.ranks_per_node not in (None, local):
            asked = f"nodes={training.nodes}, ranks_per_node={training.ranks_per_node}"
            raise PlacementError(
                f"{asked} asked, but this process runs in a launch of {nodes} node(s) x {local} ranks "
                f"(WORLD_SIZE={launch.world_size}, LOCAL_WORLD_SIZE={local}, from {launch.launcher}). Pass the "
                "launch's layout, or drop nodes/ranks_per_node to plan this launch's."
            )
        return ParallelLayout(nodes, local, link, given)
    if training.nodes is None and training.ranks_per_node is None:
        if given or training.parallelism != "auto":
            named = [f"{k}={v!r}" for k, v in (("interconnect", training.interconnect),) if v is not None]
            named += [] if training.parallelism == "auto" else [f"parallelism={training.parallelism!r}"]
            raise SettingError(
                f"{' and '.join(named)} describe{'s' if len(named) == 1 else ''} a job on several ranks, but no "
                "layout was given and this process is not one of a launch: pass nodes (--nodes) and/or "
                "ranks_per_node (--ranks-per-node), or drop it."
            )
        return None
    ranks = training.ranks_per_node or max(len(machine.gpus), 1)
    if machine.gpus and ranks > len(machine.gpus):
        raise PlacementError(
            f"ranks_per_node={ranks} on a node of {len(machine.gpus)} GPU(s): each rank needs a GPU of its own "
            f"(NCCL refuses two ranks of one communicator on one GPU). Pass ranks_per_node={len(machine.gpus)} or "
            "fewer, or plan for a machine with more GPUs."
        )
    return ParallelLayout(training.nodes or 1, ranks, link, given)


def rank_budget(machine: Machine, layout: ParallelLayout) -> int:
    """Bytes one rank may use: the smallest GPU's total memory x TRAINING_SHARE, or the CPU's RAM shared by
    the node's ranks."""
    gpu = machine.weakest_gpu
    if gpu is not None:
        return int(min(g.total_memory for g in machine.gpus) * TRAINING_SHARE)
    ram = machine.cpu.memory_available or machine.cpu.memory_total or 0
    return int(ram * TRAINING_SHARE / layout.ranks_per_node)


def decide_parallelism(
    machine: Machine, model: ModelFacts, layout: ParallelLayout, shape: TrainingShape, requested: str, batch: int
) -> tuple[Decision, ParallelChoice]:
    """The `parallelism` decision for `shape` on `layout`, with every strategy's numbers at `batch`."""
    if requested not in PARALLELISM_CHOICES:
        raise SettingError(
            f"parallelism={requested!r} is not a strategy cudaload plans. Pass one of {list(PARALLELISM_CHOICES)}."
        )
    gpu = machine.weakest_gpu
    link, link_what = gpu_link(gpu.name if gpu else None)
    tflops = gpu_tflops(gpu.name) if gpu else None
    overhead = CUDA_OVERHEAD if gpu is not None else 0
    budget = rank_budget(machine, layout)
    candidates = [s for s in STRATEGIES if _applies(s, model, layout) is None]
    sizes = {
        s: size_rank(s, shape, layout, micro_batch=batch, gpu_link=link, tflops=tflops, overhead=overhead)
        for s in candidates
    }
    fits = {s for s, size in sizes.items() if size.total <= budget}
    chosen, why = _choose(requested, fits, sizes, layout, model)
    choice = ParallelChoice(layout, budget, sizes, chosen)
    where = f"{layout.nodes} node{'s' if layout.nodes > 1 else ''} x {layout.ranks_per_node} ranks"
    net = layout.interconnect.label + ("" if layout.interconnect_given else " (assumed: pass --interconnect)")
    context = f"{where}, {format_bytes(budget)} usable per rank; between nodes {net}; inside a node {link_what}"
    rejected = tuple(
        Rejected(s, _rejection(s, sizes, budget, chosen, model, layout)) for s in STRATEGIES if s != chosen
    )
    if chosen is None:
        return Decision("parallelism", None, f"nothing fits: {why}; {context}", rejected), choice
    size = sizes[chosen]
    reason = (
        f"{_WHAT[chosen]}; {why}: {_numbers(size, budget)}, largest micro-batch "
        f"{largest_micro_batch(chosen, shape, layout, budget, link, tflops, overhead)}; {context}"
    )
    return Decision("parallelism", chosen, reason, rejected, source="user" if requested != "auto" else "auto"), choice


def largest_micro_batch(
    strategy: str,
    shape: TrainingShape,
    layout: ParallelLayout,
    budget: int,
    link: float,
    tflops: float | None,
    over: int,
) -> int:
    """The most sequences per rank that fit `budget` (activations grow linearly with the micro-batch)."""
    one = size_rank(strategy, shape, layout, micro_batch=1, gpu_link=link, tflops=tflops, overhead=over)
    per = max(one.activations, 1)
    room = budget - (one.total - one.activations)
    return max(0, min(MAX_MICRO_BATCH, room // per))


def _applies(strategy: str, model: ModelFacts, layout: ParallelLayout) -> str | None:
    """Why `strategy` is not an option for this model and layout (None: it is)."""
    if strategy == "fsdp-hybrid" and layout.nodes == 1:
        return "one node: hybrid shard is full shard"
    if strategy == "tp+fsdp":
        heads, kv, local = model.attention_heads, model.kv_heads, layout.ranks_per_node
        if not model.tp_plan:
            return f"{model.model_class} has no base_model_tp_plan: transformers cannot shard its layers"
        if heads is None or kv is None or heads % local or kv % local or local == 1:
            return f"{heads} heads / {kv} key-value heads do not split over {local} ranks of a node"
    return None


def _choose(
    requested: str, fits: set[str], sizes: dict[str, RankSize], layout: ParallelLayout, model: ModelFacts
) -> tuple[str | None, str]:
    if requested == "deepspeed":
        stage = next((s for s in STRATEGIES if s.startswith("deepspeed") and s in fits), None)
        if stage is None:
            _refuse(requested, sizes, "deepspeed-zero3-offload")
        return stage, "you asked for DeepSpeed: its cheapest ZeRO stage that fits"
    if requested != "auto":
        if requested not in sizes:
            raise PlacementError(
                f"parallelism={requested!r} was asked, but {_applies(requested, model, layout)}. Pass 'auto' or "
                "another strategy."
            )
        if requested not in fits:
            _refuse(requested, sizes, requested)
        return requested, "your choice"
    if "ddp" in fits:
        return "ddp", "a whole training state fits each rank"
    sharded = [s for s in ("fsdp-hybrid", "fsdp") if s in fits]
    if sharded:
        best = min(sharded, key=lambda s: (sizes[s].comm_s, s != "fsdp-hybrid"))
        if best == "fsdp-hybrid":
            return best, "its shard fits one node, so only gradient shards cross the network"
        return best, "a whole copy does not fit one rank; sharded over every rank it does"
    for strategy, why in (
        ("tp+fsdp", "sharding alone leaves too little room: tensor parallel splits the layers' activations too"),
        ("deepspeed-zero3-offload", "only with the optimizer states in CPU RAM does a rank's share fit"),
    ):
        if strategy in fits:
            return strategy, why
    smallest = min(sizes.values(), key=lambda s: s.total)
    return None, f"the smallest share, {smallest.strategy}'s, is {format_bytes(smallest.total)} a rank"


def _refuse(requested: str, sizes: dict[str, RankSize], strategy: str) -> None:
    size = sizes[strategy]
    raise PlacementError(
        f"parallelism={requested!r} was asked, but each rank would need {format_bytes(size.total)} "
        f"({_parts(size)}), more than it has. Pass parallelism='auto', more nodes, quantize='4bit', or a "
        "shorter seq_len / smaller batch_size."
    )


def _parts(size: RankSize) -> str:
    parts = [("weights", size.weights), ("gradients", size.gradients), ("optimizer", size.states)]
    parts += [("activations", size.activations), ("buffers", size.buffers)]
    return ", ".join(f"{name} {format_bytes(n)}" for name, n in parts if n)


def _numbers(size: RankSize, budget: int) -> str:
    step = f", step ~{seconds(size.step_s)}" if size.step_s is not None else ""
    offload = f" (+{format_bytes(size.cpu_offloaded)} in CPU RAM)" if size.cpu_offloaded else ""
    moved = format_bytes(size.comm_bytes)
    return (
        f"{format_bytes(size.total)} a rank of {format_bytes(budget)}{offload} ({_parts(size)}); {moved} sent per "
        f"rank per step ({format_bytes(size.cross_node_bytes)} across nodes), comm ~{seconds(size.comm_s)}{step}"
    )


def _rejection(
    strategy: str,
    sizes: dict[str, RankSize],
    budget: int,
    chosen: str | None,
    model: ModelFacts,
    layout: ParallelLayout,
) -> str:
    if strategy not in sizes:
        return str(_applies(strategy, model, layout))
    size = sizes[strategy]
    if size.total > budget:
        return f"does not fit: {format_bytes(size.total)} a rank > {format_bytes(budget)} ({_parts(size)})"
    if chosen is None:
        return "fits"
    mine = sizes[chosen]
    if size.comm_s > mine.comm_s:
        comm = f"comm ~{seconds(size.comm_s)} vs ~{seconds(mine.comm_s)}"
        return f"fits ({format_bytes(size.total)} a rank) but moves more: {comm}"
    return f"fits ({format_bytes(size.total)} a rank), but {chosen} comes first when both fit"


def sixteen_bit_when_sharded(
    machine: Machine,
    model: ModelFacts,
    training: TrainingRequest,
    dtype: str,
    estimates: dict[str | None, TrainingMemory],
    lora_config: Mapping[str, Any],
    quant: Decision,
    checkpoint: CheckpointPlan | None,
) -> Decision | None:
    """quantize="auto" chose a quantized base because 16-bit LoRA does not fit one GPU; across the job's ranks
    it may: then no quantization (QLoRA trades accuracy for memory). Only where the ranks can shard: planned
    before the launch, with the layout given, or under an FSDP / ZeRO-3 launch (a DDP launch copies the
    whole model to every rank)."""
    if training.quantize != "auto" or checkpoint is not None or quant.value is None:
        return None
    launch = machine.launch
    if launch.distributed and training.nodes is None and not launch.shards_parameters:
        return None
    _, choice = parallel_section(machine, model, training, dtype, None, estimates, lora_config)
    if choice is None or choice.chosen is None:
        return None
    size = format_bytes(choice.sizes[choice.chosen].total)
    world = choice.layout.world_size
    return Decision(
        "quantize",
        None,
        f"16-bit LoRA does not fit one GPU, but it fits each of the {world} ranks with {choice.chosen} ({size} a "
        "rank): no quantization needed",
        (Rejected(quant.value, f"only needed on one GPU; {quant.reason}"),),
    )


def parallel_section(
    machine: Machine,
    model: ModelFacts,
    training: TrainingRequest,
    dtype: str,
    quantize: str | None,
    estimates: dict[str | None, TrainingMemory],
    lora_config: Mapping[str, Any] | None,
) -> tuple[tuple[Decision, ...], ParallelChoice | None]:
    """The `parallelism` decision for the job's ranks (none for one process with no layout asked); `lora_config`
    None: full training (every weight trained)."""
    layout = planned_layout(machine, training)
    if layout is None:
        return (), None
    estimate = estimates[quantize]
    full = lora_config is None
    trained = model.parameters
    if lora_config is not None:
        trained = lora_parameters(model, int(lora_config["r"]), lora_leaves(model, lora_config["target_modules"]))
    shape = training_shape(
        model,
        dtype=dtype,
        weight_bytes=estimate.weights,
        trained=trained,
        full=full,
        activations_per_sample=estimate.activations // training.batch_size,
        tokens=training.seq_len,
        checkpointing=training.gradient_checkpointing,
        lora_bytes=None if full else estimate.lora,
    )
    decision, choice = decide_parallelism(machine, model, layout, shape, training.parallelism, training.batch_size)
    return (decision,), choice


def seconds(value: float) -> str:
    """A time as read at a glance: "1.23 s" from a second up, "4.2 ms" / "37 us" below (never "0.00 s")."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us" if value > 0 else "0 s"
