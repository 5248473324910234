"""Each rank's memory, the largest micro-batch, the bytes a step moves between ranks and an estimated step
time, for every parallelism strategy (policy/parallelism.py chooses among them). Pure arithmetic.

Memory per rank, as each engine holds it (the weights as loaded, 16-bit or quantized):

- DDP (torch 2.13 nn/parallel/distributed.py: DistributedDataParallel): the whole model, its gradients, and a
  bucket copy of them (`gradient_as_bucket_view=False`), so they count twice. Full training keeps the plan's
  dtype: HF Trainer's bf16=True only sets accelerate's mixed_precision (transformers 5.25 training_args.py:
  TrainingArguments.__post_init__), which autocasts the forward and upcasts nothing, so a bf16-loaded model
  trains bf16 weights with bf16 gradients, and torch AdamW keeps its two moments in the parameter's dtype
  (torch 2.13 optim/adamw.py: AdamW, `torch.zeros_like(p)`): 2 + 2 + 4 bytes a parameter, + 2 for the bucket.
  LoRA: fp32 adapters, their gradients and moments (policy/memory.py's estimate).
- FSDP2, full or hybrid shard (accelerate 1.16 utils/fsdp_utils.py: fsdp2_prepare_model): under mixed precision
  every trained parameter is upcast to fp32 before sharding, so a shard holds fp32 weights, gradients and
  moments (4 + 4 + 8 bytes a parameter / ranks); two decoder layers gathered in 16 bit (the running one and the
  prefetched one) and the tail unit (final norm + lm_head, or the tied embedding) kept whole from the forward's
  end through the backward's start (`reshard_after_forward=False`); the input embeddings are their own unit.
  Hybrid shard divides by the ranks of a node, full shard by all.
- DeepSpeed ZeRO-1/2/3 (+ CPU offload): policy/zero_bytes.py, DeepSpeed 0.19.8's own estimators and buffers
  (fp32 master weights and moments, its fp32 gradient partition, the 5e8-element reduce buckets, ZeRO-3's gathered
  weights; ZeRO-3 offload: the CPU RAM a node needs, `RankSize.node_cpu`). On CPU ranks (gloo) the buckets count
  the pages the gradients write, and gloo's staging copy of an all-gather comes on top (FSDP2 too).
- Tensor parallel inside a node (with FSDP across nodes): FSDP's shards / all ranks, the layers' activations /
  the ranks of a node.

Loading comes before sharding: `RankSize.load_gpu` (QLoRA under FSDP2: each rank first holds the whole 4-bit
model) and `RankSize.node_load_cpu` (FSDP2 and ZeRO-3: rank 0's CPU copy, the other ranks read none);
`RankSize.total` is the larger of the loading and the training peak.

Communication per step (a ring all-gather or reduce-scatter moves (n-1)/n of the buffer per rank; an all-reduce
is a reduce-scatter + an all-gather): DDP all-reduces the gradients; FSDP/ZeRO-3 all-gather the weights twice
(forward, and again in the backward after resharding) and reduce-scatter the gradients; ZeRO-1/2 reduce-scatter
the gradients and all-gather the updated weights; hybrid shard does FSDP's inside a node and all-reduces its
gradient shard across nodes. Across nodes NCCL runs a ring per rail: a node's NICs carry what crosses in parallel
(GPU n's share on its own NIC, facts/interconnect.py `Interconnect.per_gpu_bytes_per_s`), and the GPU links carry
the rest at the same time, so the slower of the two sets each collective's pace.

Step time: compute (6 flops a parameter and token for full training, 4 for LoRA, whose frozen weights get no
gradient; +2 with checkpointing's recomputation, at `MFU` of the GPU's dense BF16 peak) against
communication; DDP's buckets and FSDP's prefetch overlap the two, so the slower one sets the pace.
"""

from __future__ import annotations

from ..facts.interconnect import LINK_EFFICIENCY, ParallelLayout
from ..facts.launch import zero_stage
from ..frozen import frozen
from ..request import STRATEGIES
from .zero_bytes import zero_bytes

