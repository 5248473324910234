"""Issue 39 item 10, the weak cases of model shapes, fine-tuning and pipeline_kwargs: each is refused with
a true reason, warned about, or accepted as transformers and peft accept it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import FinetuneConfigError, ModelConfigError, SettingError

# --- model shapes ---------------------------------------------------------------------------------------


def _with_config(source: Path, tmp_path: Path, **values: Any) -> str:
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(values)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("factor", [-2, 0, "banana", "4"])
def test_a_rope_factor_that_is_no_positive_number_is_refused(tiny_models, tmp_path, factor) -> None:
    scaling = {"rope_type": "linear", "factor": factor, "rope_theta": 10000.0}
    folder = _with_config(tiny_models["llama"], tmp_path, rope_parameters=scaling)
    with pytest.raises(ModelConfigError, match=rf"RoPE scaling factor={factor!r} \(rope_type 'linear'\)"):
        cudaload.plan(folder)


def test_a_rope_factor_of_four_is_planned(tiny_models, tmp_path) -> None:
    scaling = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    folder = _with_config(tiny_models["llama"], tmp_path, rope_parameters=scaling)
    assert cudaload.plan(folder, dtype="float32").dtype == "float32"


def test_weights_stored_in_another_dtype_than_the_config_says_are_warned_about(tiny_models, tmp_path) -> None:
    # gpt2 is saved in float16 (conftest); its config.json then says bfloat16.
    folder = _with_config(tiny_models["gpt2"], tmp_path, dtype="bfloat16")
    for _ in range(2):  # the second plan reads the cached facts: still warned
        with pytest.warns(
            cudaload.CudaloadWarning, match="says dtype bfloat16, but its safetensors weights are stored in float16"
        ):
            cudaload.plan(folder)


def test_weights_stored_as_the_config_says_plan_without_a_warning(tiny_models) -> None:
    assert cudaload.read_model_facts(str(tiny_models["gpt2"])).checkpoint_dtype == "float16"


def test_a_config_file_is_refused_alike_by_plan_and_load(tiny_models) -> None:
    config = str(tiny_models["llama"] / "config.json")
    messages = []
    for call in (cudaload.plan, cudaload.load):
        with pytest.raises(ModelConfigError, match="is a file, not a model folder") as caught:
            call(config)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


# --- pipeline_kwargs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "advice"),
    [
        ("model", "gpt2", "pass the model once"),
        ("tokenizer", "gpt2", "tokenizer_kwargs="),
        ("device", "cuda:0", "the plan places the model"),
        ("device_map", "auto", "pass device_map= as a keyword"),
        ("dtype", "float16", "pass dtype= as a keyword"),
        ("torch_dtype", "float16", "pass dtype= as a keyword"),
    ],
)
def test_a_load_setting_in_pipeline_kwargs_is_refused_before_loading(tmp_path, key, value, advice) -> None:
    # An empty folder: were the model loaded first, the error would be a ModelConfigError about it.
    with pytest.raises(SettingError, match=rf"pipeline_kwargs=\{{'{key}': '{value}'\}}.*{advice}"):
        cudaload.pipeline("text-generation", str(tmp_path), pipeline_kwargs={key: value})


# --- fine-tuning ----------------------------------------------------------------------------------------


def test_a_regex_target_modules_goes_to_peft_as_peft_takes_it(tiny_models) -> None:
    pattern = r".*\.(q_proj|v_proj)"
    plan = cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"target_modules": pattern})
    assert plan.finetune is not None and plan.finetune.lora["target_modules"] == pattern
    assert "sized as q_proj, v_proj" in plan.decision("lora").reason


def test_a_regex_target_modules_adapts_what_peft_matches(tiny_models) -> None:
    model = cudaload.load_for_finetune(
        str(tiny_models["llama"]), lora={"target_modules": r".*\.(q_proj|v_proj)"}, dtype="float32"
    )
    wrapped = {name.rsplit(".", 1)[-1] for name in model.targeted_module_names}
    assert wrapped == {"q_proj", "v_proj"}


def test_a_regex_that_does_not_compile_is_refused(tiny_models) -> None:
    with pytest.raises(FinetuneConfigError, match=r"target_modules='\(q_proj': peft takes a str as a regular"):
        cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"target_modules": "(q_proj"})


def test_a_misspelt_layer_name_is_still_refused(tiny_models) -> None:
    with pytest.raises(FinetuneConfigError, match=r"\['q_porj'\] match no linear layer"):
        cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"target_modules": "q_porj"})


def test_the_output_layer_can_be_adapted_as_peft_allows(tiny_models) -> None:
    targets = ["q_proj", "lm_head"]
    plan = cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"target_modules": targets, "r": 4})
    assert plan.finetune is not None and plan.finetune.lora["target_modules"] == targets
    bare = cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"target_modules": ["q_proj"], "r": 4})
    assert bare.finetune is not None
    # lm_head's adapters (4 x (64 + 256) parameters) are in the estimate: weight, gradient and AdamW state.
    grown = plan.finetune.memory_estimate["16bit"]["lora"] - bare.finetune.memory_estimate["16bit"]["lora"]
    assert grown == 4 * (64 + 256) * 16


def test_a_rank_above_the_layers_dimensions_is_warned_about(tiny_models) -> None:
    plan = cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"r": 10**6})
    (said,) = [w for w in plan.warnings if w.startswith("lora r=1000000 is larger than the smaller dimension of")]
    assert "q_proj (64x64)" in said and "v_proj (64x32)" in said
    usual = cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"r": 8})
    assert not any("lora r=" in w for w in usual.warnings)


@pytest.mark.parametrize("task_type", ["SEQ_CLS", "TOKEN_CLS"])
def test_a_task_type_of_another_head_is_refused(tiny_models, task_type) -> None:
    with pytest.raises(FinetuneConfigError, match=rf"task_type='{task_type}': that is peft's task for"):
        cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"task_type": task_type})


def test_the_models_own_task_type_is_accepted(tiny_models) -> None:
    plan = cudaload.plan(str(tiny_models["llama"]), finetune=True, lora={"task_type": "CAUSAL_LM"})
    assert plan.finetune is not None and plan.finetune.lora["task_type"] == "CAUSAL_LM"


def test_a_plan_made_under_a_newer_transformers_names_both_versions(tiny_models, tmp_path) -> None:
    import transformers
    from transformers import TrainingArguments

    from cudaload.upstream import version_at_least

    machine = cudaload.Machine.simulated("A100", packages={"transformers": "5.25.0"})
    plan = cudaload.plan(str(tiny_models["llama"]), machine=machine, finetune=True)
    if version_at_least(transformers.__version__, "5.23.dev0"):
        arguments = cudaload.training_arguments(plan, output_dir=str(tmp_path), bf16=False, tf32=False)
        assert TrainingArguments(**arguments).activation_checkpointing is True
        return
    with pytest.raises(
        FinetuneConfigError,
        match=rf"planned for transformers 5\.25\.0 .* transformers {transformers.__version__} is installed",
    ):
        cudaload.training_arguments(plan, output_dir=str(tmp_path))


def test_the_output_layer_is_wrapped_by_peft_when_named(tiny_models) -> None:
    model = cudaload.load_for_finetune(
        str(tiny_models["llama"]), lora={"target_modules": ["q_proj", "lm_head"], "r": 4}, dtype="float32"
    )
    assert {name.rsplit(".", 1)[-1] for name in model.targeted_module_names} == {"q_proj", "lm_head"}
