"""Upstream round 5 (issue 36): rules held against what transformers 5.22 and 5.25 really do."""

from __future__ import annotations

import pytest
import torch

import cudaload
from cudaload import AttentionUnavailableError


def test_output_attentions_plans_eager_and_the_model_returns_the_weights(tiny_models) -> None:
    # transformers raises for any other backend (PretrainedConfig.output_attentions); load() used to fail.
    path = str(tiny_models["llama"])
    plan = cudaload.plan(path, output_attentions=True)
    assert plan.attention_chain == ("eager",)
    decision = plan.decision("attn_implementation")
    assert "output_attentions=True" in decision.reason and [r.value for r in decision.rejected] == ["sdpa"]
    model = cudaload.load(path, dtype="float32", output_attentions=True)
    out = model(torch.tensor([[1, 2, 3]]))
    assert len(out.attentions) == model.config.num_hidden_layers
    with pytest.raises(AttentionUnavailableError, match="only from 'eager'"):
        cudaload.plan(path, output_attentions=True, attn_implementation="sdpa")


@pytest.mark.parametrize(("config_name", "head"), [("RwkvConfig", "head"), ("GPTNeoXJapaneseConfig", "embed_out")])
def test_all_linear_lora_targets_leave_out_the_output_embeddings_as_peft_does(
    tmp_path, config_name: str, head: str
) -> None:
    import transformers
    from transformers import AutoModelForCausalLM

    small = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2}
    extra = {
        "RwkvConfig": {"attention_hidden_size": 32, "intermediate_size": 64, "context_length": 32},
        "GPTNeoXJapaneseConfig": {"num_attention_heads": 4, "intermediate_multiple_size": 2},
    }
    config = getattr(transformers, config_name)(**small, **extra[config_name])
    model = AutoModelForCausalLM.from_config(config)
    assert model.get_output_embeddings() is getattr(model, head)
    model.save_pretrained(tmp_path)
    facts = cudaload.read_model_facts(str(tmp_path))
    assert head not in facts.linear_names
    assert head not in cudaload.plan(str(tmp_path), finetune=True, quantize=None).finetune.lora["target_modules"]


# torch 2.14.1 / 2.15.0 CUDA wheels: `torch._C._cuda_getArchFlags()` (DESIGN.md, measured 2026-12-06).
TORCH_215 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")


@pytest.mark.parametrize(
    ("gpu", "usable"),
    [("V100", False), ("custom:sm60:16GiB", False), ("T4", True), ("A10G", True), ("L4", True), ("H100", True)],
)
def test_a_gpu_is_usable_only_where_the_installed_torch_has_kernels_for_it(gpu: str, usable: bool) -> None:
    from dataclasses import replace

    from cudaload.capability.usable_gpus import gpus_unusable
    from cudaload.policy import Request, decide_plan
    from model_shapes import llama

    machine = cudaload.Machine.simulated(gpu)
    software = replace(machine.software, torch_cuda="12.8", torch_arch_list=TORCH_215)
    why = gpus_unusable(machine.gpus, software)
    assert (why is None) is usable
    if not usable:
        assert f"built for {' '.join(TORCH_215)} only" in why and machine.gpus[0].sm in why
        detected = replace(machine, software=software, gpus_unusable=why, source="nvml")
        plan = decide_plan(detected, llama(0.1), Request())
        assert plan.kwargs["device_map"] == "cpu"  # planned around, loudly
        assert any("cannot run on" in w for w in plan.warnings)


def test_ptx_and_family_rules_of_the_arch_list() -> None:
    from cudaload.capability.usable_gpus import runs_on

    assert runs_on(("sm_80",), (8, 6))  # a cubin runs on later minors of its major
    assert not runs_on(("sm_86",), (8, 0))
    assert not runs_on(("sm_90a",), (10, 0))  # "a" cubins run on that architecture alone
    assert runs_on(("compute_90",), (12, 0))  # PTX is compiled at load for any later GPU
    assert not runs_on(("sm_90", "sm_100"), (12, 0))


def test_a_cuda_torch_without_a_driver_is_named_as_the_cause(tiny_models) -> None:
    from cudaload.loaders.attribution import _load_error

    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=cudaload.Machine.simulated("H100"))
    error = RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU ...")
    message = str(_load_error(plan, error))
    assert "a CUDA build of torch, but no NVIDIA driver on this machine" in message
