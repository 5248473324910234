"""The CPU RAM of one node of a training job (`node_memory=`, `--node-memory`), and whether a strategy's CPU
state fits it: ZeRO-3 with CPU offload keeps the optimizer states (and fp32 master weights) of every rank of
the node in the node's RAM, so a strategy whose ranks fit their GPUs may still not fit the node."""

from __future__ import annotations

import re
from typing import Any

from ..errors import SettingError
from ..facts.machine import Machine
from ..frozen import frozen
from .fit import TRAINING_SHARE, format_bytes, percent, size_bytes

__all__ = ["NodeMemory", "cpu_ram_problem", "node_memory", "parse_node_memory"]

_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)\s*$")


@frozen
class NodeMemory:
    """A node's RAM in bytes (None: unknown) and where the figure comes from, as a reason says it."""

    total: int | None
    source: str
    assumed: bool

    @property
    def usable(self) -> int | None:
        """What a job's CPU state may take of it: `TRAINING_SHARE`, as of a GPU (the OS, the data loader and
        each rank's own process keep the rest)."""
        return None if self.total is None else int(self.total * TRAINING_SHARE)

    def describe(self) -> str:
        if self.total is None:
            return f"CPU RAM a node unknown ({self.source})"
        return f"CPU RAM a node {format_bytes(self.total)} ({self.source})"

    def as_dict(self) -> dict[str, Any]:
        return {"node_memory": self.total, "node_memory_assumed": self.assumed}


def parse_node_memory(value: Any) -> int | None:
    """`node_memory=` in bytes: a whole number of bytes, or a size as `max_memory` takes it ("512GiB",
    "2TB": "GB" is 10**9, "GiB" 2**30, as accelerate's `convert_file_size_to_int`); None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and _SIZE.match(value.upper()) and size_bytes(value) > 0:
        return size_bytes(value)
    raise SettingError(
        f"node_memory={value!r}: the RAM of one node, a number of bytes or a size such as '512GiB' or '2TB' "
        "(--node-memory 512GiB). Leave it unset for this machine's RAM."
    )


def node_memory(machine: Machine, given: int | None) -> NodeMemory:
    """The RAM each node of the job has: yours (`node_memory`), else this machine's (every node is like it), a
    simulated GPU node twice its GPUs' memory, or the simulated RAM if more (`Machine.simulated(cpu_memory_gib=...)`):
    assumed."""
    if given is not None:
        return NodeMemory(given, "yours", False)
    total = machine.cpu.memory_total
    if machine.source == "simulated":
        # A GPU node is built with about twice its GPUs' memory in RAM (DGX H100: 2 TiB for 8 x 80 GB; DGX A100:
        # 1 TiB or 2 TiB for 8 x 40/80 GB, NVIDIA's DGX user guides); `Machine.simulated`'s 64 GiB is a laptop's.
        node = 2 * sum(g.total_memory for g in machine.gpus)
        if node > (total or 0):
            return NodeMemory(node, "assumed: twice the node's GPU memory, as DGX nodes; pass --node-memory", True)
        return NodeMemory(total, "assumed: the simulated machine's; pass --node-memory", True)
    if total is None:
        return NodeMemory(None, "not detected: pass --node-memory", True)
    return NodeMemory(total, "this machine's; pass --node-memory for other nodes", False)


def cpu_ram_problem(per_node: int, node: NodeMemory) -> str | None:
    """Why `per_node` bytes of CPU state on each node do not fit its RAM (None: they fit, or the RAM is
    unknown and the reason says so elsewhere). The one comparison of a strategy's CPU RAM with the node's."""
    usable = node.usable
    if per_node <= 0 or usable is None or per_node <= usable:
        return None
    return (
        f"its CPU RAM a node, {format_bytes(per_node)}, is more than {percent(TRAINING_SHARE)} of the node's "
        f"{format_bytes(node.total or 0)} ({node.source})"
    )
