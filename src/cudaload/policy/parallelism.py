"""The parallelism of a training job on `nodes` x `ranks_per_node`: DDP, FSDP2 (full or hybrid shard) or
DeepSpeed ZeRO-1/2/3 (with CPU offload); sized by rank_sizing.py.

The rule, in order: DDP when a whole training state fits each GPU (the least communication: one gradient
all-reduce); else FSDP2 sharding, hybrid (shard inside a node, replicate across nodes) when its shard fits
and its step is not slower than full sharding over the network, and the node's RAM holds the copy rank 0 reads
while loading; else DeepSpeed ZeRO-3 (its partition of the same state); else ZeRO-3 with its optimizer in CPU
RAM, when that fits the node's RAM too (`node_memory`). You may ask for DeepSpeed (the cheapest ZeRO stage that
fits) or for one strategy by name: it is validated and kept, and refused with the numbers when it cannot fit.

Tensor parallel ("tp+fsdp") is never chosen for training, and refused when asked: transformers' tensor-parallel
plans gather the logits on every rank and have no sequence parallelism, accelerate prepares TP only for a
model loaded with a `tp_plan`, and no tensor-parallel training has been run with cudaload.

A launched rank plans only the strategies its launcher's engine applies: an FSDP launch FSDP, a DeepSpeed
launch its ZeRO stage, an accelerate launch without either DDP (launch_engine.py); plain torchrun names no
engine, so the plan's own choice stands.

The budget is each GPU's total memory (not its free memory), so a plan made before the launch and the
plans the launched ranks make agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import PlacementError, SettingError
from ..facts.interconnect import ParallelLayout, gpu_link, gpu_tflops, interconnect
from ..facts.launch import zero_stage
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..frozen import frozen
from ..plans import Decision, Rejected
from ..request import PARALLELISM_CHOICES, TrainingRequest
from .fit import TRAINING_SHARE, format_bytes
from .launch_engine import LaunchEngine, launch_engine
from .lora_targets import lora_leaves
from .memory import CUDA_OVERHEAD, TrainingMemory, lora_parameters
from .node_memory import NodeMemory, cpu_ram_problem, node_memory
from .parallel_reasons import ParallelOptions, cpu_bytes_per_node, not_an_option, numbers, refuse, rejection
from .rank_sizing import STRATEGIES, RankSize, TrainingShape, size_rank
from .training_shape import training_shape

__all__ = [
    "PARALLELISM_CHOICES",
    "SHARDS_WEIGHTS",
    "TP_NOT_FOR_TRAINING",
    "ParallelChoice",
    "decide_parallelism",
    "parallel_section",
    "planned_layout",
    "rank_budget",
]
MAX_MICRO_BATCH = 1024

_WHAT = {
    "ddp": "DDP: a whole copy per rank, gradients all-reduced",
    "fsdp": "FSDP2 full shard: weights, gradients and optimizer states split over every rank",
    "fsdp-hybrid": "FSDP2 hybrid shard: split inside a node, replicated across nodes",
    "deepspeed-zero1": "DeepSpeed ZeRO-1: optimizer states split, weights and gradients whole",
    "deepspeed-zero2": "DeepSpeed ZeRO-2: gradients and optimizer states split, weights whole",
    "deepspeed-zero3": "DeepSpeed ZeRO-3: weights, gradients and optimizer states split",
    "deepspeed-zero3-offload": "DeepSpeed ZeRO-3 with the optimizer in CPU RAM",
    "tp+fsdp": "tensor parallel inside a node (tp_plan), FSDP2 across nodes",
}

# transformers 5.22-5.25 models/llama/modeling_llama.py: LlamaForCausalLM._tp_plan is {"lm_head":
# "colwise_gather_output"} (every rank holds the whole logits) and the base plan splits no sequence;
# accelerate 1.16 accelerator.py: Accelerator._prepare_tp skips a model whose parameters are not DTensors
# ("we skip the TP preparation"), i.e. one not loaded with a tp_plan; measured on 2x2 ranks (issue 45),
# "tp+fsdp" then sharded over nodes only.
TP_NOT_FOR_TRAINING = (
    "tensor parallel is not offered for training: transformers' tp_plan gathers the logits on every rank and "
    "splits no sequence (no sequence parallelism), accelerate skips TP preparation for a model not loaded with a "
    "tp_plan, and no tensor-parallel training has been run with cudaload"
)
"""Why "tp+fsdp" is never a training plan's strategy."""


