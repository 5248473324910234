"""Each rank's memory, the largest micro-batch, the bytes a step moves between ranks and an estimated step
time, for every parallelism strategy (policy/parallelism.py chooses among them). Pure arithmetic.

Memory per rank (ZeRO, Rajbhandari et al. 2020, section 3.1: mixed-precision Adam holds 2 + 2 + 12 bytes a
trained parameter): the weights (as loaded: 16-bit or quantized), the trained parameters' gradients in the
compute dtype, fp32 master weights (full training in 16 bit only; LoRA adapters are fp32 already) and two
fp32 AdamW moments. A strategy divides them:

- DDP: nothing; torch's DistributedDataParallel also copies the gradients into its buckets
  (`gradient_as_bucket_view=False`, torch 2.13 nn/parallel/distributed.py), so they count twice.
- DeepSpeed ZeRO-2: optimizer states, master weights and gradients / world.
- FSDP2 full shard and ZeRO-3: everything / world; FSDP2 then holds two layers unsharded (the one running
  and the one prefetched) and the root module's own parameters (embeddings, lm_head: FSDP2 does not
  reshard the root after forward, torch 2.13 distributed/fsdp/_fully_shard/_fsdp_state.py `_lazy_init`).
- Hybrid shard: the same, / the ranks of one node (replicated across nodes).
- ZeRO-3 with CPU offload: the optimizer states and master weights live in CPU RAM.
- Tensor parallel inside a node (with FSDP across nodes): weights, states and the layers' activations / the
  ranks of a node, then the states / nodes.

Communication per step per rank (ring collectives move (n-1)/n of the buffer per rank; an all-reduce is a
reduce-scatter + an all-gather): DDP all-reduces the gradients; FSDP/ZeRO-3 all-gather the weights twice
(forward, and again in the backward after resharding) and reduce-scatter the gradients; ZeRO-2
reduce-scatters the gradients and all-gathers the updated weights; hybrid shard does FSDP's inside a node
and all-reduces its gradient shard across nodes. A collective that crosses nodes runs at each GPU's share
of the node's network link (facts/interconnect.py), one inside a node at the GPU-to-GPU link.

Step time: compute (6 flops a parameter and token for full training, 4 for LoRA, whose frozen weights get no
gradient; +2 with checkpointing's recomputation, at `MFU` of the GPU's dense BF16 peak) against
communication; DDP's buckets and FSDP's prefetch overlap the two, so the slower one sets the pace.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..facts.interconnect import LINK_EFFICIENCY, ParallelLayout

__all__ = ["MFU", "STRATEGIES", "RankSize", "TrainingShape", "size_rank"]

MFU = 0.4
"""Model flops utilisation assumed for the compute time (well-tuned large-model training reports 0.35-0.55)."""
FP32 = 4
ADAM_STATES = 2 * FP32
PCIE = 25e9  # bytes/s a GPU reaches to pinned CPU memory over PCIe Gen4 (ZeRO-offload's traffic)

STRATEGIES = ("ddp", "fsdp", "fsdp-hybrid", "deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero3-offload", "tp+fsdp")
"""Every strategy sized here, in the order a plan prefers them when each fits."""


@dataclass(frozen=True)
class TrainingShape:
    """What sizing needs of the model and the training: counts and bytes, no facts objects.

    Attributes:
        parameters: All parameters.
        weight_bytes: The loaded weights (16-bit, or quantized: 4-bit weights for QLoRA).
        trained: Parameters that get gradients (the LoRA adapters, or all of them).
        full: Full training (gradients and states for every weight, in the compute dtype) or LoRA (fp32
            adapters beside frozen weights).
        dtype_bytes: Bytes per element of the compute dtype.
        layers: Decoder layers (FSDP wraps each).
        layer_bytes: The weights of one decoder layer, in bytes.
        activations_per_sample: Activation bytes of one sequence (one rank, one micro-batch of 1).
        tokens_per_sample: Tokens per sequence.
        checkpointing: Activation checkpointing (recomputes the forward in the backward).
        lora_bytes: LoRA only: the adapters' weights, gradients and optimizer states as the training-memory
            estimate counts them (policy/memory.py, with the planned optimizer); None: 16 bytes a parameter.
    """

    parameters: int
    weight_bytes: int
    trained: int
    full: bool
    dtype_bytes: int
    layers: int
    layer_bytes: int
    activations_per_sample: int
    tokens_per_sample: int
    checkpointing: bool
    lora_bytes: int | None = None

    @property
    def root_bytes(self) -> int:
        """The weights outside the decoder layers (embeddings, lm_head, final norm)."""
        return max(self.weight_bytes - self.layers * self.layer_bytes, 0)

    @property
    def gradient_bytes(self) -> int:
        return self.trained * (self.dtype_bytes if self.full else FP32)

    @property
    def state_bytes(self) -> int:
        """AdamW's moments, fp32 master weights (full 16-bit training), and LoRA's own fp32 weights."""
        if not self.full and self.lora_bytes is not None:
            return max(self.lora_bytes - self.gradient_bytes, 0)
        master = self.trained * FP32 if self.full and self.dtype_bytes < FP32 else 0
        adapters = 0 if self.full else self.trained * FP32
        return self.trained * ADAM_STATES + master + adapters


@dataclass(frozen=True)
class RankSize:
    """One strategy on one layout: bytes per rank and per step, and the step time.

    Attributes:
        strategy: One of `STRATEGIES`.
        weights, gradients, states, activations, buffers, overhead: Bytes on each rank's device.
        cpu_offloaded: Bytes each rank keeps in CPU RAM instead (ZeRO-3 offload).
        micro_batch: The sequences per rank this size assumes (tensor parallel: per node, shared by its ranks).
        sequences: Sequences the whole job trains per step.
        comm_bytes: Bytes each rank sends per step; `cross_node_bytes` of them cross nodes.
        compute_s, comm_s: Estimated seconds of compute and of communication per step; None without the
            GPU's throughput (a CPU, or a GPU the facts table lacks).
    """

    strategy: str
    weights: int
    gradients: int
    states: int
    activations: int
    buffers: int
    overhead: int
    cpu_offloaded: int
    micro_batch: int
    sequences: int
    comm_bytes: int
    cross_node_bytes: int
    compute_s: float | None
    comm_s: float

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.states + self.activations + self.buffers + self.overhead

    @property
    def step_s(self) -> float | None:
        return None if self.compute_s is None else max(self.compute_s, self.comm_s)

    def as_dict(self) -> dict[str, object]:
        keys = ("weights", "gradients", "states", "activations", "buffers", "overhead", "cpu_offloaded")
        out: dict[str, object] = {k: getattr(self, k) for k in keys}
        out |= {"total": self.total, "micro_batch": self.micro_batch, "sequences": self.sequences}
        out["comm_bytes"] = self.comm_bytes
        out |= {"cross_node_bytes": self.cross_node_bytes, "comm_s": round(self.comm_s, 4)}
        out["compute_s"] = None if self.compute_s is None else round(self.compute_s, 4)
        return out


def _ring(n: int, size: float) -> float:
    """Bytes each rank sends in a ring all-gather or reduce-scatter of `size` bytes over n ranks."""
    return (n - 1) / n * size if n > 1 else 0.0


def size_rank(
    strategy: str,
    shape: TrainingShape,
    layout: ParallelLayout,
    *,
    micro_batch: int,
    gpu_link: float,
    tflops: float | None,
    overhead: int,
) -> RankSize:
    """`strategy` on `layout` at `micro_batch` sequences per rank. `gpu_link`: bytes/s between GPUs of a node;
    `tflops`: the GPU's dense BF16 TFLOPS (None: no compute estimate); `overhead`: the device's fixed cost."""
    world, local, nodes = layout.world_size, layout.ranks_per_node, layout.nodes
    weights, grads, states = shape.weight_bytes, shape.gradient_bytes, shape.state_bytes
    activations = shape.activations_per_sample * micro_batch
    buffers = offloaded = 0
    inside = cross = 0.0  # bytes sent per rank inside a node, and across nodes
    if strategy == "ddp":
        buffers = grads  # DDP's bucket copy of the gradients
        inside, cross = _split(2 * _ring(world, grads), nodes)
    elif strategy == "deepspeed-zero2":
        grads, states = grads // world, states // world
        inside, cross = _split(
            _ring(world, shape.gradient_bytes) + _ring(world, shape.trained * shape.dtype_bytes), nodes
        )
    elif strategy in ("fsdp", "deepspeed-zero3", "deepspeed-zero3-offload"):
        weights, grads, states = weights // world, grads // world, states // world
        buffers = 2 * shape.layer_bytes + (shape.root_bytes if strategy == "fsdp" else 0)
        moved = 2 * _ring(world, shape.weight_bytes) + _ring(world, shape.gradient_bytes)
        inside, cross = _split(moved, nodes)
        if strategy == "deepspeed-zero3-offload":
            offloaded, states = states, 0
    elif strategy == "fsdp-hybrid":
        weights, grads, states = weights // local, grads // local, states // local
        buffers = 2 * shape.layer_bytes + shape.root_bytes
        inside = 2 * _ring(local, shape.weight_bytes) + _ring(local, shape.gradient_bytes)
        cross = 2 * _ring(nodes, shape.gradient_bytes / local)
    elif strategy == "tp+fsdp":
        weights, grads, states = weights // world, grads // world, states // world
        activations //= local
        # Megatron TP: two all-reduces of the activations per layer, forward and backward, inside the node.
        per_layer = 2 * 2 * 2 * _ring(local, shape.tokens_per_sample * micro_batch * _hidden_bytes(shape))
        inside = per_layer * shape.layers
        cross = 2 * _ring(nodes, shape.weight_bytes / local) + _ring(nodes, shape.gradient_bytes / local)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    link_cross = layout.interconnect.per_gpu_bytes_per_s(local) * LINK_EFFICIENCY
    comm_s = inside / (gpu_link * LINK_EFFICIENCY) + (cross / link_cross if cross else 0.0)
    if strategy == "deepspeed-zero3-offload":
        comm_s += (shape.gradient_bytes + shape.trained * shape.dtype_bytes) / world / PCIE
    return RankSize(
        strategy=strategy,
        weights=int(weights),
        gradients=int(grads),
        states=int(states),
        activations=int(activations),
        buffers=int(buffers),
        overhead=overhead,
        cpu_offloaded=int(offloaded),
        micro_batch=micro_batch,
        sequences=micro_batch * (nodes if strategy == "tp+fsdp" else world),
        comm_bytes=int(inside + cross),
        cross_node_bytes=int(cross),
        compute_s=_compute_s(shape, micro_batch, tflops, local if strategy == "tp+fsdp" else 1),
        comm_s=comm_s,
    )


def _split(moved: float, nodes: int) -> tuple[float, float]:
    """A collective over every rank: (inside a node, across nodes). Across several nodes the ring's slowest
    hop is the network, so it is all counted at the network's pace."""
    return (moved, 0.0) if nodes == 1 else (0.0, moved)


def _hidden_bytes(shape: TrainingShape) -> int:
    """One token's hidden state in bytes, from the layer size (12 h^2 parameters in a Llama-style layer)."""
    hidden = int((shape.layer_bytes / shape.dtype_bytes / 12) ** 0.5) if shape.layer_bytes else 0
    return hidden * shape.dtype_bytes


def _compute_s(shape: TrainingShape, micro_batch: int, tflops: float | None, split: int) -> float | None:
    """Seconds of compute per step on one rank; tensor parallel `split`s each sequence's work over the node."""
    if tflops is None:
        return None
    per_token = (6 if shape.full else 4) + (2 if shape.checkpointing else 0)
    flops = per_token * shape.parameters * shape.tokens_per_sample * micro_batch
    return flops / split / (tflops * 1e12 * MFU)