__all__ = ["FSDP_STRATEGIES", "MFU", "STRATEGIES", "RankSize", "TrainingShape", "size_rank"]

MFU = 0.4
"""Model flops utilisation assumed for the compute time (well-tuned large-model training reports 0.35-0.55)."""
FP32 = 4
ADAM_STATES = 2 * FP32
PCIE = 25e9  # bytes/s a GPU reaches to pinned CPU memory over PCIe Gen4 (ZeRO-offload's traffic)

FSDP_STRATEGIES = ("fsdp", "fsdp-hybrid", "tp+fsdp")
"""The strategies that accelerate's fsdp2_prepare_model applies (tensor parallel: across nodes)."""


@frozen
class TrainingShape:
    """What sizing needs of the model and the training: counts and bytes, no facts objects.

    Attributes:
        parameters: All parameters.
        weight_bytes: The loaded weights (16-bit, or quantized: 4-bit weights for QLoRA).
        trained: Parameters that get gradients (the LoRA adapters, or all of them).
        full: Full training (gradients and states for every weight, in the compute dtype) or LoRA (fp32
            adapters beside frozen weights).
        dtype_bytes: Bytes per element of the compute dtype (the dtype the weights are loaded in).
        layers: Decoder layers (FSDP wraps each).
        layer_bytes: The weights of one decoder layer, in bytes.
        activations_per_sample: Activation bytes of one sequence (one rank, one micro-batch of 1).
        tokens_per_sample: Tokens per sequence.
        checkpointing: Activation checkpointing (recomputes the forward in the backward).
        lora_bytes: LoRA only: the adapters' weights, gradients and optimizer states as the training-memory
            estimate counts them (policy/memory.py, with the planned optimizer); None: 16 bytes a parameter.
        largest_module: Parameters of the largest single module, its own only (DeepSpeed's `model_to_params`
            in runtime/zero/stage3.py: the embeddings or lm_head of a Llama); 0 when unknown.
        tail_bytes: FSDP2's tail unit (final norm + lm_head, or the tied embedding) in the compute dtype; None:
            the weights outside the decoder layers.
        quantized: The base is loaded quantized (QLoRA).
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
    largest_module: int = 0
    tail_bytes: int | None = None
    quantized: bool = False

    @property
    def root_bytes(self) -> int:
        """The weights outside the decoder layers (embeddings, lm_head, final norm)."""
        return max(self.weight_bytes - self.layers * self.layer_bytes, 0)

    @property
    def tail(self) -> int:
        """FSDP2's tail unit, kept whole through the backward's start."""
        return self.root_bytes if self.tail_bytes is None else self.tail_bytes

    @property
    def mixed(self) -> bool:
        """Full training in a 16-bit dtype: the engines that keep fp32 master weights (FSDP2 through accelerate,
        DeepSpeed) keep them for every parameter."""
        return self.full and self.dtype_bytes < FP32

    @property
    def gradient_bytes(self) -> int:
        """The trained parameters' gradients as torch holds them: in the parameter's dtype (LoRA: fp32)."""
        return self.trained * (self.dtype_bytes if self.full else FP32)

    @property
    def state_bytes(self) -> int:
        """torch AdamW's two moments in the parameter's dtype (full training), or LoRA's fp32 adapters and their
        moments (the training-memory estimate's figure when given)."""
        if not self.full and self.lora_bytes is not None:
            return max(self.lora_bytes - self.gradient_bytes, 0)
        if self.full:
            return self.trained * 2 * self.dtype_bytes
        return self.trained * (ADAM_STATES + FP32)


@frozen
class RankSize:
    """One strategy on one layout: bytes per rank and per step, and the step time.

    Attributes:
        strategy: One of `STRATEGIES`.
        weights, gradients, states, activations, buffers, overhead: Bytes on each rank's device while training.
        cpu_offloaded: Bytes each rank keeps in CPU RAM instead (ZeRO-3 offload).
        micro_batch: The sequences per rank this size assumes (tensor parallel: per node, shared by its ranks).
        sequences: Sequences the whole job trains per step.
        comm_bytes: Bytes each rank sends per step; `cross_node_bytes` of them cross nodes (on its rail).
        compute_s, comm_s: Estimated seconds of compute and of communication per step; None without the
            GPU's throughput (a CPU, or a GPU the facts table lacks).
        node_cpu: CPU RAM one node needs while training (ZeRO-3 offload: DeepSpeed's estimate, 1.5 x what its
            ranks offload); 0 where the strategy keeps nothing there.
        load_gpu: Bytes a rank's device holds while loading, before sharding (QLoRA under FSDP2), without the
            overhead; 0 where loading never holds more than training.
        node_load_cpu: CPU RAM the busiest node holds while loading (FSDP2, ZeRO-3: rank 0's whole copy).
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
    node_cpu: int = 0
    load_gpu: int = 0
    node_load_cpu: int = 0

    @property
    def training(self) -> int:
        """The device's bytes while training."""
        return self.weights + self.gradients + self.states + self.activations + self.buffers + self.overhead

    @property
    def total(self) -> int:
        """The device's peak: training, or loading where that holds more."""
        return max(self.training, self.load_gpu + self.overhead)

    @property
    def step_s(self) -> float | None:
        return None if self.compute_s is None else max(self.compute_s, self.comm_s)

    def as_dict(self) -> dict[str, object]:
        keys = ("weights", "gradients", "states", "activations", "buffers", "overhead", "cpu_offloaded")
        out: dict[str, object] = {k: getattr(self, k) for k in keys}
        out |= {"total": self.total, "micro_batch": self.micro_batch, "sequences": self.sequences}
        out |= {"node_cpu": self.node_cpu, "load_gpu": self.load_gpu, "node_load_cpu": self.node_load_cpu}
        out["comm_bytes"] = self.comm_bytes
        out |= {"cross_node_bytes": self.cross_node_bytes, "comm_s": round(self.comm_s, 4)}
        out["compute_s"] = None if self.compute_s is None else round(self.compute_s, 4)
        return out


def size_rank(
    strategy: str,
    shape: TrainingShape,
    layout: ParallelLayout,
    *,
    micro_batch: int,
    gpu_link: float,
    tflops: float | None,
    overhead: int,
    cpu: bool = False,
) -> RankSize:
    """`strategy` on `layout` at `micro_batch` sequences per rank. `gpu_link`: bytes/s between GPUs of a node;
    `tflops`: the GPU's dense BF16 TFLOPS (None: no compute estimate); `overhead`: the device's fixed cost;
    `cpu`: CPU ranks on gloo (what their pages hold differs from a GPU's allocator: policy/zero_bytes.py)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    world, local, nodes = layout.world_size, layout.ranks_per_node, layout.nodes
    activations = shape.activations_per_sample * micro_batch
    held = _held(strategy, shape, layout, cpu)
    if strategy == "tp+fsdp":
        activations //= local
    links = (gpu_link * LINK_EFFICIENCY, layout.interconnect.per_gpu_bytes_per_s(local) * LINK_EFFICIENCY)
    moves = _collectives(strategy, shape, layout, micro_batch)
    comm_s = sum(max(inside / links[0], cross / links[1]) for inside, cross in moves)
    if strategy == "deepspeed-zero3-offload":
        comm_s += (shape.gradient_bytes + shape.trained * shape.dtype_bytes) / world / PCIE
    return RankSize(
        strategy=strategy,
        weights=held.weights,
        gradients=held.gradients,
        states=held.states,
        activations=int(activations),
        buffers=held.buffers,
        overhead=overhead,
        cpu_offloaded=held.cpu_per_rank,
        micro_batch=micro_batch,
        sequences=micro_batch * (nodes if strategy == "tp+fsdp" else world),
        comm_bytes=int(sum(inside + cross for inside, cross in moves)),
        cross_node_bytes=int(sum(cross for _, cross in moves)),
        compute_s=_compute_s(shape, micro_batch, tflops, local if strategy == "tp+fsdp" else 1),
        comm_s=comm_s,
        node_cpu=held.node_cpu,
        load_gpu=_load_gpu(strategy, shape),
        node_load_cpu=_node_load_cpu(strategy, shape),
    )


@frozen
class _Held:
    """What one rank holds under a strategy, in bytes (on the GPU, and on the CPU per rank and per node)."""

    weights: int
    gradients: int
    states: int
    buffers: int
    cpu_per_rank: int = 0
    node_cpu: int = 0


def _held(strategy: str, shape: TrainingShape, layout: ParallelLayout, cpu: bool) -> _Held:
    """What one rank holds under `strategy` (bytes), as its engine allocates it (`cpu`: on a CPU, over gloo)."""
    world, local = layout.world_size, layout.ranks_per_node
    if strategy == "ddp":
        # DDP's bucket copy of the gradients (`gradient_as_bucket_view=False`) counts them twice.
        return _Held(shape.weight_bytes, shape.gradient_bytes, shape.state_bytes, shape.gradient_bytes)
    stage = zero_stage(strategy)
    if stage is not None:
        zero = zero_bytes(
            stage,
            strategy.endswith("-offload"),
            weight_bytes=shape.weight_bytes,
            gradient_bytes=shape.gradient_bytes,
            trained=shape.trained,
            full=shape.full,
            dtype_bytes=shape.dtype_bytes,
            lora_states=shape.state_bytes,
            largest_layer=shape.largest_module,
            world=world,
            nodes=layout.nodes,
            parameters=shape.parameters,
            cpu=cpu,
        )
        buffers = zero.partition + zero.buckets + zero.gathered
        return _Held(zero.weights, zero.gradients, zero.states, buffers, zero.cpu_per_rank, zero.node_cpu)
    shards = local if strategy == "fsdp-hybrid" else world
    weights, grads, states = shape.weight_bytes, shape.gradient_bytes, shape.state_bytes
    if shape.mixed:
        # accelerate 1.16 utils/fsdp_utils.py: fsdp2_prepare_model upcasts every trained parameter to fp32 when
        # mixed_precision != "no" (HF Trainer's bf16=True): fp32 shards, fp32 gradients, fp32 AdamW moments; the
        # MixedPrecisionPolicy (param_dtype = reduce_dtype = the compute dtype) gathers and reduces in 16 bit.
        trained = shape.trained
        weights += trained * (FP32 - shape.dtype_bytes)
        grads, states = trained * FP32, trained * ADAM_STATES
    # Two layers unsharded (the running one and the prefetched one) and the tail unit (final norm + lm_head, or the
    # tied embedding), which fsdp2_prepare_model shards with reshard_after_forward=False: whole from the end of the
    # forward through the start of the backward. Tensor parallel's layers are sized as before (not offered for
    # training).
    buffers = 2 * shape.layer_bytes + shape.tail if strategy != "tp+fsdp" else 0
    if cpu and strategy != "tp+fsdp":
        # gloo stages an all-gather in a flat copy of its output before copying it into place (NCCL gathers in
        # place: policy/zero_bytes.py): one unit's weights more while it lands.
        buffers += max(shape.layer_bytes, shape.tail)
    return _Held(weights // shards, grads // shards, states // shards, buffers)


SHARDED_LOADING = (*FSDP_STRATEGIES, "deepspeed-zero3", "deepspeed-zero3-offload")
"""The strategies whose ranks load the model before their engine shards it (the others load their whole copy)."""


def _load_gpu(strategy: str, shape: TrainingShape) -> int:
    """GPU bytes a rank holds while loading, before sharding: a quantized base (QLoRA) loads whole onto each rank's
    GPU under FSDP2 and ZeRO-3 alike. transformers 5.25 quantizers/quantizer_bnb_4bit.py:
    Bnb4BitHfQuantizer.update_device_map puts it on the current device, transformers 5.25 modeling_utils.py:
    PreTrainedModel.get_init_context uses no zero.Init for a quantized model, and accelerate 1.16
    utils/fsdp_utils.py: fsdp2_prepare_model skips the meta move for Params4bit."""
    return shape.weight_bytes if shape.quantized and strategy in SHARDED_LOADING else 0


def _node_load_cpu(strategy: str, shape: TrainingShape) -> int:
    """CPU RAM the busiest node holds while loading: rank 0's whole copy. FSDP2: cudaload's other ranks build the
    model on the meta device and read no weights (loaders/fsdp_loading.py; accelerate 1.16 `fsdp2_prepare_model`
    broadcasts rank 0's weights into their shards under cpu_ram_efficient_loading), and rank 0 upcasts its trained
    parameters to fp32 in place first when mixed precision is on (the same function). ZeRO-3: cudaload's rank loads
    under an HfDeepSpeedConfig (loaders/zero3_loading.py), so rank 0 reads the checkpoint into CPU RAM and the
    others partition at load (transformers 5.25 modeling_utils.py: PreTrainedModel._load_pretrained_model). A
    quantized base loads on each rank's GPU instead; DDP and ZeRO-1/2 ranks load straight onto their GPU."""
    if shape.quantized or strategy not in SHARDED_LOADING:
        return 0
    if strategy not in FSDP_STRATEGIES:
        return shape.weight_bytes
    upcast = shape.trained * (FP32 - shape.dtype_bytes) if shape.mixed else 0
    return shape.weight_bytes + upcast


def _collectives(strategy: str, shape: TrainingShape, layout: ParallelLayout, micro_batch: int) -> list[_Move]:
    """Each collective of one step as (bytes a rank sends over the GPU links, bytes its rail sends across nodes)."""
    local, nodes = layout.ranks_per_node, layout.nodes
    grads, weights = shape.gradient_bytes, shape.weight_bytes
    if strategy == "ddp":
        return [_all_reduce(grads, local, nodes)]
    if strategy in ("deepspeed-zero1", "deepspeed-zero2"):
        # Gradients reduce-scattered, the updated 16-bit weights all-gathered.
        return [_ring(grads, local, nodes), _ring(shape.trained * shape.dtype_bytes, local, nodes)]
    if strategy == "fsdp-hybrid":
        inside = [_ring(weights, local, 1), _ring(weights, local, 1), _ring(grads, local, 1)]
        return [*inside, _all_reduce(grads / local, 1, nodes)]  # each rank's gradient shard, on its rail
    if strategy == "tp+fsdp":
        # Megatron TP: two all-reduces of the activations per layer, forward and backward, inside the node.
        acts = shape.tokens_per_sample * micro_batch * _hidden_bytes(shape)
        tp = [(2 * 2 * 2 * _ring(acts, local, 1)[0] * shape.layers, 0.0)]
        return [*tp, _ring(weights / local, 1, nodes), _ring(weights / local, 1, nodes), _ring(grads / local, 1, nodes)]
    # FSDP2 full shard and ZeRO-3 all-gather the weights twice (forward, and again in the backward after
    # resharding) and reduce-scatter the gradients.
    return [_ring(weights, local, nodes), _ring(weights, local, nodes), _ring(grads, local, nodes)]


_Move = tuple[float, float]


def _ring(size: float, local: int, nodes: int) -> _Move:
    """A ring all-gather or reduce-scatter of `size` bytes over `nodes` x `local` ranks: each rank sends (n-1)/n of
    it; of that, the node's rings cross to the next node once each, one ring per rail, so what crosses,
    (n-1)/n x size a node, is shared by the node's `local` rails."""
    n = local * nodes
    sent = (n - 1) / n * size if n > 1 else 0.0
    cross = sent / local if nodes > 1 else 0.0
    return sent - cross, cross


def _all_reduce(size: float, local: int, nodes: int) -> _Move:
    """An all-reduce of `size` bytes over `nodes` x `local` ranks as NCCL runs it across nodes: reduce-scatter and
    all-gather inside the node (2 (local-1)/local x size a rank), and each rank's 1/local share all-reduced over its
    rail (2 (nodes-1)/nodes x size/local). nccl-tests on 2 x 8 H100, 8 x 200 Gb/s a node: 8 GiB in 47.5 ms."""
    inside = 2 * (local - 1) / local * size
    cross = 2 * (nodes - 1) / nodes * size / local
    return inside, cross


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