@frozen
class ParallelChoice:
    """The decision's numbers: the layout, the per-rank budget and every strategy's size."""

    layout: ParallelLayout
    budget: int
    sizes: dict[str, RankSize]
    chosen: str | None
    node_memory: NodeMemory | None = None

    def as_dict(self) -> dict[str, Any]:
        link = self.layout.interconnect
        return {
            "nodes": self.layout.nodes,
            "ranks_per_node": self.layout.ranks_per_node,
            "interconnect": link.name,
            "interconnect_assumed": not self.layout.interconnect_given,
            "budget_per_rank": self.budget,
            **(self.node_memory.as_dict() if self.node_memory is not None else {}),
            "strategy": self.chosen,
            "sizes": {name: size.as_dict() for name, size in self.sizes.items()},
        }

    def tokens_per_s(self, tokens_per_sample: int) -> float | None:
        """The job's estimated training throughput with the chosen strategy (None: nothing chosen, or no step
        time: a CPU, or a GPU without a throughput figure)."""
        size = self.sizes.get(self.chosen or "")
        step = size.step_s if size is not None else None
        return None if size is None or not step else size.sequences * tokens_per_sample / step


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
    machine: Machine,
    model: ModelFacts,
    layout: ParallelLayout,
    shape: TrainingShape,
    requested: str,
    batch: int,
    node: NodeMemory | None = None,
) -> tuple[Decision, ParallelChoice]:
    """The `parallelism` decision for `shape` on `layout`, with every strategy's numbers at `batch`. `node`: each
    node's RAM (default: this machine's, as `node_memory` gives it)."""
    if requested not in PARALLELISM_CHOICES:
        raise SettingError(
            f"parallelism={requested!r} is not a strategy cudaload plans. Pass one of {list(PARALLELISM_CHOICES)}."
        )
    gpu = machine.weakest_gpu
    link, link_what = gpu_link(gpu.name if gpu else None)
    tflops = gpu_tflops(gpu.name) if gpu else None
    overhead = CUDA_OVERHEAD if gpu is not None else 0
    budget = rank_budget(machine, layout)
    node = node if node is not None else node_memory(machine, None)
    engine = launch_engine(machine.launch)
    candidates = [s for s in STRATEGIES if _applies(s, model, layout, engine) is None]
    cpu = gpu is None  # CPU ranks on gloo: what their pages hold (policy/zero_bytes.py)
    sizes = {
        s: size_rank(s, shape, layout, micro_batch=batch, gpu_link=link, tflops=tflops, overhead=overhead, cpu=cpu)
        for s in candidates
    }
    ram = {s: why for s, size in sizes.items() if (why := cpu_ram_problem(cpu_bytes_per_node(size, layout), node))}
    fits = {s for s, size in sizes.items() if size.total <= budget and s not in ram}
    options = ParallelOptions(sizes, fits, ram, engine)
    chosen, why = _choose(requested, options, layout, model)
    choice = ParallelChoice(layout, budget, sizes, chosen, node)
    where = f"{layout.nodes} node{'s' if layout.nodes > 1 else ''} x {layout.ranks_per_node} ranks"
    net = layout.interconnect.label + ("" if layout.interconnect_given else " (assumed: pass --interconnect)")
    context = f"{where}, {format_bytes(budget)} usable per rank; between nodes {net}; inside a node {link_what}"
    if engine is not None:
        context += f"; {engine.what}"
    if cpu:
        context += (
            "; CPU ranks over gloo: DeepSpeed's reduce buckets counted as the pages the gradients write (a GPU's "
            "allocator holds them whole), and gloo's staging copy of an all-gather"
        )
    rejected = tuple(
        Rejected(s, rejection(s, options, budget, chosen, str(_applies(s, model, layout, engine))))
        for s in STRATEGIES
        if s != chosen
    )
    if chosen is None:
        return Decision("parallelism", None, f"nothing fits: {why}; {context}", rejected), choice
    size = sizes[chosen]
    reason = (
        f"{_WHAT[chosen]}; {why}: {numbers(size, budget, layout, node)}, largest micro-batch "
        f"{largest_micro_batch(chosen, shape, layout, budget, link, tflops, overhead, cpu)}; {context}"
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
    cpu: bool = False,
) -> int:
    """The most sequences per rank that fit `budget` (activations grow linearly with the micro-batch)."""
    one = size_rank(strategy, shape, layout, micro_batch=1, gpu_link=link, tflops=tflops, overhead=over, cpu=cpu)
    per = max(one.activations, 1)
    if one.load_gpu + one.overhead > budget:
        return 0  # loading alone does not fit
    room = budget - (one.training - one.activations)
    return max(0, min(MAX_MICRO_BATCH, room // per))


def _applies(strategy: str, model: ModelFacts, layout: ParallelLayout, engine: LaunchEngine | None) -> str | None:
    """Why `strategy` is not an option for this model, layout and launch (None: it is)."""
    if strategy == "tp+fsdp":
        heads, kv, local = model.attention_heads, model.kv_heads, layout.ranks_per_node
        if not model.tp_plan:
            return f"{model.model_class} has no base_model_tp_plan: transformers cannot shard its layers"
        if heads is None or kv is None or heads % local or kv % local or local == 1:
            return f"{heads} heads / {kv} key-value heads do not split over {local} ranks of a node"
        return TP_NOT_FOR_TRAINING
    if engine is not None and strategy not in engine.strategies:
        return engine.refusal()
    if strategy == "fsdp-hybrid" and layout.nodes == 1:
        return "one node: hybrid shard is full shard"
    return None


def _choose(
    requested: str, options: ParallelOptions, layout: ParallelLayout, model: ModelFacts
) -> tuple[str | None, str]:
    sizes, fits, engine = options.sizes, options.fits, options.engine
    deepspeed_launch = engine is not None and all(zero_stage(s) is not None for s in engine.strategies)
    if requested == "deepspeed" or (requested == "auto" and deepspeed_launch):
        stages = [s for s in STRATEGIES if zero_stage(s) is not None and s in sizes]
        stage = next((s for s in stages if s in fits), None)
        if requested == "auto":  # a DeepSpeed launch: its stage, the cheapest that fits
            if stage is not None:
                return stage, "the launch runs DeepSpeed: its cheapest ZeRO stage that fits"
            return None, _smallest(options) if stages else engine.refusal() if engine else "no ZeRO stage applies"
        if not stages:
            raise PlacementError(
                f"parallelism={requested!r} was asked, but {engine.refusal() if engine else 'no ZeRO stage applies'}. "
                "Pass parallelism='auto' or one of those, or relaunch with DeepSpeed."
            )
        if stage is None:
            refuse(requested, options, stages[-1])
        return stage, "you asked for DeepSpeed: its cheapest ZeRO stage that fits"
    if requested != "auto":
        if requested not in sizes:
            raise PlacementError(
                not_an_option(requested, str(_applies(requested, model, layout, engine)), engine, TP_NOT_FOR_TRAINING)
            )
        if requested not in fits:
            refuse(requested, options, requested)
        return requested, "your choice"
    if "ddp" in fits:
        return "ddp", "a whole training state fits each rank"
    sharded = [s for s in ("fsdp-hybrid", "fsdp") if s in fits]
    if sharded:
        best = min(sharded, key=lambda s: (sizes[s].comm_s, s != "fsdp-hybrid"))
        if best == "fsdp-hybrid":
            return best, "its shard fits one node, so only gradient shards cross the network"
        return best, "a whole copy does not fit one rank; sharded over every rank it does"
    if "deepspeed-zero3" in fits:  # FSDP2 did not fit a rank (or its node's RAM): ZeRO-3's partition does
        return "deepspeed-zero3", "FSDP2 does not fit; ZeRO-3's partition of the same training state does"
    if "deepspeed-zero3-offload" in fits:
        return "deepspeed-zero3-offload", "only with the optimizer states in CPU RAM does a rank's share fit"
    if not sizes:
        return None, engine.refusal() if engine is not None else "no strategy applies"
    return None, _smallest(options)


def _smallest(options: ParallelOptions) -> str:
    """Why nothing fits: the smallest share a rank, or the node's RAM that a share fitting its GPU exceeds."""
    smallest = min(options.sizes.values(), key=lambda s: s.total)
    share = f"the smallest share, {smallest.strategy}'s, is {format_bytes(smallest.total)} a rank"
    return f"{share}, but {options.cpu[smallest.strategy]}" if smallest.strategy in options.cpu else share


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
        quantized=quantize is not None,
    )
    node = node_memory(machine, training.node_memory)
    decision, choice = decide_parallelism(
        machine, model, layout, shape, training.parallelism, training.batch_size, node
    )
    return (decision,), choice
