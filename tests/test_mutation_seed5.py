"""Rules that the seed-5 mutation sample (issue 41 item 7: `python tools/mutate.py --sample 40 --seed 5
--select imports`) changed without any test failing. One test per rule, each through a public entry point
(`cudaload.plan`, `cudaload.launch_files`, a policy or loader function by name imported inside the test, or
`cudaload.load` on a tiny saved model where only a load reaches the rule), and each docstring names the module
and function it guards (tools/mutate.py maps a test file to a module by any line naming it).

Each test was checked to fail with its rule mutated (`tools/mutate.py --seed 5 --sample 40 --select imports
--match ...`)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import cudaload
from cudaload import Machine
from cudaload.facts.shapes import LLAMA_SHAPES
from model_shapes import llama

GiB = 2**30


# ---- launch/check.py -----------------------------------------------------------------------------


def test_a_plan_without_a_parallelism_section_is_one_rank_on_one_node() -> None:
    """cudaload.launch `check_launched_plan`: a fine-tuning plan made without a launch has no parallelism
    section and runs as 1 node x 1 rank: against a launch written for one GPU only the strategy differs (that
    launch decided one), not the layout, and against a launch of
    8 ranks the layout difference names 1 node(s) x 1 ranks."""
    from cudaload.launch import check_launched_plan

    model = LLAMA_SHAPES["7B"]
    one_gpu = Machine.simulated("H100")
    plain = cudaload.plan(model, machine=one_gpu, finetune=True)
    assert plain.finetune is not None and plain.finetune.parallelism is None
    single = cudaload.launch_files(model, machine=one_gpu, emit=("torchrun",))
    assert (single.manifest["nodes"], single.manifest["ranks_per_node"]) == (1, 1)
    with pytest.raises(cudaload.LaunchMismatchError) as same_layout:  # the strategy was decided for the launch only
        check_launched_plan(plain, single.manifest)
    assert "parallelism: this rank null" in str(same_layout.value) and "layout:" not in str(same_layout.value)
    eight = cudaload.launch_files(model, machine=Machine.simulated("H100", count=8), emit=("torchrun",))
    with pytest.raises(
        cudaload.LaunchMismatchError, match=r"layout: this launch runs 1 node\(s\) x 1 ranks, planned 1 x 8"
    ):
        check_launched_plan(plain, eight.manifest)


# ---- launch/files.py ----------------------------------------------------------------------------


def test_a_zero2_plan_writes_a_stage_2_deepspeed_config() -> None:
    """cudaload.launch `deepspeed_config`: a plan that chose DeepSpeed ZeRO-2 gets a ds_config.json of
    ZeRO stage 2, without the stage-3 keys (gathering 16-bit weights on save) or an optimizer offload; ZeRO-3
    gets stage 3 with its gather key."""

    def zero(parallelism: str) -> dict[str, object]:
        files = cudaload.launch_files(
            LLAMA_SHAPES["7B"],
            machine=Machine.simulated("H100", count=8),
            emit=("deepspeed",),
            parallelism=parallelism,
        )
        assert files.plan.decision("parallelism").value == parallelism
        return json.loads(files.files["ds_config.json"])["zero_optimization"]

    zero2 = zero("deepspeed-zero2")
    assert zero2["stage"] == 2
    assert "stage3_gather_16bit_weights_on_model_save" not in zero2 and "offload_optimizer" not in zero2
    zero3 = zero("deepspeed-zero3")
    assert zero3["stage"] == 3 and zero3["stage3_gather_16bit_weights_on_model_save"] is True


# ---- loaders/apply.py -----------------------------------------------------------------------------


def test_an_attention_fallback_warning_names_the_next_option_in_the_chain(
    tiny_models: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """cudaload.loaders.apply `apply_plan`: when an attention option fails, the WARNING names the option tried
    next, the one after it in the plan's chain, which is the attention the model ends up with."""
    model_dir = tiny_models["llama"]  # conftest.py: a saved 2-layer Llama
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})  # plans FA2; this CPU cannot run it
    plan = cudaload.plan(str(model_dir), machine=a100, device_map="cpu", dtype="bfloat16")
    chain = plan.attention_chain
    assert chain[0] == "flash_attention_2" and len(chain) >= 3  # a next-but-one option exists to be confused with
    caplog.set_level(logging.WARNING, logger="cudaload")
    model = cudaload.load(str(model_dir), machine=a100, device_map="cpu", dtype="bfloat16")
    (warning,) = [r.getMessage() for r in caplog.records if r.name.startswith("cudaload")]
    assert warning.endswith(f"falling back to {chain[1]}")
    assert model.cudaload_plan.attn_implementation == chain[1]


# ---- loaders/attribution.py -----------------------------------------------------------------------


