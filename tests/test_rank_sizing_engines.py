"""Each rank's numbers as the engines hold them and as published measurements give them: the ZeRO paper's
Table 1 (Rajbhandari et al. 2020), torch AdamW's state measured after a step, accelerate 1.16's FSDP2 units,
the loading peaks, and a cross-node all-reduce against nccl-tests. DeepSpeed's own estimators, called:
tests/test_zero_estimators.py (where deepspeed is installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cudaload
from cudaload.errors import SettingError
from cudaload.facts.interconnect import INTERCONNECTS, ParallelLayout, interconnect
from cudaload.facts.shapes import LLAMA_SHAPES
from cudaload.policy.parallelism import decide_parallelism
from cudaload.policy.rank_sizing import RankSize, TrainingShape, size_rank
from cudaload.policy.training_shape import full_training_shape, training_shape

H100 = cudaload.Machine.simulated("H100", count=8)
L70, L405 = LLAMA_SHAPES["70B"], LLAMA_SHAPES["405B"]
GIB = 2**30


def _full_shape(parameters: int) -> TrainingShape:
    return TrainingShape(
        parameters=parameters, weight_bytes=2 * parameters, trained=parameters, full=True, dtype_bytes=2, layers=1,
        layer_bytes=0, activations_per_sample=0, tokens_per_sample=1, checkpointing=False,
    )  # fmt: skip


def _size(strategy: str, shape: TrainingShape, nodes: int, local: int, link: str = "infiniband-ndr") -> RankSize:
    layout = ParallelLayout(nodes, local, interconnect(link), True)
    return size_rank(strategy, shape, layout, micro_batch=1, gpu_link=450e9, tflops=989.0, overhead=0)


# Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", Table 1: GB a
# device for a 7.5B model, P_os / P_os+g / P_os+g+p (Figure 1: 31.4, 16.6 and 1.88 GB on 64 GPUs).
ZERO_TABLE_1 = {4: (52.5, 41.3, 30.0), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88), 256: (30.4, 15.4, 0.47)}


@pytest.mark.parametrize("devices", sorted(ZERO_TABLE_1))
def test_zero_stages_hold_the_model_states_of_the_zero_paper(devices: int) -> None:
    shape = _full_shape(7_500_000_000)
    nodes, local = (1, devices) if devices < 8 else (devices // 8, 8)
    stages = ("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")
    for strategy, published in zip(stages, ZERO_TABLE_1[devices], strict=True):
        size = _size(strategy, shape, nodes, local)
        # The paper's model states: 16-bit weights and gradients + fp32 master weights and two moments.
        assert (size.weights + size.gradients + size.states) / 1e9 == pytest.approx(published, rel=0.01), strategy


def test_asking_for_deepspeed_gets_zero1_where_it_fits() -> None:
    plan = cudaload.plan(LLAMA_SHAPES["7B"], machine=H100, finetune=True, nodes=2, parallelism="deepspeed")
    decision = plan.decision("parallelism")
    assert decision.value == "deepspeed-zero1" and decision.reason.startswith("DeepSpeed ZeRO-1")
    sizes = plan.finetune.parallelism["sizes"]
    assert sizes["deepspeed-zero1"]["total"] > sizes["deepspeed-zero2"]["total"]  # whole gradients


def test_zero1_and_zero2_count_deepspeeds_two_reduce_buckets() -> None:
    shape = _full_shape(1_000_000_000)
    zero2 = _size("deepspeed-zero2", shape, 1, 8)
    # 5e8 bf16 elements twice (overlap_comm), + the fp32 gradient partition (4 bytes a parameter / 8).
    assert zero2.buffers == 2 * 500_000_000 * 2 + 4 * 1_000_000_000 // 8


def test_torch_adamw_keeps_moments_in_the_parameters_dtype(tiny_models: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen3"], dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step")
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    parameters = sum(p.numel() for p in model.parameters())
    facts = cudaload.read_model_facts(str(tiny_models["qwen3"]))
    shape = full_training_shape(facts, dtype="bfloat16", seq_len=16, checkpointing=False)
    assert shape.trained == parameters
    assert (shape.state_bytes, shape.gradient_bytes) == (held, grads) == (4 * parameters, 2 * parameters)


def test_fsdp2_shards_fp32_master_state_and_keeps_only_the_tail_whole() -> None:
    shape = full_training_shape(L70, dtype="bfloat16", seq_len=2048, checkpointing=True)
    fsdp = _size("fsdp", shape, 2, 8)
    params = L70.parameters
    # fsdp2_prepare_model upcasts the trained parameters to fp32: fp32 shards, gradients and moments.
    assert (fsdp.weights, fsdp.gradients, fsdp.states) == (params * 4 // 16, params * 4 // 16, params * 8 // 16)
    # Two gathered layers + final norm and lm_head; the input embeddings are their own unit.
    tail = (L70.vocab_size * L70.hidden_size + L70.hidden_size) * 2
    assert fsdp.buffers == 2 * shape.layer_bytes + tail
    ddp = _size("ddp", shape, 2, 8)
    assert (ddp.weights, ddp.gradients, ddp.states, ddp.buffers) == (2 * params, 2 * params, 4 * params, 2 * params)


def test_qlora_under_fsdp2_counts_the_whole_4bit_model_each_rank_loads() -> None:
    plan = cudaload.plan(L405, machine=H100, finetune=True, nodes=1)
    sizes = plan.finetune.parallelism["sizes"]
    assert plan.decision("quantize").value == "4bit"
    assert sizes["fsdp"]["load_gpu"] > 190 * GIB and sizes["fsdp"]["total"] >= sizes["fsdp"]["load_gpu"]
    assert plan.decision("parallelism").value is None  # nothing fits an 80 GB card while loading 405B in 4 bit
    assert "while loading" in {r.value: r.reason for r in plan.decision("parallelism").rejected}["fsdp"]


def test_loading_holds_rank_0s_cpu_copy_under_fsdp2_and_zero3_and_offload_deepspeeds_cpu_figure() -> None:
    shape = full_training_shape(L70, dtype="bfloat16", seq_len=2048, checkpointing=True)
    params = L70.parameters
    fsdp, zero3 = _size("fsdp", shape, 2, 8), _size("deepspeed-zero3", shape, 2, 8)
    assert fsdp.node_load_cpu == 2 * params + 2 * params  # rank 0's bf16 copy, upcast to fp32 (the others: meta)
    assert zero3.node_load_cpu == 2 * params and _size("ddp", shape, 2, 8).node_load_cpu == 0
    offload = _size("deepspeed-zero3-offload", shape, 1, 8)
    assert offload.node_cpu == int(16 * params * 1.5)  # DeepSpeed's 16 bytes a parameter x 1.5, a node


# nccl-tests all_reduce_perf, 8 GiB on 2 x 8 H100 with 8 x 200 Gb/s NICs a node: 47.5 ms (busbw 339 GB/s),
# the figure of issue 45 (cudaload said 805 ms charging the whole volume to one GPU's share of the network).
def test_a_cross_node_all_reduce_runs_a_ring_per_rail_as_nccl_tests_measure() -> None:
    gradients = 8 * GIB
    ddp = _size("ddp", _full_shape(gradients // 2), 2, 8, "infiniband-hdr")
    assert ddp.comm_s == pytest.approx(47.5e-3, rel=0.25)
    # The node's NICs carry it in parallel: one 100 GbE NIC a node is 8 x slower than eight.
    one, eight = (_size("ddp", _full_shape(gradients // 2), 2, 8, f"ethernet-100g:{n}") for n in (1, 8))
    assert one.comm_s == pytest.approx(8 * eight.comm_s, rel=1e-9)


def test_interconnect_takes_the_nics_a_node_has() -> None:
    two = interconnect("ethernet-100g:2")
    assert two.ports_per_node == 2 and two.node_bytes_per_s(8) == 25e9 and "2 x 100 Gb/s" in two.label
    assert interconnect("InfiniBand_NDR:4").node_bytes_per_s(8) == 4 * 50e9
    assert interconnect("infiniband-ndr") is INTERCONNECTS["infiniband-ndr"]  # a NIC per GPU
    for bad in ("ethernet-100g:0", "ethernet-100g:x", "infiniband-ndr:", "ethernet-100g:2:3", "ethernet-100g:65"):
        with pytest.raises(SettingError, match="NIC count"):
            interconnect(bad)
    with pytest.raises(SettingError, match="ethernet-100g:2"):
        interconnect("token-ring:2")


def test_the_cli_plans_with_the_nics_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import LlamaConfig

    from cudaload.cli import main

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                         vocab_size=32000, dtype="bfloat16")  # fmt: skip
    config.save_pretrained(tmp_path / "m")
    argv = ["plan", str(tmp_path / "m"), "--finetune", "--gpu", "H100", "--count", "8", "--nodes", "2", "--json"]
    assert main([*argv, "--interconnect", "ethernet-100g:2"]) == 0
    assert json.loads(capsys.readouterr().out)["extras"]["parallelism"]["interconnect"] == "ethernet-100g:2"
    with pytest.raises(SystemExit):
        main([*argv, "--interconnect", "ethernet-100g:zero"])
    assert "NIC count" in capsys.readouterr().err


def test_training_shape_takes_deepspeeds_largest_layer() -> None:
    shape = training_shape(
        L70, dtype="bfloat16", weight_bytes=2 * L70.parameters, trained=L70.parameters, full=True,
        activations_per_sample=0, tokens=1, checkpointing=False,
    )  # fmt: skip
    assert shape.largest_module == L70.vocab_size * L70.hidden_size  # the embeddings, 1.05B parameters
    layout = ParallelLayout(2, 8, interconnect("infiniband-ndr"), True)
    _, choice = decide_parallelism(H100, L70, layout, shape, "auto", 1)
    # The estimator's 4 x largest layer and fp32 gradient partition, the 5e8-element bf16 reduce bucket, and the
    # 5.5e8 bf16 weights DeepSpeed's coordinator keeps gathered (reuse distance / 2 + one prefetch bucket).
    gathered = 2 * (5 * 10**8 + 5 * 10**7)
    assert choice.sizes["deepspeed-zero3"].buffers == (
        4 * shape.largest_module + 2 * L70.parameters // 16 + 10**9 + gathered
    )
