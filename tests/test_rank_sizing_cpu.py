"""What a CPU rank (gloo, as cudaload's real launch runs are tested) holds against a GPU rank of the same plan
(policy/zero_bytes.py): DeepSpeed's reduce buckets are `torch.empty` pages that only the gradients written into
them touch on a CPU (a GPU's caching allocator holds them whole), and gloo stages each all-gather in a flat copy
of its output (FSDP2: one unit; ZeRO-3: its prefetch bucket), which NCCL does not. ZeRO-3 keeps the weights its
parameter coordinator gathered from the second step on (`stage3_max_reuse_distance`), on either device."""

from __future__ import annotations

from pathlib import Path

import pytest

import cudaload
from cudaload.facts.interconnect import ParallelLayout, interconnect
from cudaload.facts.shapes import LLAMA_SHAPES
from cudaload.policy.rank_sizing import RankSize, TrainingShape, size_rank
from cudaload.policy.training_shape import full_training_shape
from cudaload.policy.zero_bytes import PREFETCH_ELEMENTS, REDUCE_BUCKET_ELEMENTS

PARAMETERS = 34_000_000
TRAINED = 1_500_000
LAYER = 4_200_000 * 4


def _lora() -> TrainingShape:
    """The shape of the real runs' model: a 34M fp32 Llama with 1.5M fp32 LoRA weights trained."""
    return TrainingShape(
        parameters=PARAMETERS, weight_bytes=4 * PARAMETERS, trained=TRAINED, full=False, dtype_bytes=4, layers=8,
        layer_bytes=LAYER, activations_per_sample=0, tokens_per_sample=64, checkpointing=False,
        tail_bytes=256 * 512 * 4,
    )  # fmt: skip


def _both(strategy: str, shape: TrainingShape, nodes: int = 2, local: int = 1) -> tuple[RankSize, RankSize]:
    layout = ParallelLayout(nodes, local, interconnect("infiniband-ndr"), True)
    gpu, cpu = (
        size_rank(strategy, shape, layout, micro_batch=1, gpu_link=450e9, tflops=None, overhead=0, cpu=on_cpu)
        for on_cpu in (False, True)
    )
    return gpu, cpu


@pytest.mark.parametrize("strategy", ["deepspeed-zero1", "deepspeed-zero2"])
def test_a_cpu_rank_counts_the_bucket_pages_its_gradients_touch(strategy: str) -> None:
    gpu, cpu = _both(strategy, _lora())
    # Two buckets of 5e8 fp32 elements on the GPU (overlap_comm); the CPU rank writes its 1.5M gradients.
    assert gpu.buffers - cpu.buffers == (2 * REDUCE_BUCKET_ELEMENTS - TRAINED) * 4
    assert cpu.buffers < 2 * 2**20 + TRAINED * 4  # no more than its gradients and fp32 partition
    # Training every weight of a 70B model fills both buckets on either device.
    full = full_training_shape(LLAMA_SHAPES["70B"], dtype="bfloat16", seq_len=2048, checkpointing=True)
    gpu, cpu = _both(strategy, full, 2, 8)
    assert gpu.buffers == cpu.buffers


def test_zero3_holds_the_gathered_weights_and_a_cpu_ranks_gloo_staging_copy() -> None:
    shape = _lora()
    for strategy in ("deepspeed-zero3", "deepspeed-zero3-offload"):
        gpu, cpu = _both(strategy, shape)
        # On a GPU: the estimator's 4 x largest layer (unknown here: 0), the whole bucket, and the whole model
        # gathered (34M weights < the 5.5e8 window).
        assert gpu.buffers - REDUCE_BUCKET_ELEMENTS * 4 == shape.weight_bytes
        # On a CPU: the bucket pages its gradients touch, the model gathered, and gloo's copy of that all-gather.
        assert cpu.buffers == TRAINED * 4 + 2 * shape.weight_bytes
    full = full_training_shape(LLAMA_SHAPES["70B"], dtype="bfloat16", seq_len=2048, checkpointing=True)
    gpu, cpu = _both("deepspeed-zero3", full, 2, 8)
    assert cpu.buffers - gpu.buffers == 2 * PREFETCH_ELEMENTS  # one bf16 prefetch bucket staged by gloo


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp-hybrid"])
def test_fsdp2_on_gloo_stages_one_gathered_unit(strategy: str) -> None:
    gpu, cpu = _both(strategy, _lora(), 2, 2)
    assert cpu.buffers - gpu.buffers == LAYER  # a decoder layer, the largest unit FSDP2 gathers here
    ddp_gpu, ddp_cpu = _both("ddp", _lora(), 2, 2)
    assert ddp_gpu == ddp_cpu  # DDP gathers nothing


def test_a_plan_for_cpu_ranks_sizes_them_as_cpu_ranks_and_says_so(tiny_models: dict[str, Path]) -> None:
    cpu_machine = cudaload.Machine.simulated(None, cpu_memory_gib=64)
    kwargs = {"finetune": True, "nodes": 2, "parallelism": "deepspeed-zero2", "quantize": None}
    cpu = cudaload.plan(tiny_models["llama"], machine=cpu_machine, **kwargs)
    gpu = cudaload.plan(tiny_models["llama"], machine=cudaload.Machine.simulated("H100", count=8), **kwargs)
    assert cpu.finetune is not None and gpu.finetune is not None
    cpu_buffers = cpu.finetune.parallelism["sizes"]["deepspeed-zero2"]["buffers"]
    gpu_buffers = gpu.finetune.parallelism["sizes"]["deepspeed-zero2"]["buffers"]
    assert gpu_buffers >= 2 * REDUCE_BUCKET_ELEMENTS * 2  # the whole buckets on the GPU
    assert cpu_buffers < REDUCE_BUCKET_ELEMENTS  # only what a tiny model's gradients write on the CPU
    assert "CPU ranks over gloo" in cpu.decision("parallelism").reason
    assert "gloo" not in gpu.decision("parallelism").reason
