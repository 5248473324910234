"""Every strategy a training plan chooses is one cudaload can apply (issue 45): no tensor parallel for training,
ZeRO-3 offload only where the node's RAM holds its CPU state, 16 or 4 bits by the estimated step time, no 8-bit
optimizer on sharded parameters, and a launched rank only the strategies its launcher's engine applies."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import cudaload
from cudaload.cli import main
from cudaload.errors import FinetuneConfigError, PlacementError, SettingError
from cudaload.facts.interconnect import ParallelLayout, interconnect
from cudaload.facts.machine import GiB, Launch
from cudaload.facts.shapes import LLAMA_SHAPES
from cudaload.policy.parallel_reasons import cpu_bytes_per_node
from cudaload.policy.parallelism import decide_parallelism
from cudaload.policy.training_shape import full_training_shape

QLORA = {"bitsandbytes": "0.50.2", "peft": "0.21.2"}
H100 = cudaload.Machine.simulated("H100", count=8, packages=QLORA)
L7, L70, L405 = LLAMA_SHAPES["7B"], LLAMA_SHAPES["70B"], LLAMA_SHAPES["405B"]
TiB = 1024 * GiB


def _plan(model, nodes: int | None = 1, machine=H100, **kwargs):
    return cudaload.plan(model, machine=machine, finetune=True, nodes=nodes, **kwargs)


def _full(model, nodes: int, machine=H100, **kwargs):
    """Full training (every weight, mixed-precision AdamW) on nodes x 8, InfiniBand NDR between nodes."""
    layout = ParallelLayout(nodes, 8, interconnect("infiniband-ndr"), True)
    shape = full_training_shape(model, dtype="bfloat16", seq_len=2048, checkpointing=True)
    return decide_parallelism(machine, model, layout, shape, "auto", 1, **kwargs)


def _rejected(plan_or_decision, setting: str = "parallelism") -> dict:
    decision = plan_or_decision.decision(setting) if hasattr(plan_or_decision, "decision") else plan_or_decision
    return {r.value: r.reason for r in decision.rejected}


def _launched(**launch) -> cudaload.Machine:
    """One of 8 H100 ranks of a one-node launch."""
    return cudaload.Machine.simulated(
        "H100", count=8, packages=QLORA, launch=Launch(world_size=8, local_world_size=8, **launch)
    )


# ---- 1. tensor parallel is not a training strategy ---------------------------------------------------------


def test_tensor_parallel_is_not_chosen_for_training_and_the_rejection_says_why() -> None:
    """70B full training on 2x8 H100 was planned "tp+fsdp" (issue 45: ranks then loaded whole models and
    accelerate skipped TP): now another strategy, with tensor parallel rejected for training."""
    decision, choice = _full(L70, 2)
    assert decision.value != "tp+fsdp" and "tp+fsdp" not in choice.sizes
    assert _rejected(decision)["tp+fsdp"].startswith("tensor parallel is not offered for training")
    roomy = cudaload.Machine.simulated("H100", count=8, packages=QLORA, cpu_memory_gib=2048)
    decision, _ = _full(L70, 2, machine=roomy)
    assert decision.value == "deepspeed-zero3-offload"  # with 2 TiB a node, the CPU state fits
    lora = _plan(L405, nodes=2, interconnect="infiniband-ndr")  # 405B LoRA 2x8 H100: was "tp+fsdp" in 16 bit
    assert lora.decision("parallelism").value != "tp+fsdp"
    assert "logits" in _rejected(lora)["tp+fsdp"]


def test_tensor_parallel_asked_for_training_is_refused_saying_what_to_pass() -> None:
    with pytest.raises(PlacementError, match=r"parallelism='tp\+fsdp' was asked, but tensor parallel is not offered "
                       r"for training.*Pass parallelism='auto', 'fsdp' or 'fsdp-hybrid'"):  # fmt: skip
        _plan(L70, nodes=2, quantize=None, parallelism="tp+fsdp")


# ---- 2. the node's RAM -------------------------------------------------------------------------------------


def test_zero3_offload_must_fit_the_nodes_ram() -> None:
    """70B full training on 1x8 H100: ZeRO-3 offload's 788 GiB of CPU state was accepted on a node of 64 GiB."""
    decision, choice = _full(L70, 1)  # a simulated GPU node's RAM: twice its GPU memory, said to be assumed
    assert decision.value is None
    offload = choice.sizes["deepspeed-zero3-offload"]
    assert offload.total <= choice.budget  # it fits each GPU: only the node's RAM rules it out
    reason = _rejected(decision)["deepspeed-zero3-offload"]
    node = 2 * sum(g.total_memory for g in H100.gpus)
    assert choice.as_dict()["node_memory"] == node and choice.as_dict()["node_memory_assumed"]
    assert reason.startswith("does not fit: its CPU RAM a node") and f"{node / GiB:.1f} GiB" in reason
    assert "assumed: twice the node's GPU memory" in reason
    per_node = cpu_bytes_per_node(offload, choice.layout)  # DeepSpeed's estimate: 1.5 x the offloaded state
    assert per_node >= offload.cpu_offloaded * 8
    assert f"{per_node / GiB:.1f} GiB" in reason
    bigger = cudaload.Machine.simulated("H100", count=8, packages=QLORA, cpu_memory_gib=2 * per_node // GiB)
    decision, choice = _full(L70, 1, machine=bigger)
    assert decision.value == "deepspeed-zero3-offload" and "a node" in decision.reason
    assert choice.as_dict()["node_memory"] == bigger.cpu.memory_total


def test_node_memory_is_an_input_of_plan_and_launch_files(tmp_path: Path) -> None:
    asked = dict(nodes=1, quantize=None, parallelism="deepspeed-zero3-offload")
    plan = _plan(L70, **asked, node_memory="2TiB")
    assert plan.decision("parallelism").value == "deepspeed-zero3-offload"
    assert plan.finetune.parallelism["node_memory"] == 2 * TiB and not plan.finetune.parallelism["node_memory_assumed"]
    per_node = plan.finetune.parallelism["sizes"]["deepspeed-zero3-offload"]["cpu_offloaded"] * 8
    with pytest.raises(
        PlacementError, match=r"deepspeed-zero3-offload does not fit: its CPU RAM a node.*--node-memory"
    ):
        _plan(L70, **asked, node_memory=per_node)  # bytes; 90 % of them is usable
    with pytest.raises(SettingError, match="node_memory='lots'"):
        _plan(L70, **asked, node_memory="lots")
    with pytest.raises(FinetuneConfigError, match="node_memory"):
        cudaload.plan(L70, machine=H100, node_memory="1TiB")
    files = cudaload.launch_files(L70, machine=H100, emit=["torchrun"], node_memory="2TiB", **asked)
    assert files.plan.finetune.parallelism["node_memory"] == 2 * TiB


def test_a_real_machines_ram_is_the_default(tmp_path: Path) -> None:
    here = replace(H100, source="nvml", cpu=replace(H100.cpu, memory_total=512 * GiB))
    decision, choice = _full(L70, 1, machine=here)
    assert "512.0 GiB (this machine's" in _rejected(decision)["deepspeed-zero3-offload"]
    assert choice.as_dict()["node_memory_assumed"] is False


def test_cli_node_memory(llama70b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(llama70b), "--finetune", "--gpu", "H100", "--count", "8", "--nodes", "1", "--quantize", "none"]
    argv += ["--with", "peft==0.21.2"]
    argv += ["--parallelism", "deepspeed-zero3-offload", "--json"]
    assert main([*argv, "--node-memory", "2TiB"]) == 0
    assert json.loads(capsys.readouterr().out)["extras"]["parallelism"]["node_memory"] == 2 * TiB
    assert main([*argv, "--node-memory", "1GiB"]) != 0
    assert "does not fit: its CPU RAM a node" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", str(llama70b), "--gpu", "H100", "--node-memory", "2TiB"])
    assert "--node-memory describes a fine-tuning plan: add --finetune" in capsys.readouterr().err


# ---- 3. 16 or 4 bits by the step time ----------------------------------------------------------------------


def test_a_4_bit_base_that_trains_faster_across_the_ranks_is_kept() -> None:
    """70B LoRA on 4 nodes of one H100: 16-bit needs full shard over the network (comm-bound), where the 4-bit
    base fits each rank whole (DDP, only LoRA's gradients cross): the faster one wins, the reason gives both."""
    one = cudaload.Machine.simulated("H100", count=1, packages=QLORA)
    plan = _plan(L70, nodes=4, machine=one, interconnect="infiniband-ndr")
    sixteen = _plan(L70, nodes=4, machine=one, interconnect="infiniband-ndr", quantize=None)
    four = _plan(L70, nodes=4, machine=one, interconnect="infiniband-ndr", quantize="4bit")

    def tokens_per_s(p) -> float:
        section = p.finetune.parallelism
        size = section["sizes"][section["strategy"]]
        return size["sequences"] * 2048 / max(size["compute_s"], size["comm_s"])

    assert tokens_per_s(four) > tokens_per_s(sixteen)
    quantize = plan.decision("quantize")
    assert quantize.value == "4bit" and plan.decision("parallelism").value == four.decision("parallelism").value
    for plan_ in (sixteen, four):
        assert f"~{tokens_per_s(plan_) / 1000:.1f}k tokens/s" in quantize.reason
    assert "16-bit" in quantize.reason and "trains slower" in _rejected(quantize, "quantize")[None]
    assert plan.kwargs["quantization_config"]["load_in_4bit"] is True


def test_sixteen_bits_kept_when_no_slower_and_when_the_step_time_is_unknown() -> None:
    plan = _plan(L70, nodes=2, interconnect="infiniband-ndr")  # 16-bit hybrid shard is compute-bound: kept
    assert plan.decision("quantize").value is None
    assert "tokens/s" in plan.decision("quantize").reason and "no slower than 4bit" in plan.decision("quantize").reason
    unknown = cudaload.Machine.simulated("custom:sm90:80GiB", count=1, packages=QLORA)  # no throughput figure for it
    plan = _plan(L70, nodes=4, machine=unknown, interconnect="infiniband-ndr")
    assert plan.decision("quantize").value is None
    assert "no step time" in plan.decision("quantize").reason


# ---- 4. no 8-bit optimizer on sharded parameters -----------------------------------------------------------


def test_no_paged_8_bit_optimizer_under_sharded_parameters() -> None:
    planned = _plan(L70, nodes=1, quantize="4bit", parallelism="fsdp")  # QLoRA 70B on 8 H100, FSDP2
    assert planned.decision("quantize").value == "4bit" and planned.decision("parallelism").value == "fsdp"
    optim = planned.decision("training.optim")
    assert optim.value == planned.finetune.training_arguments["optim"] == "adamw_torch_fused"
    assert "89 and 1633" in _rejected(optim, "training.optim")["paged_adamw_8bit"]
    launched = cudaload.plan(
        L7, machine=_launched(launcher="accelerate", strategy="fsdp"), finetune=True, quantize="4bit"
    )
    assert launched.finetune.training_arguments["optim"] == "adamw_torch_fused"
    ddp = _plan(L7, nodes=2, quantize="4bit")  # whole copies: the 8-bit optimizer stays
    assert ddp.decision("parallelism").value == "ddp" and ddp.finetune.training_arguments["optim"] == "paged_adamw_8bit"


# ---- 5. a launched rank's strategy is its launcher's engine ------------------------------------------------


@pytest.mark.parametrize(
    ("launch", "expected"),
    [
        ({"launcher": "accelerate", "strategy": "fsdp"}, "fsdp"),
        ({"launcher": "accelerate", "strategy": "deepspeed", "zero_stage": 3}, "deepspeed-zero3"),
        ({"launcher": "accelerate", "strategy": "deepspeed", "zero_stage": 2}, "deepspeed-zero2"),
    ],
)
def test_a_launched_rank_plans_its_engines_strategy(launch: dict, expected: str) -> None:
    """7B fits each rank whole: it was planned "ddp" under FSDP and ZeRO launches alike."""
    plan = cudaload.plan(L7, machine=_launched(**launch), finetune=True)
    assert plan.decision("parallelism").value == expected
    assert "this rank runs under" in _rejected(plan)["ddp"]


def test_a_ddp_launch_plans_ddp_and_torchrun_the_plans_own_choice() -> None:
    """70B in 16 bit does not fit a rank whole: under accelerate's DDP launch that is "nothing fits" (it was
    "fsdp", loaded whole on each GPU); plain torchrun names no engine, so the plan's choice stands."""
    ddp = cudaload.plan(L70, machine=_launched(launcher="accelerate", strategy="ddp"), finetune=True, quantize=None)
    assert ddp.decision("parallelism").value is None
    assert "accelerate launch without FSDP or DeepSpeed" in _rejected(ddp)["fsdp"]
    torchrun = cudaload.plan(L70, machine=_launched(launcher="torchrun", strategy="ddp"), finetune=True, quantize=None)
    assert torchrun.decision("parallelism").value == "fsdp"


def test_a_strategy_of_another_engine_asked_under_a_launch_is_refused() -> None:
    zero2 = _launched(launcher="accelerate", strategy="deepspeed", zero_stage=2)
    with pytest.raises(PlacementError, match=r"parallelism='fsdp' was asked, but this rank runs under a DeepSpeed "
                       r"ZeRO-2 launch.*\['deepspeed-zero2'\]"):  # fmt: skip
        cudaload.plan(L7, machine=zero2, finetune=True, parallelism="fsdp")
    fsdp = _launched(launcher="accelerate", strategy="fsdp")
    with pytest.raises(PlacementError, match="parallelism='deepspeed' was asked, but this rank runs under an FSDP"):
        cudaload.plan(L7, machine=fsdp, finetune=True, parallelism="deepspeed")


def test_a_zero_stage_is_read_from_the_digit_after_deepspeed_zero() -> None:
    """A ZeRO-1 launch: only a stage-1 strategy (none before "deepspeed-zero1" is planned), never ZeRO-2's."""
    from cudaload.facts.launch import zero_stage

    assert [zero_stage(s) for s in ("deepspeed-zero1", "deepspeed-zero3-offload", "fsdp")] == [1, 3, None]
    plan = cudaload.plan(
        L7, machine=_launched(launcher="accelerate", strategy="deepspeed", zero_stage=1), finetune=True
    )
    value = plan.decision("parallelism").value
    assert value is None or zero_stage(value) == 1
    assert "ZeRO-1 launch" in _rejected(plan)["deepspeed-zero2"]


def test_fsdp2_loads_one_copy_a_job_so_it_fits_a_node_a_copy_a_rank_did_not() -> None:
    """405B LoRA in 16 bits on 16x8 H100 with 2 TiB a node: load_for_finetune reads the weights on rank 0 only
    (loaders/fsdp_loading.py: the other ranks build the model on meta, accelerate broadcasts rank 0's weights), so
    FSDP2's loading holds one 16-bit copy on a node (756 GiB, as ZeRO-3's rank 0), not one a rank (6 TiB, which made
    ZeRO-3 the choice before); FSDP2 full shard is chosen. A node of 600 GiB holds no whole copy: nothing that
    loads one fits, and the reason says the node's RAM."""
    dgx = cudaload.Machine.simulated("H100", count=8, packages=QLORA, cpu_memory_gib=2048)
    plan = _plan(L405, nodes=16, machine=dgx, interconnect="infiniband-ndr", quantize=None)
    decision, sizes = plan.decision("parallelism"), plan.finetune.parallelism["sizes"]
    assert decision.value == "fsdp"
    copy = sizes["deepspeed-zero3"]["node_load_cpu"]
    assert sizes["fsdp"]["node_load_cpu"] == copy and 750 * GiB < copy < 760 * GiB
    small = _plan(L405, nodes=16, machine=dgx, interconnect="infiniband-ndr", quantize=None, node_memory="600GiB")
    assert small.decision("parallelism").value is None
    for strategy in ("fsdp", "deepspeed-zero3"):
        assert _rejected(small)[strategy].startswith("does not fit: its CPU RAM a node, 756.0 GiB")