def test_an_unrelated_failure_says_which_step_failed() -> None:
    """cudaload.loaders.attribution `unrelated_error`: a failure that is not the attention option's says which
    step failed: a switch to the next option that transformers refused says it could not switch and lists the
    options tried; a test forward that failed says the model loaded and points at placement and dtype."""
    from cudaload.loaders.applied import Fallback
    from cudaload.loaders.attribution import unrelated_error
    from cudaload.loaders.verify import Failure

    plan = cudaload.plan(llama(1), machine=Machine.simulated(None))
    tried = [Fallback("flash_attention_2", "verify", "bad logits")]
    switched = unrelated_error(plan, "sdpa", Failure("switch", "refused", ValueError("refused")), tried)
    assert str(switched).startswith("Could not switch to attn_implementation='sdpa'")
    assert "Tried: flash_attention_2." in str(switched)
    forward = unrelated_error(plan, "sdpa", Failure("verify", "device mismatch", RuntimeError("x")), tried)
    assert "loaded, but a test forward failed for a reason unrelated to attention: device mismatch" in str(forward)
    assert "Could not switch" not in str(forward)


# ---- loaders/readback.py --------------------------------------------------------------------------


def test_lora_targets_are_compared_only_as_two_lists_of_names() -> None:
    """cudaload.loaders.readback `lora_targets_read_back`: the plan's LoRA targets are compared with peft's only
    when both are lists of names: a model that does not say what peft wrapped, or a plan whose targets peft
    resolves itself (a regex), report nothing, while two lists that differ are named."""
    from cudaload.loaders.readback import lora_targets_read_back

    machine = Machine.simulated("A100", packages={"peft": "0.21.2"})

    def planned(targets: object) -> cudaload.Plan:
        the_plan = cudaload.plan(llama(1), machine=machine, finetune=True, lora={"target_modules": targets})
        assert the_plan.finetune is not None and the_plan.finetune.lora["target_modules"] == targets
        return the_plan

    named = planned(["q_proj", "v_proj"])
    assert lora_targets_read_back(named, SimpleNamespace()) == ()  # no targeted_module_names to read
    wrapped = SimpleNamespace(targeted_module_names=["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"])
    assert lora_targets_read_back(planned(r".*\.(q_proj|v_proj)$"), wrapped) == ()
    (said,) = lora_targets_read_back(named, wrapped)
    assert "target_modules are ['q_proj', 'v_proj'], and peft wrapped ['q_proj', 'up_proj']" in said


# ---- policy/placement.py --------------------------------------------------------------------------


def test_upstream_placement_without_a_cpu_entry_puts_nothing_on_the_cpu() -> None:
    """cudaload.policy.placement `judge_upstream_placement`: a landing with no "cpu" entry put nothing on the
    CPU: all on the GPUs, cudaload's own spread stands as it is; with only a disk entry the warning names the
    disk and not the CPU."""
    from cudaload.policy.placement import judge_upstream_placement

    one_device = cudaload.plan(llama(1), machine=Machine.simulated("A10G", count=2))
    ours = replace(one_device, kwargs={**one_device.kwargs, "device_map": "auto", "max_memory": {0: "1GiB"}})
    assert judge_upstream_placement(ours, {"cuda:0": GiB, "cuda:1": GiB}) is ours
    judged = judge_upstream_placement(ours, {"cuda:0": GiB, "disk": 2 * GiB})
    (warning,) = [w for w in judged.warnings if w not in ours.warnings]
    assert warning.startswith("transformers will put ~2.0 GiB on disk although")


# ---- policy/rank_sizing.py ------------------------------------------------------------------------


def test_a_plan_shows_communication_and_compute_time_at_one_precision() -> None:
    """cudaload.policy.rank_sizing `RankSize.as_dict`: a plan's sizes show the communication and the compute time
    of a step rounded alike, so equal estimates read as equal and the slower one can be read off the plan."""
    from cudaload.policy.rank_sizing import RankSize

    seconds = 0.123456789
    size = RankSize("ddp", 0, 0, 0, 0, 0, 0, 0, 1, 8, 0, 0, compute_s=seconds, comm_s=seconds)
    shown = size.as_dict()
    assert shown["comm_s"] == shown["compute_s"]
    assert abs(shown["comm_s"] - seconds) < 1e-3  # rounded, not truncated to whole seconds


def test_lora_computes_two_thirds_of_full_training_a_step() -> None:
    """cudaload.policy.rank_sizing `size_rank` (compute_s): full training costs 6 flops a parameter and token
    (forward 2, backward 4: activation and weight gradients); LoRA's frozen weights get no weight gradient, 4;
    checkpointing adds a forward's 2 to each."""
    from cudaload.facts.interconnect import ParallelLayout, interconnect
    from cudaload.policy.rank_sizing import TrainingShape, size_rank
    from cudaload.policy.training_shape import full_training_shape

    full = full_training_shape(LLAMA_SHAPES["7B"], dtype="bfloat16", seq_len=2048, checkpointing=False)
    one = ParallelLayout(1, 1, interconnect(None))

    def compute(shape: TrainingShape) -> float:
        size = size_rank("ddp", shape, one, micro_batch=1, gpu_link=450e9, tflops=989.0, overhead=0)
        assert size.compute_s is not None
        return size.compute_s

    lora = replace(full, full=False)
    assert compute(lora) / compute(full) == pytest.approx(4 / 6)
    checkpointed = replace(lora, checkpointing=True)
    assert compute(checkpointed) / compute(replace(full, checkpointing=True)) == pytest.approx(6 / 8)
