"""What DeepSpeed ZeRO holds on a rank, and in a node's CPU RAM, at each stage: DeepSpeed 0.19.8's own
estimators and allocations, so a plan's ZeRO numbers are DeepSpeed's. Pure arithmetic (policy/rank_sizing.py
calls it for the "deepspeed-zero*" strategies).

With bf16 (or fp16) DeepSpeed keeps 16-bit weights and gradients, an fp32 master copy and two fp32 Adam moments
(the ZeRO paper's 2 + 2 + 12 bytes a parameter, Rajbhandari et al. 2020, section 3.1), and one more fp32 gradient
partition:

- ZeRO-1 (optimizer states partitioned) and ZeRO-2 (and gradients), deepspeed 0.19.8
  runtime/zero/stage_1_and_2.py: `DeepSpeedZeroOptimizer` (`single_partition_of_fp32_groups`, whose `.grad` is the
  fp32 gradient partition): ZeRO-2 is `estimate_zero2_model_states_mem_needs` (cpu_offload=False), 2P + 18P/N
  bytes, 18 = 2 16-bit gradients + 4 fp32 gradients + 4 fp32 weights + 8 moments. ZeRO-1 is the same optimizer
  with whole 16-bit gradients (`partition_gradients` false): 4P + 16P/N (DeepSpeed has no ZeRO-1 estimator).
  Both stage the gradient reduction in reduce buckets of `DeepSpeedZeroConfig.reduce_bucket_size` elements
  (5e8 by default, runtime/zero/config.py), in the 16-bit dtype (`_gradient_reduction_buffer_dtype`), two of them
  with `overlap_comm` (`DeepSpeedZeroOptimizer.setup_buckets`), as cudaload's ds_config sets it. The updated
  weights are all-gathered into the 16-bit flat buffer in place (runtime/utils.py: `all_gather_dp_groups` with
  `all_gather_into_tensor`), so `allgather_bucket_size` allocates nothing.
- ZeRO-3, runtime/zero/stage3.py: `estimate_zero3_model_states_mem_needs`: 4 x the largest layer's parameters
  (its own parameters, not its children's: `model_to_params`) + 18P/N on the GPU; with the optimizer in CPU RAM
  (cpu_offload=True, cpu_offload_params=False: what cudaload's ds_config asks) 4 x largest + 2P/N on the GPU and
  16P x 1.5 / nodes in each node's CPU RAM (zero_init: transformers builds the model under `zero.Init`). Its
  one reduce bucket (`DeepSpeedZeroOptimizer_Stage3.__init__`, `ipg_buckets`) comes on top, and so do the weights
  the parameter coordinator keeps gathered, which the estimator leaves out (runtime/zero/partitioned_param_coordinator
  .py: `PartitionedParameterCoordinator.__params_to_release` keeps a module's weights whenever they are used again
  within `stage3_max_reuse_distance`, 1e9 elements by default, counted along the traced forward and backward, so
  from the second step the forward's last 5e8 elements stay gathered until the backward reaches them, and
  `fetch_sub_module` prefetches `stage3_prefetch_bucket_size`, 5e7, ahead): up to 5.5e8 weights as loaded, the
  whole model when smaller (measured on this machine, 2026-12-06: a 34M-weight model's step 2 gathers all of it).

On a CPU rank (the gloo backend, as cudaload's real launch runs are tested) two terms differ from a GPU's, and
the plan for a CPU rank says so: the reduce buckets are `torch.empty` pages that only the gradients written into
them ever touch (a GPU's caching allocator holds all of them), so a CPU rank counts min(buckets, trained
parameters) elements; and gloo stages each all-gather in a flat copy of its output before copying it into place
(torch 2.13 distributed/ProcessGroupGloo: `allgather_into_tensor` through a flat output tensor; measured on this
machine: a 95 MiB all_gather_into_tensor peaks at 192 MiB), so ZeRO-3's largest all-gather, a prefetch bucket,
is held twice while it lands. NCCL gathers in place.

The estimators count every parameter as trained; here `trained` parameters get the states and gradients (LoRA:
only the adapters), and `additional_buffer_factor` (1.5) applies to the CPU figure only, as in DeepSpeed.
"""

from __future__ import annotations

from ..frozen import frozen

__all__ = [
    "GATHERED_ELEMENTS",
    "LARGEST_LAYER_FACTOR",
    "PREFETCH_ELEMENTS",
    "REDUCE_BUCKET_ELEMENTS",
    "ZERO_CPU_BUFFER_FACTOR",
    "ZeroBytes",
    "zero_bytes",
]

