"""The parallelism decision and each rank's size (pure policy, simulated machines), the interconnect facts,
and the launch files read back by the engines' own parsers where they install here."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

import cudaload
from cudaload.errors import FinetuneConfigError, LaunchMismatchError, PlacementError, SettingError
from cudaload.facts.interconnect import DEFAULT_INTERCONNECT, INTERCONNECTS, ParallelLayout, interconnect
from cudaload.facts.shapes import LLAMA_SHAPES
from cudaload.launch import check_launched_plan, launch_invariants, read_manifest
from cudaload.policy.parallelism import decide_parallelism
from cudaload.policy.rank_sizing import size_rank
from cudaload.policy.training_shape import full_training_shape

H100 = cudaload.Machine.simulated("H100", count=8)
L7, L70, L405 = LLAMA_SHAPES["7B"], LLAMA_SHAPES["70B"], LLAMA_SHAPES["405B"]


def _plan(model, nodes: int = 1, machine=H100, **kwargs):
    return cudaload.plan(model, machine=machine, finetune=True, nodes=nodes, **kwargs)


def _full(
    model, nodes: int, machine=H100, link: str | None = "infiniband-ndr", requested: str = "auto", checkpointing=True
):
    layout = ParallelLayout(nodes, 8, interconnect(link), link is not None)
    shape = full_training_shape(model, dtype="bfloat16", seq_len=2048, checkpointing=checkpointing)
    return decide_parallelism(machine, model, layout, shape, requested, 1)


def test_ddp_when_the_whole_training_state_fits_each_gpu() -> None:
    plan = _plan(L7, nodes=2)
    decision = plan.decision("parallelism")
    assert decision.value == "ddp" and plan.decision("quantize").value is None
    assert "a whole training state fits each rank" in decision.reason
    assert "ethernet" in decision.reason.lower() and "assumed" in decision.reason  # the default link, said
    sizes = plan.finetune.parallelism["sizes"]
    assert sizes["ddp"]["total"] <= plan.finetune.parallelism["budget_per_rank"]
    assert {r.value for r in decision.rejected} >= {"fsdp", "fsdp-hybrid", "deepspeed-zero3"}


def test_70b_on_two_h100_nodes_shards_inside_a_node_in_16_bit() -> None:
    plan = _plan(L70, nodes=2, interconnect="infiniband-ndr")
    assert plan.decision("quantize").value is None  # fits sharded: no QLoRA needed
    assert "4bit" in [r.value for r in plan.decision("quantize").rejected]
    decision = plan.decision("parallelism")
    assert decision.value == "fsdp-hybrid"
    rejected = {r.value: r.reason for r in decision.rejected}
    assert rejected["ddp"].startswith("does not fit")
    sizes = plan.finetune.parallelism["sizes"]
    # Hybrid keeps the weights' all-gathers inside a node: only gradient shards cross the network.
    assert sizes["fsdp-hybrid"]["cross_node_bytes"] < sizes["fsdp"]["cross_node_bytes"] / 100
    assert sizes["fsdp-hybrid"]["comm_s"] < sizes["fsdp"]["comm_s"]
    assert sizes["fsdp"]["weights"] * 2 == pytest.approx(sizes["fsdp-hybrid"]["weights"], rel=1e-6)


def test_a_slower_link_makes_full_shard_slower_and_hybrid_no_slower() -> None:
    fast = _plan(L70, nodes=2, interconnect="infiniband-ndr").finetune.parallelism["sizes"]
    slow = _plan(L70, nodes=2, interconnect="ethernet-25g").finetune.parallelism["sizes"]
    assert slow["fsdp"]["comm_s"] > 10 * fast["fsdp"]["comm_s"]
    assert slow["fsdp-hybrid"]["comm_s"] < slow["fsdp"]["comm_s"]


def test_full_shard_when_a_node_cannot_hold_the_model() -> None:
    dgx = cudaload.Machine.simulated("H100", count=8, cpu_memory_gib=2048)  # each FSDP2 rank reads a whole copy
    decision, choice = _full(L70, 16, machine=dgx)
    assert decision.value == "fsdp"
    assert choice.sizes["fsdp-hybrid"].total > choice.budget
    assert {r.value: r.reason for r in decision.rejected}["fsdp-hybrid"].startswith("does not fit")


def test_tensor_parallel_is_never_the_training_choice_even_when_sharding_alone_does_not_fit() -> None:
    decision, choice = _full(L70, 2)
    assert decision.value != "tp+fsdp"
    assert choice.sizes["fsdp"].total > choice.budget and choice.sizes["fsdp-hybrid"].total > choice.budget
    assert "not offered for training" in {r.value: r.reason for r in decision.rejected}["tp+fsdp"]
    # Without a tp_plan transformers cannot shard the layers: that reason comes first.
    decision, _ = _full(replace(L70, tp_plan=False), 2)
    assert "base_model_tp_plan" in {r.value: r.reason for r in decision.rejected}["tp+fsdp"]


def test_zero3_offload_when_only_offload_fits_and_nothing_when_nothing_does() -> None:
    roomy = cudaload.Machine.simulated("H100", count=8, cpu_memory_gib=2048)  # the node's RAM holds the offload
    decision, choice = _full(L70, 1, machine=roomy, link=None)
    assert decision.value == "deepspeed-zero3-offload"
    size = choice.sizes["deepspeed-zero3-offload"]
    assert size.cpu_offloaded > 0 and size.states == 0
    decision, _ = _full(L405, 1, link=None)
    assert decision.value is None and decision.reason.startswith("nothing fits")


def test_deepspeed_asked_gets_its_cheapest_stage_that_fits() -> None:
    assert _plan(L7, nodes=2, parallelism="deepspeed").decision("parallelism").value == "deepspeed-zero1"
    decision = _plan(L70, nodes=2, quantize=None, parallelism="deepspeed").decision("parallelism")
    assert decision.value == "deepspeed-zero3" and decision.source == "user"


def test_a_strategy_that_cannot_fit_is_refused_with_its_numbers() -> None:
    with pytest.raises(PlacementError, match=r"parallelism='ddp'.*weights"):
        _plan(L70, nodes=2, quantize=None, parallelism="ddp")
    with pytest.raises(PlacementError, match="one node"):
        _plan(L7, nodes=1, parallelism="fsdp-hybrid")


def test_qlora_with_fsdp_keeps_the_quant_storage_rule() -> None:
    plan = _plan(L70, nodes=1, quantize="4bit", parallelism="fsdp")
    assert plan.decision("quantize").value == "4bit" and plan.decision("parallelism").value == "fsdp"
    assert plan.kwargs["quantization_config"]["bnb_4bit_quant_storage"] == plan.dtype
    ddp = _plan(L7, nodes=2, quantize="4bit")
    assert ddp.decision("parallelism").value == "ddp"
    assert ddp.kwargs["quantization_config"]["bnb_4bit_quant_storage"] == "uint8"  # whole 4-bit copies: packed


def test_sizes_divide_as_each_strategy_divides() -> None:
    shape = full_training_shape(L7, dtype="bfloat16", seq_len=2048, checkpointing=True)
    layout = ParallelLayout(1, 8, interconnect(None))

    def size(strategy: str):
        return size_rank(strategy, shape, layout, micro_batch=1, gpu_link=450e9, tflops=989.0, overhead=0)

    ddp, zero2, zero3 = size("ddp"), size("deepspeed-zero2"), size("deepspeed-zero3")
    assert ddp.weights == L7.parameters * 2 and ddp.gradients == L7.parameters * 2
    assert ddp.states == L7.parameters * 4  # torch AdamW: two moments in the parameter's dtype (bf16)
    # DeepSpeed keeps fp32 master weights + two fp32 moments (12 bytes), split; ZeRO-2 also splits the gradients.
    assert zero2.weights == ddp.weights and zero2.states == L7.parameters * 12 // 8
    assert zero2.gradients == ddp.gradients // 8
    assert zero3.weights == ddp.weights // 8
    assert (
        size("ddp").activations * 4
        == size_rank("ddp", shape, layout, micro_batch=4, gpu_link=450e9, tflops=989.0, overhead=0).activations
    )
    # One node: everything moves over NVLink; DDP all-reduces the gradients, 2 x (n-1)/n of them.
    assert ddp.cross_node_bytes == 0 and ddp.comm_bytes == int(2 * 7 / 8 * ddp.gradients)


def test_the_largest_micro_batch_fits_and_one_more_does_not() -> None:
    plan = _plan(L70, nodes=2, interconnect="infiniband-ndr")
    reason = plan.decision("parallelism").reason
    largest = int(reason.split("largest micro-batch ")[1].split(";")[0])
    budget = plan.finetune.parallelism["budget_per_rank"]
    fits = _plan(L70, nodes=2, interconnect="infiniband-ndr", batch_size=largest).finetune.parallelism
    assert fits["sizes"]["fsdp-hybrid"]["total"] <= budget
    over = _plan(L70, nodes=2, interconnect="infiniband-ndr", batch_size=largest + 1).finetune.parallelism
    assert over["sizes"]["fsdp-hybrid"]["total"] > budget


def test_no_parallelism_decision_for_one_process_without_a_layout() -> None:
    plan = cudaload.plan(L7, machine=H100, finetune=True)
    assert "parallelism" not in [d.setting for d in plan.decisions] and plan.finetune.parallelism is None


def test_layout_arguments_are_checked() -> None:
    with pytest.raises(FinetuneConfigError, match="nodes=2"):
        cudaload.plan(L7, machine=H100, nodes=2)
    with pytest.raises(SettingError, match="infiniband-ndr"):
        _plan(L7, nodes=2, interconnect="carrier-pigeon")
    with pytest.raises(SettingError, match="fsdp-hybrid"):
        _plan(L7, nodes=2, parallelism="zero9")
    with pytest.raises(SettingError, match="nodes=0"):
        _plan(L7, nodes=0)


def test_interconnect_facts_cite_their_figures() -> None:
    assert DEFAULT_INTERCONNECT in INTERCONNECTS
    assert {"nvlink", "infiniband-ndr", "infiniband-hdr", "roce", "ethernet-100g", "ethernet-25g"} <= set(INTERCONNECTS)
    for link in INTERCONNECTS.values():
        assert link.source and link.gbit_per_port > 0
    assert INTERCONNECTS["infiniband-ndr"].per_gpu_bytes_per_s(8) == 50e9  # 400 Gb/s a GPU
    assert INTERCONNECTS["ethernet-100g"].per_gpu_bytes_per_s(8) == 12.5e9 / 8  # one NIC shared by 8


def _launch(tmp_path: Path, model=L70, **kwargs) -> cudaload.LaunchFiles:
    kwargs = {"nodes": 2, "interconnect": "infiniband-ndr", "main_address": "10.0.0.1", **kwargs}
    files = cudaload.launch_files(model, machine=H100, **kwargs)
    files.write(tmp_path)
    return files


def test_accelerate_config_is_read_back_by_accelerate(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    files = _launch(tmp_path, emit=("accelerate",))
    config = load_config_from_file(str(tmp_path / "accelerate-config.yaml"))
    assert config.distributed_type.value == "FSDP" and config.mixed_precision == "bf16"
    assert (config.num_machines, config.num_processes, config.main_process_ip) == (2, 16, "10.0.0.1")
    fsdp = config.fsdp_config
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_reshard_after_forward"] is True
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"  # LlamaForCausalLM._no_split_modules
    assert fsdp["fsdp_cpu_ram_efficient_loading"] is True and fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert config.parallelism_config == {
        "parallelism_config_dp_replicate_size": 2,
        "parallelism_config_dp_shard_size": 8,
    }
    assert files.manifest["decisions"]["parallelism"] == "fsdp-hybrid"
    ddp = _launch(tmp_path / "ddp", model=L7, emit=("accelerate",))
    assert load_config_from_file(str(tmp_path / "ddp" / "accelerate-config.yaml")).distributed_type.value == "MULTI_GPU"
    assert ddp.plan.decision("parallelism").value == "ddp"


# DeepSpeed does not run here (docs/distributed.md); its 0.19.8 source (pip download --no-deps) defines what
# the JSON may hold: runtime/constants.py (TRAIN_MICRO_BATCH_SIZE_PER_GPU, GRADIENT_ACCUMULATION_STEPS,
# GRADIENT_CLIPPING, BFLOAT16 "bf16", FP16), runtime/zero/config.py `DeepSpeedZeroConfig` (stage,
# overlap_comm, contiguous_gradients, offload_optimizer, gather_16bit_weights_on_model_save by its alias
# stage3_...; pydantic extra="forbid" in runtime/config_utils.py `DeepSpeedConfigModel`, so a misspelt key
# fails there) and runtime/zero/offload_config.py `DeepSpeedZeroOffloadOptimizerConfig` (device, pin_memory).
DEEPSPEED_KEYS = {
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping", "bf16",
    "fp16",
}  # fmt: skip
ZERO_KEYS = {
    "stage",
    "overlap_comm",
    "contiguous_gradients",
    "offload_optimizer",
    "stage3_gather_16bit_weights_on_model_save",
}


def test_deepspeed_config_for_a_deepspeed_plan(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    files = _launch(tmp_path, parallelism="deepspeed-zero3-offload", emit=("deepspeed", "accelerate"))
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    offload_keys = {"zero_optimization", "zero_force_ds_cpu_optimizer"}  # deepspeed 0.19.8 runtime/constants.py
    assert set(ds) == DEEPSPEED_KEYS | offload_keys and set(ds["zero_optimization"]) <= ZERO_KEYS
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_force_ds_cpu_optimizer"] is False
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    # HF Trainer fills these from TrainingArguments (policy/engine_deepspeed.py)
    assert ds["bf16"] == {"enabled": "auto"} and ds["train_micro_batch_size_per_gpu"] == "auto"
    config = load_config_from_file(str(tmp_path / "accelerate-config.yaml"))
    assert config.distributed_type.value == "DEEPSPEED"
    assert config.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
    assert files.plan.decision("parallelism").source == "user"
    with pytest.raises(SettingError, match="parallelism='deepspeed'"):
        cudaload.launch_files(L70, machine=H100, nodes=2, emit=("deepspeed",))


def test_torchrun_and_sbatch_scripts(tmp_path: Path) -> None:
    _launch(tmp_path, emit=("torchrun", "slurm"), script="train.py", script_args=["--lr", "1e-4"])
    for name in ("torchrun-node0.sh", "torchrun-node1.sh", "launch.sbatch"):
        subprocess.run(["bash", "-n", str(tmp_path / name)], check=True)  # the shell parses it
    node1 = (tmp_path / "torchrun-node1.sh").read_text()
    expected = "torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1 --master-port 29500"
    assert f"{expected} train.py --lr 1e-4" in node1 and "CUDALOAD_LAUNCH=" in node1
    sbatch = (tmp_path / "launch.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --gpus-per-node=8" in sbatch
    assert '--node-rank "$SLURM_NODEID"' in sbatch and '"$SLURM_SUBMIT_DIR/cudaload-launch.json"' in sbatch


def test_a_rank_that_plans_otherwise_names_both_values(tmp_path: Path) -> None:
    files = _launch(tmp_path, model=L7, emit=("torchrun",))
    manifest = read_manifest({"CUDALOAD_LAUNCH": str(tmp_path / "cudaload-launch.json")})
    assert manifest is not None
    launch = cudaload.Launch(launcher="torchrun", rank=9, local_rank=1, world_size=16, local_world_size=8)
    rank = cudaload.Machine.simulated("H100", count=8, launch=launch)
    same = cudaload.plan(L7, machine=rank, finetune=True, nodes=2, interconnect="infiniband-ndr")
    check_launched_plan(same, manifest)  # the launched rank agrees: no error
    assert launch_invariants(same) == manifest["decisions"] == launch_invariants(files.plan)
    other = cudaload.plan(L7, machine=rank, finetune=True, nodes=2, dtype="float16")
    with pytest.raises(LaunchMismatchError, match=r'dtype: this rank "float16", planned before the launch "bfloat16"'):
        check_launched_plan(other, manifest)
    small = cudaload.Launch(launcher="torchrun", rank=1, local_rank=1, world_size=8, local_world_size=8)
    one_node = cudaload.plan(L7, machine=replace(rank, launch=small), finetune=True)
    with pytest.raises(LaunchMismatchError, match=r"layout: this launch runs 1 node\(s\) x 8 ranks, planned 2 x 8"):
        check_launched_plan(one_node, manifest)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(LaunchMismatchError, match="cannot be read"):
        read_manifest({"CUDALOAD_LAUNCH": str(tmp_path / "broken.json")})
    assert read_manifest({}) is None


def test_the_sized_micro_batch_reaches_trainingarguments() -> None:
    # TrainingArguments' default (8 a rank) is not what the ranks were sized for: the plan carries the micro-batch.
    plan = _plan(L7, nodes=2, batch_size=3)
    decision = plan.decision("training.per_device_train_batch_size")
    assert decision.value == 3 == plan.finetune.parallelism["sizes"]["ddp"]["micro_batch"]
    assert cudaload.training_arguments(plan, output_dir="o")["per_device_train_batch_size"] == 3
    one_process = cudaload.plan(L7, machine=H100, finetune=True)
    assert "per_device_train_batch_size" not in one_process.finetune.training_arguments
