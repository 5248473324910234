"""cudaload's DeepSpeed ZeRO numbers equal DeepSpeed 0.19.8's own estimators, called here: ZeRO-2
(`estimate_zero2_model_states_mem_needs`), ZeRO-3 (`estimate_zero3_model_states_mem_needs`, its largest layer
read from a real model by DeepSpeed's `model_to_params`) and ZeRO-3 with the optimizer in CPU RAM (the GPU figure
and each node's CPU RAM), for several models and layouts; and the reduce bucket is DeepSpeed's default.

CI installs deepspeed (DS_BUILD_OPS=0) after the main suite and runs this file then (.ci/run); without it the
module skips at import, as tests/test_torchao_load.py does for torchao. Without deepspeed the ZeRO paper's
published figures check the same arithmetic (tests/test_rank_sizing_engines.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs, model_to_params
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

import cudaload
from cudaload.facts.interconnect import ParallelLayout, interconnect
from cudaload.facts.model import ModelFacts
from cudaload.facts.shapes import LLAMA_SHAPES
from cudaload.policy.rank_sizing import RankSize, size_rank
from cudaload.policy.training_shape import full_training_shape
from cudaload.policy.zero_bytes import GATHERED_ELEMENTS, PREFETCH_ELEMENTS, REDUCE_BUCKET_ELEMENTS

LAYOUTS = [(1, 8), (2, 8), (16, 8), (4, 4)]
BUCKET = REDUCE_BUCKET_ELEMENTS * 2  # bf16


def _tiny() -> tuple[ModelFacts, int, int]:
    """A real (tiny, untied) Llama: its facts, and DeepSpeed's (total, largest layer) parameters of the model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False, dtype="bfloat16",
    )  # fmt: skip
    total, largest = model_to_params(LlamaForCausalLM(config))  # on the CPU: it tells parameters by data_ptr()
    return cudaload.read_model_facts(config), total, largest


def _size(strategy: str, facts: ModelFacts, nodes: int, local: int) -> RankSize:
    shape = full_training_shape(facts, dtype="bfloat16", seq_len=512, checkpointing=True)
    layout = ParallelLayout(nodes, local, interconnect("infiniband-ndr"))
    return size_rank(strategy, shape, layout, micro_batch=1, gpu_link=450e9, tflops=989.0, overhead=0)


def _gathered(facts: ModelFacts) -> int:
    """The bf16 weights ZeRO-3's coordinator keeps gathered, which the estimator leaves out."""
    return 2 * min(facts.parameters, GATHERED_ELEMENTS)


def _models() -> list[tuple[ModelFacts, int | None]]:
    tiny, total, largest = _tiny()
    assert tiny.parameters == total  # the facts count what DeepSpeed counts
    return [(tiny, largest), *((LLAMA_SHAPES[n], None) for n in ("7B", "70B", "405B"))]


@pytest.mark.parametrize(("nodes", "local"), LAYOUTS)
def test_zero2_and_zero3_equal_deepspeeds_estimators(nodes: int, local: int) -> None:
    for facts, largest in _models():
        params = facts.parameters
        largest = largest or max(facts.vocab_size * facts.hidden_size, *(i * o for _, i, o, _ in facts.linear_shapes))
        _, zero2_gpu = estimate_zero2_model_states_mem_needs(params, local, nodes, cpu_offload=False)
        zero2 = _size("deepspeed-zero2", facts, nodes, local)
        # The estimator counts the model states; the two reduce buckets (overlap_comm) come on top.
        assert zero2.buffers >= 2 * BUCKET
        assert zero2.weights + zero2.gradients + zero2.states + zero2.buffers - 2 * BUCKET == pytest.approx(
            zero2_gpu, abs=4
        )
        _, zero3_gpu, _ = estimate_zero3_model_states_mem_needs(
            params, largest, local, nodes, cpu_offload=False, cpu_offload_params=False
        )
        zero3 = _size("deepspeed-zero3", facts, nodes, local)
        # The estimator counts the model states; the reduce bucket and the gathered window come on top.
        extra = BUCKET + _gathered(facts)
        assert zero3.weights + zero3.gradients + zero3.states + zero3.buffers - extra == pytest.approx(zero3_gpu, abs=4)


@pytest.mark.parametrize(("nodes", "local"), LAYOUTS)
def test_zero3_offload_gpu_and_node_cpu_ram_equal_deepspeeds_estimator(nodes: int, local: int) -> None:
    for facts, largest in _models():
        largest = largest or max(facts.vocab_size * facts.hidden_size, *(i * o for _, i, o, _ in facts.linear_shapes))
        # What cudaload's ds_config asks: offload_optimizer to the CPU, the parameters on the GPU; zero.Init.
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            facts.parameters, largest, local, nodes, cpu_offload=True, cpu_offload_params=False, zero_init=True
        )
        size = _size("deepspeed-zero3-offload", facts, nodes, local)
        assert size.node_cpu == cpu  # per node, with DeepSpeed's 1.5 buffer factor
        assert size.gradients == size.states == 0
        assert size.weights + size.buffers - BUCKET - _gathered(facts) == pytest.approx(gpu, abs=4)


def test_the_reduce_bucket_and_the_gathered_window_are_deepspeeds_defaults() -> None:
    config = DeepSpeedZeroConfig()
    assert config.reduce_bucket_size == REDUCE_BUCKET_ELEMENTS
    assert config.prefetch_bucket_size == PREFETCH_ELEMENTS
    assert config.max_reuse_distance // 2 + config.prefetch_bucket_size == GATHERED_ELEMENTS
