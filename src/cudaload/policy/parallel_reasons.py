"""The words of the parallelism decision (policy/parallelism.py): each strategy's numbers, why one was not
chosen, and the refusal of a strategy asked by name, with what to pass instead."""

from __future__ import annotations

from ..errors import PlacementError
from ..facts.interconnect import ParallelLayout
from ..frozen import frozen
from .fit import format_bytes
from .launch_engine import LaunchEngine
from .node_memory import NodeMemory
from .rank_sizing import STRATEGIES, RankSize

__all__ = [
    "ParallelOptions",
    "cpu_bytes_per_node",
    "not_an_option",
    "numbers",
    "parts",
    "refuse",
    "rejection",
    "seconds",
]


def cpu_bytes_per_node(size: RankSize, layout: ParallelLayout) -> int:
    """The CPU RAM `size`'s strategy needs on each node, the larger of training (ZeRO-3 offload: DeepSpeed's own
    estimate, `RankSize.node_cpu`, at least every rank's offloaded state) and loading (`RankSize.node_load_cpu`:
    rank 0's whole copy under FSDP2 and ZeRO-3)."""
    return max(size.node_cpu, size.cpu_offloaded * layout.ranks_per_node, size.node_load_cpu)


@frozen
class ParallelOptions:
    """What the choice weighs.

    Attributes:
        sizes: Each candidate strategy's size on each rank.
        fits: The candidates that fit each rank's GPU and the node's RAM.
        cpu: Why a candidate does not fit the node's RAM, by strategy.
        engine: The launch's engine (None: no launch, or one that names none).
    """

    sizes: dict[str, RankSize]
    fits: set[str]
    cpu: dict[str, str]
    engine: LaunchEngine | None


def not_an_option(requested: str, why: str, engine: LaunchEngine | None, tp_refusal: str) -> str:
    """The refusal of a strategy asked by name that is not an option here (`why`): what to pass instead."""
    if why == tp_refusal:
        return (
            f"parallelism={requested!r} was asked, but {why}. Pass parallelism='auto', 'fsdp' or 'fsdp-hybrid' "
            "(FSDP2 shards the weights over the ranks instead), or 'deepspeed'."
        )
    if engine is not None and why == engine.refusal():
        kept = [s for s in STRATEGIES if s in engine.strategies]
        return (
            f"parallelism={requested!r} was asked, but {why}. Pass parallelism='auto' (it chooses among {kept}) or "
            f"one of them, or launch with {requested}'s engine (cudaload launch --parallelism {requested} writes it)."
        )
    return f"parallelism={requested!r} was asked, but {why}. Pass 'auto' or another strategy."


def refuse(requested: str, options: ParallelOptions, strategy: str) -> None:
    """Raise PlacementError: `strategy` (asked, or the last of the stages asked) does not fit, with its numbers."""
    size = options.sizes[strategy]
    if strategy in options.cpu:
        raise PlacementError(
            f"parallelism={requested!r} was asked, but {strategy} does not fit: {options.cpu[strategy]}. Pass "
            "node_memory (--node-memory) if the nodes have more RAM, more nodes, parallelism='auto' or "
            "quantize='4bit'."
        )
    raise PlacementError(
        f"parallelism={requested!r} was asked, but each rank would need {format_bytes(size.total)} "
        f"({parts(size)}), more than it has. Pass parallelism='auto', more nodes, quantize='4bit', or a "
        "shorter seq_len / smaller batch_size."
    )


def parts(size: RankSize) -> str:
    found = [("weights", size.weights), ("gradients", size.gradients), ("optimizer", size.states)]
    found += [("activations", size.activations), ("buffers", size.buffers)]
    text = ", ".join(f"{name} {format_bytes(n)}" for name, n in found if n)
    return text + (f"; {format_bytes(size.load_gpu)} while loading" if size.load_gpu > size.training else "")


def numbers(size: RankSize, budget: int, layout: ParallelLayout, node: NodeMemory) -> str:
    """The chosen strategy's bytes a rank (and a node's CPU RAM), traffic and step time."""
    step = f", step ~{seconds(size.step_s)}" if size.step_s is not None else ""
    per_node = cpu_bytes_per_node(size, layout)
    offload = (
        f" (+{format_bytes(size.cpu_offloaded)} in CPU RAM, {format_bytes(per_node)} a node; {node.describe()})"
        if size.cpu_offloaded
        else ""
    )
    moved = format_bytes(size.comm_bytes)
    return (
        f"{format_bytes(size.total)} a rank of {format_bytes(budget)}{offload} ({parts(size)}); {moved} sent per "
        f"rank per step ({format_bytes(size.cross_node_bytes)} across nodes), comm ~{seconds(size.comm_s)}{step}"
    )


def rejection(strategy: str, options: ParallelOptions, budget: int, chosen: str | None, not_option: str) -> str:
    """Why `strategy` was not chosen; `not_option`: why it is not an option (for one that was not sized)."""
    sizes = options.sizes
    if strategy not in sizes:
        return not_option
    size = sizes[strategy]
    if size.total > budget:
        return f"does not fit: {format_bytes(size.total)} a rank > {format_bytes(budget)} ({parts(size)})"
    if strategy in options.cpu:
        return f"does not fit: {options.cpu[strategy]}; pass --node-memory if the nodes have more"
    if chosen is None:
        return "fits"
    mine = sizes[chosen]
    if size.comm_s > mine.comm_s:
        comm = f"comm ~{seconds(size.comm_s)} vs ~{seconds(mine.comm_s)}"
        return f"fits ({format_bytes(size.total)} a rank) but moves more: {comm}"
    return f"fits ({format_bytes(size.total)} a rank), but {chosen} comes first when both fit"


def seconds(value: float) -> str:
    """A time as read at a glance: "1.23 s" from a second up, "4.2 ms" / "37 us" below (never "0.00 s")."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us" if value > 0 else "0 s"
