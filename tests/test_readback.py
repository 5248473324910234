"""Every value a plan shows is read back from the loaded model (loaders/readback.py), so an upstream default
that moves under cudaload (transformers 5.25's use_kernels) is said, and fails this suite, on the dependency
set where it moved."""

from __future__ import annotations

import warnings

import pytest
import torch

import cudaload
from cudaload.loaders.readback import lora_targets_read_back, read_back


@pytest.fixture()
def loaded(tiny_models):
    return cudaload.load(str(tiny_models["llama"]), dtype="float32", attn_implementation="sdpa", generate=True)


def test_a_load_reads_back_what_its_plan_shows(loaded) -> None:
    applied = loaded.cudaload_plan
    assert applied.plan.kwargs["use_kernels"] is False  # passed, never left to transformers' default
    assert loaded.use_kernels is False
    assert read_back(applied.plan, loaded) == ()


def test_each_value_that_differs_is_named_with_both_values(loaded) -> None:
    plan = loaded.cudaload_plan.plan
    loaded.set_attn_implementation("eager")
    loaded.to(torch.bfloat16)
    loaded.generation_config.cache_implementation = "static"
    said = "\n".join(read_back(plan, loaded))
    assert "attn_implementation is 'sdpa', and the loaded model uses 'eager'" in said
    assert "dtype is float32, and the loaded model holds bfloat16" in said
    assert f"generation cache is {plan.generation.cache_implementation!r}, and generate() will build 'static'" in said
    assert said.count(plan.model) == 3


def test_use_kernels_left_to_transformers_is_read_back(tiny_models, loaded) -> None:
    # Bare from_pretrained without use_kernels: transformers 5.22 keeps layers as they are, 5.25 kernelizes
    # (modeling_utils.py PreTrainedModel.from_pretrained: `elif use_kernels is None: use_kernels = True`).
    import transformers
    from packaging.version import Version
    from transformers import AutoModelForCausalLM

    bare = AutoModelForCausalLM.from_pretrained(str(tiny_models["llama"]), dtype=torch.float32)
    defaults_on = Version(transformers.__version__) >= Version("5.25.0")
    said = read_back(loaded.cudaload_plan.plan, bare)
    assert [d for d in said if "use_kernels" in d] == (
        [
            f"{loaded.cudaload_plan.plan.model}: the plan's use_kernels is False, and the loaded model's is True "
            "(its layers were swapped for Hub kernels)."
        ]
        if defaults_on
        else []
    )


def test_a_difference_after_loading_is_a_warning(tiny_models, monkeypatch: pytest.MonkeyPatch) -> None:
    from cudaload.loaders import apply as apply_module

    monkeypatch.setattr(apply_module, "read_back", lambda plan, model: (f"{plan.model}: made-up difference.",))
    with pytest.warns(cudaload.CudaloadWarning, match="made-up difference"):
        model = cudaload.load(str(tiny_models["qwen3"]), dtype="float32")
    assert f"{model.cudaload_plan.plan.model}: made-up difference." in model.cudaload_plan.warnings


def test_lora_targets_are_read_back_from_peft(tiny_models) -> None:
    pytest.importorskip("peft")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = cudaload.load_for_finetune(
            str(tiny_models["llama"]),
            quantize=None,
            dtype="float32",
            seq_len=16,
            lora={"target_modules": ["q_proj", "v_proj"]},
        )
    plan = model.cudaload_plan.plan
    assert lora_targets_read_back(plan, model) == ()
    model.base_model.targeted_module_names.append("model.layers.0.mlp.up_proj")
    (said,) = lora_targets_read_back(plan, model)
    assert "target_modules are ['q_proj', 'v_proj'], and peft wrapped ['q_proj', 'up_proj', 'v_proj']" in said


@pytest.mark.parametrize(("checkpoint", "planned"), [("hybrid", "dynamic"), ("sliding_window", "sliding_window")])
def test_a_checkpoints_cache_name_is_planned_as_generate_reads_it(tiny_models, tmp_path, checkpoint, planned) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = tmp_path / checkpoint
    AutoModelForCausalLM.from_pretrained(str(tiny_models["llama"])).save_pretrained(path)
    GenerationConfig(cache_implementation=checkpoint).save_pretrained(path)
    model = cudaload.load(str(path), dtype="float32", generate=True)
    assert model.cudaload_plan.plan.generation.cache_implementation == planned
    assert read_back(model.cudaload_plan.plan, model) == ()