REDUCE_BUCKET_ELEMENTS = 500_000_000
"""deepspeed 0.19.8 runtime/zero/config.py: `DeepSpeedZeroConfig.reduce_bucket_size` (its default, 5e8 elements;
cudaload's ds_config leaves it unset)."""
PREFETCH_ELEMENTS = 50_000_000
"""deepspeed 0.19.8 runtime/zero/config.py: `DeepSpeedZeroConfig.prefetch_bucket_size`
(`stage3_prefetch_bucket_size`, 5e7 elements by default; cudaload's ds_config leaves it unset): the most weights
one prefetch all-gathers."""
GATHERED_ELEMENTS = 1_000_000_000 // 2 + PREFETCH_ELEMENTS
"""The most weights a ZeRO-3 rank keeps gathered between the forward and the backward: the forward's last half
of `DeepSpeedZeroConfig.max_reuse_distance` (`stage3_max_reuse_distance`, 1e9 elements by default, counted
forward and back again) and one prefetch bucket ahead."""
ZERO_CPU_BUFFER_FACTOR = 1.5
"""`additional_buffer_factor` of DeepSpeed's estimators (deepspeed 0.19.8 runtime/zero/stage3.py:
`estimate_zero3_model_states_mem_needs`): the CPU RAM figure's margin."""
LARGEST_LAYER_FACTOR = 4
"""Bytes a parameter of the largest layer that ZeRO-3 gathers (`estimate_zero3_model_states_mem_needs`:
`largest_layer_memory = 4 * largest_layer_params`)."""
FP32 = 4
MOMENTS = 2 * FP32


@frozen
class ZeroBytes:
    """One ZeRO stage's bytes on one rank (GPU) and in one node's CPU RAM.

    Attributes:
        weights, gradients, states: The paper's model states on the rank: 16-bit weights and gradients, and the
            fp32 master weights + two fp32 moments (Rajbhandari et al. 2020 Table 1 counts these).
        partition: DeepSpeed's fp32 gradient partition beyond the paper's figure (stages 1-2: 4 bytes a trained
            parameter / N; stage 3: the estimator's 18 against the paper's 16 bytes, 2 / N), and ZeRO-3's
            gathered largest layer.
        buckets: The reduce buckets (a CPU rank: the part of them its gradients touch).
        gathered: ZeRO-3: the weights the parameter coordinator keeps gathered (`GATHERED_ELEMENTS`, or the
            whole model), and on a CPU rank gloo's staging copy of the largest all-gather; 0 for stages 1-2.
        cpu_per_rank: What the rank keeps in CPU RAM (ZeRO-3 offload), without the buffer factor.
        node_cpu: The CPU RAM one node needs for it: DeepSpeed's estimate, with its 1.5 buffer factor.
    """

    weights: int
    gradients: int
    states: int
    partition: int
    buckets: int
    cpu_per_rank: int
    node_cpu: int
    gathered: int = 0

    @property
    def estimator_gpu(self) -> int:
        """The GPU figure DeepSpeed's estimators give (model states, no buckets)."""
        return self.weights + self.gradients + self.states + self.partition


def zero_bytes(
    stage: int,
    offload: bool,
    *,
    weight_bytes: int,
    gradient_bytes: int,
    trained: int,
    full: bool,
    dtype_bytes: int,
    lora_states: int,
    largest_layer: int,
    world: int,
    nodes: int,
    parameters: int = 0,
    cpu: bool = False,
) -> ZeroBytes:
    """ZeRO `stage` (1-3; `offload`: stage 3 with the optimizer in CPU RAM) over `world` ranks on `nodes` nodes.
    `weight_bytes`: all weights as loaded; `gradient_bytes`: the trained parameters' gradients; `lora_states`:
    LoRA's adapter weights + states as the training estimate counts them (used when not `full`); `parameters`:
    all weights (ZeRO-3's gathered window; 0: none counted); `cpu`: a CPU rank on gloo (the buckets' touched
    pages, gloo's all-gather staging)."""
    mixed = full and dtype_bytes < FP32
    states = trained * (MOMENTS + (FP32 if mixed else 0)) if full else lora_states
    # The fp32 gradient partition DeepSpeed keeps beside the paper's 16-bit one (the estimators' "4_grads_32bit").
    extra = trained * (FP32 if stage < 3 else FP32 - dtype_bytes) if mixed else 0
    # Two buckets with overlap_comm (stages 1-2), one for stage 3; a CPU rank writes only its gradients into them.
    bucket_elements = REDUCE_BUCKET_ELEMENTS * (2 if stage < 3 else 1)
    buckets = (min(bucket_elements, trained) if cpu else bucket_elements) * dtype_bytes
    if stage < 3:
        grads = gradient_bytes if stage == 1 else gradient_bytes // world
        return ZeroBytes(weight_bytes, grads, states // world, extra // world, buckets, 0, 0)
    layer = LARGEST_LAYER_FACTOR * largest_layer
    per_weight = weight_bytes / max(parameters, 1)
    gathered = min(parameters, GATHERED_ELEMENTS) + (min(parameters, PREFETCH_ELEMENTS) if cpu else 0)
    window = int(gathered * per_weight)
    if not offload:
        return ZeroBytes(weight_bytes // world, gradient_bytes // world, states // world, extra // world + layer,
                         buckets, 0, 0, window)  # fmt: skip
    on_cpu = gradient_bytes + states + extra
    node_cpu = int(on_cpu * (1 / nodes) * ZERO_CPU_BUFFER_FACTOR)  # the estimator's order of operations
    return ZeroBytes(weight_bytes // world, 0, 0, layer, buckets, on_cpu // world, node_cpu, window)
