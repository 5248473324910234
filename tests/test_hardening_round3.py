"""Hardening, round 3 (issue 20): a user's explicit choice, a checkpoint's missing weights and a
wrong argument never pass silently. Real tiny models saved locally; no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cudaload
from cudaload import FinetuneConfigError, LoadFailedError, ModelConfigError, SettingError

BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)


@pytest.fixture(scope="module")
def bert_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved `BertModel` (an encoder without a head, as all-MiniLM-L6-v2 is), with no tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bert") / "encoder"
    BertModel(BertConfig(**BERT)).save_pretrained(path)
    return path


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _copy_without(source: Path, target: Path, drop: str) -> list[str]:
    """`source` saved again into `target` without the tensors whose names contain `drop`."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(source, target)
    tensors = _weights(source)
    dropped = sorted(name for name in tensors if drop in name)
    save_file(
        {k: v for k, v in tensors.items() if k not in dropped}, str(target / "model.safetensors"), {"format": "pt"}
    )
    return dropped


# 1. training_arguments: yours wins under either checkpointing name


@pytest.mark.parametrize("name", ["gradient_checkpointing", "activation_checkpointing"])
def test_a_users_checkpointing_flag_replaces_the_planned_one_under_either_name(tiny_models, name: str) -> None:
    plan = cudaload.plan(str(tiny_models["llama"]), machine=cudaload.Machine.simulated("A100"), finetune=True)
    planned = plan.finetune.training_arguments
    assert any(planned.get(k) is True for k in ("gradient_checkpointing", "activation_checkpointing"))
    kwargs = cudaload.training_arguments(plan, **{name: False, f"{name}_kwargs": {"use_reentrant": True}})
    flags = {k: v for k, v in kwargs.items() if "checkpointing" in k}
    assert flags == {name: False, f"{name}_kwargs": {"use_reentrant": True}}


def test_turning_checkpointing_off_after_load_for_finetune_warns_that_the_model_still_checkpoints(tiny_models) -> None:
    model = cudaload.load_for_finetune(str(tiny_models["llama"]), quantize=None, dtype="float32", seq_len=32)
    base = model.base_model.model
    # transformers 5.23 renamed the property (the old name warns FutureWarning)
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    with pytest.warns(cudaload.CudaloadWarning, match="cannot turn it off"):
        kwargs = cudaload.training_arguments(model, gradient_checkpointing=False)
    assert kwargs.get("gradient_checkpointing") is False and "activation_checkpointing" not in kwargs
    from transformers import TrainingArguments

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old name on transformers >= 5.23
        args = TrainingArguments(output_dir="unused", **kwargs)
    assert getattr(args, "gradient_checkpointing", None) is not True
    assert getattr(args, "activation_checkpointing", None) is not True


@pytest.mark.parametrize("value", ["a string", 42])
def test_training_arguments_of_something_that_is_not_a_finetuned_model_is_a_cudaload_error(value) -> None:
    with pytest.raises(FinetuneConfigError, match=r"takes a model from cudaload\.load_for_finetune"):
        cudaload.training_arguments(value)


# 2. A checkpoint that does not fill the model


def test_a_checkpoint_with_a_dropped_layer_does_not_load_with_random_weights(tiny_models, tmp_path: Path) -> None:
    dropped = _copy_without(tiny_models["llama"], tmp_path / "broken", "layers.1.")
    assert len(dropped) == 9  # 4 attention + 3 MLP projections + 2 norms of a Llama layer
    with pytest.raises(LoadFailedError, match=r"lacks 9 of the model's weights") as caught:
        cudaload.load(str(tmp_path / "broken"), dtype="float32")
    assert dropped[0] in str(caught.value) and "allow_missing_weights=True" in str(caught.value)


def test_missing_weights_load_when_asked_for_and_are_listed_and_warned(tiny_models, tmp_path: Path) -> None:
    dropped = _copy_without(tiny_models["llama"], tmp_path / "broken", "layers.1.mlp")
    with pytest.warns(cudaload.CudaloadWarning, match="3 weights are not in the checkpoint"):
        model = cudaload.load(str(tmp_path / "broken"), dtype="float32", allow_missing_weights=True)
    assert model.cudaload_plan.missing_weights == tuple(dropped)
    assert "initialized at random" in model.cudaload_plan.explain()


def test_weights_its_own_architecture_has_no_place_for_are_an_error(tiny_models, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(tiny_models["llama"], tmp_path / "edited")
    config = json.loads((tmp_path / "edited" / "config.json").read_text())
    config["num_hidden_layers"] = 1  # edited after saving: layer 1's weights are left over
    (tmp_path / "edited" / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadFailedError, match=r"its own architecture, but 9 checkpoint weights have no place"):
        cudaload.load(str(tmp_path / "edited"), dtype="float32")


def test_a_base_model_from_a_checkpoint_with_a_head_records_the_unused_head(tiny_models) -> None:
    model = cudaload.load(str(tiny_models["llama"]), model_class="AutoModel", dtype="float32")
    assert type(model).__name__ == "LlamaModel"
    assert model.cudaload_plan.unexpected_weights == ("lm_head.weight",)


def test_load_refuses_output_loading_info(tiny_models) -> None:
    with pytest.raises(SettingError, match="reads transformers' loading report itself"):
        cudaload.load(str(tiny_models["llama"]), output_loading_info=True)


# 3. The class comes from the checkpoint's architecture


def test_an_encoder_checkpoint_loads_as_the_encoder_it_was_saved_as(bert_encoder: Path) -> None:
    plan = cudaload.plan(str(bert_encoder))
    assert (plan.auto_class, plan.model_class) == ("AutoModel", "BertModel")
    model = cudaload.load(str(bert_encoder), dtype="float32")
    assert type(model).__name__ == "BertModel"
    assert model.cudaload_plan.missing_weights == () and model.cudaload_plan.generation is None
    expected = _weights(bert_encoder)["embeddings.word_embeddings.weight"]
    assert bool((model.embeddings.word_embeddings.weight == expected).all())


def test_a_causal_lm_checkpoint_still_loads_as_a_causal_lm(tiny_models) -> None:
    assert cudaload.plan(str(tiny_models["qwen3"])).auto_class == "AutoModelForCausalLM"
    gpt2 = cudaload.plan(str(tiny_models["gpt2"]))
    assert (gpt2.auto_class, gpt2.model_class) == ("AutoModelForCausalLM", "GPT2LMHeadModel")


def test_a_config_without_architectures_is_not_given_a_causal_head_when_it_is_an_encoder() -> None:
    from transformers import BertConfig, LlamaConfig

    assert cudaload.plan(BertConfig(**BERT)).auto_class == "AutoModel"
    assert cudaload.plan(BertConfig(is_decoder=True, **BERT)).auto_class == "AutoModelForCausalLM"
    llama = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    assert cudaload.plan(llama).auto_class == "AutoModelForCausalLM"


def test_a_classification_checkpoint_loads_with_its_trained_head(bert_encoder: Path, tmp_path: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(1)
    BertForSequenceClassification(BertConfig(num_labels=3, **BERT)).save_pretrained(tmp_path / "cls")
    model = cudaload.load(str(tmp_path / "cls"), dtype="float32")
    assert type(model).__name__ == "BertForSequenceClassification"
    assert bool((model.classifier.weight == _weights(tmp_path / "cls")["classifier.weight"]).all())


# 6. model_class= takes classes; anything else is a SettingError


def test_model_class_takes_transformers_classes(bert_encoder: Path) -> None:
    from transformers import AutoModel, BertModel

    assert type(cudaload.load(str(bert_encoder), model_class=BertModel, dtype="float32")).__name__ == "BertModel"
    assert cudaload.plan(str(bert_encoder), model_class=AutoModel).auto_class == "AutoModel"
    assert cudaload.plan(str(bert_encoder), model_class="BertModel").model_class == "BertModel"


def test_a_model_class_of_another_model_type_is_a_model_config_error(bert_encoder: Path) -> None:
    from transformers import LlamaModel

    with pytest.raises(ModelConfigError, match="takes a LlamaConfig, but this checkpoint's config is a BertConfig"):
        cudaload.plan(str(bert_encoder), model_class=LlamaModel)


@pytest.mark.parametrize("value", [dict, 42, ["AutoModel"], int])
def test_a_model_class_that_is_not_a_transformers_class_is_a_setting_error(bert_encoder: Path, value) -> None:
    with pytest.raises(SettingError, match=r"model_class=.*pass a transformers Auto class or model class"):
        cudaload.load(str(bert_encoder), model_class=value)


def test_a_subclass_transformers_does_not_export_is_refused_by_name(bert_encoder: Path) -> None:
    from transformers import BertModel

    class MyBert(BertModel):
        pass

    with pytest.raises(SettingError, match=r"this one is not transformers\.MyBert"):
        cudaload.plan(str(bert_encoder), model_class=MyBert)


# 4. tokenizer_for a folder without tokenizer files


def test_tokenizer_for_a_folder_without_tokenizer_files_raises(bert_encoder: Path) -> None:
    model = cudaload.load(str(bert_encoder), dtype="float32")
    with pytest.raises(ModelConfigError, match="no tokenizer files"):
        cudaload.tokenizer_for(model)
    with pytest.raises(ModelConfigError, match="no tokenizer files"):
        cudaload.tokenizer_for(cudaload.plan(str(bert_encoder)))


@pytest.mark.parametrize("value", ["a/path", 42])
def test_tokenizer_for_something_that_is_not_a_model_or_plan_is_a_setting_error(value) -> None:
    with pytest.raises(SettingError, match="tokenizer_for\\(\\) takes a model"):
        cudaload.tokenizer_for(value)


# 5. First use from several threads


def test_first_use_from_eight_threads_loads_in_every_thread(tiny_models) -> None:
    # A fresh interpreter: the race is on transformers' first lazy imports, AutoTokenizer's (resolved only when
    # tokenizer_for() first asks for it) included.
    script = (
        "import sys, threading, cudaload\n"
        "errors = []\n"
        "def work():\n"
        "    try:\n"
        "        cudaload.tokenizer_for(cudaload.load(sys.argv[1], dtype='float32', verify=False))\n"
        "    except Exception as exc:\n"
        "        errors.append(f'{type(exc).__name__}: {exc}')\n"
        "threads = [threading.Thread(target=work) for _ in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(len(errors)); print(*errors, sep='\\n')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tiny_models["llama"])], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == "0", done.stdout


# Fine-tuning settings without finetune=True


@pytest.mark.parametrize(
    "setting",
    [{"quantize": "4bit"}, {"seq_len": 4096}, {"batch_size": 8}, {"gradient_checkpointing": False}, {"lora": {}}],
)
def test_finetuning_settings_without_finetune_raise(tiny_models, setting) -> None:
    (name,) = setting
    with pytest.raises(FinetuneConfigError, match=f"{name}=.*only applies to a fine-tuning plan"):
        cudaload.load(str(tiny_models["llama"]), **setting)
    with pytest.raises(FinetuneConfigError, match="only applies to a fine-tuning plan"):
        cudaload.plan(str(tiny_models["llama"]), **setting)


@pytest.mark.parametrize(("name", "value"), [("strict", "yes"), ("verify", 1), ("allow_missing_weights", "no")])
def test_load_flags_must_be_bools(tiny_models, name: str, value) -> None:
    with pytest.raises(SettingError, match=f"{name}={value!r}"):
        cudaload.load(str(tiny_models["llama"]), **{name: value})


@pytest.mark.parametrize(("name", "value"), [("probe", "no"), ("finetune", "yes")])
def test_plan_flags_must_be_bools(tiny_models, name: str, value) -> None:
    with pytest.raises(SettingError, match=f"{name}={value!r}"):
        cudaload.plan(str(tiny_models["llama"]), **{name: value})


# 8. Impossible config values are ModelConfigErrors naming the field


def _with_config(source: Path, target: Path, **values) -> str:
    import shutil

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.update(values)
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hidden_size", -64, "hidden_size=-64"),
        ("vocab_size", -1, "vocab_size=-1"),
        ("num_attention_heads", 0, "num_attention_heads=0"),
        ("head_dim", 0, "head_dim=0"),
        ("intermediate_size", 10**12, "intermediate_size=1000000000000"),
        ("num_hidden_layers", 10**12, "num_hidden_layers"),
        ("intermediate_size", "big", "intermediate_size"),
        ("hidden_size", float("nan"), "hidden_size"),
    ],
)
def test_impossible_config_values_are_model_config_errors_naming_the_field(
    tiny_models, tmp_path: Path, field: str, value, message: str
) -> None:
    path = _with_config(tiny_models["qwen3"], tmp_path / "bad", **{field: value})
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(")):
        cudaload.plan(path)


def test_sizes_that_do_not_fit_together_are_a_model_config_error(tiny_models, tmp_path: Path) -> None:
    # Each value is valid alone and GPT2Config does not check them together; GPT2Attention refuses a
    # width of 64 over 3 heads while the model is built: a ModelConfigError, not a ValueError from inside.
    path = _with_config(tiny_models["gpt2"], tmp_path / "bad", n_head=3)
    with pytest.raises(ModelConfigError, match=r"could not build GPT2LMHeadModel .*divisible by num_heads"):
        cudaload.plan(path)


# Weak cases: each now says what to do


@pytest.mark.parametrize(
    ("typo", "suggestion"), [("spda", "sdpa"), ("SDPA", "sdpa"), ("flash_attention2", "flash_attention_2")]
)
def test_an_attention_typo_is_refused_at_plan_time_with_a_suggestion(tiny_models, typo: str, suggestion: str) -> None:
    with pytest.raises(cudaload.AttentionUnavailableError, match=f"did you mean '{suggestion}'"):
        cudaload.plan(str(tiny_models["llama"]), attn_implementation=typo)


def test_an_empty_attention_name_is_refused(tiny_models) -> None:
    with pytest.raises(cudaload.AttentionUnavailableError, match="attn_implementation='' is not an attention"):
        cudaload.plan(str(tiny_models["llama"]), attn_implementation="")


def test_an_attention_function_you_registered_is_accepted(tiny_models) -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("my_sdpa_round3", sdpa_attention_forward)
    assert cudaload.plan(str(tiny_models["llama"]), attn_implementation="my_sdpa_round3").attn_implementation == (
        "my_sdpa_round3"
    )


@pytest.mark.parametrize("flag", ["load_in_8bit", "load_in_4bit"])
def test_load_in_nbit_points_to_the_quantization_config(tiny_models, flag: str) -> None:
    with pytest.raises(cudaload.QuantizationError, match=rf"BitsAndBytesConfig\({flag}=True\)"):
        cudaload.plan(str(tiny_models["llama"]), **{flag: True})


def test_device_map_gpu_says_cuda(tiny_models) -> None:
    with pytest.raises(cudaload.PlacementError) as caught:
        cudaload.plan(str(tiny_models["llama"]), device_map="gpu")
    assert str(caught.value).startswith("device_map='gpu' is not a device (torch has no 'gpu' device")


def test_a_bogus_lora_setting_fails_before_the_weights_load(tiny_models, monkeypatch: pytest.MonkeyPatch) -> None:
    import cudaload.finetune as finetune

    def must_not_load(*args, **kwargs):
        raise AssertionError("the weights were read before the LoRA settings were checked")

    monkeypatch.setattr(finetune, "apply_plan", must_not_load)
    with pytest.raises(FinetuneConfigError, match=r"LoraConfig refuses.*bogus"):
        cudaload.load_for_finetune(str(tiny_models["llama"]), quantize=None, lora={"bogus": 1})


def test_pipeline_device_points_to_device_map(tiny_models) -> None:
    with pytest.raises(cudaload.PlacementError, match="device=0: from_pretrained has no device argument"):
        cudaload.pipeline("text-generation", str(tiny_models["llama"]), device=0)


def test_a_gpu_name_for_machine_points_to_machine_simulated(tiny_models) -> None:
    with pytest.raises(SettingError, match=r"cudaload.Machine.simulated\('H100'\)"):
        cudaload.plan(str(tiny_models["llama"]), machine="H100")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"packages": "x==1"}, "packages='x==1': pass a dict"),
        ({"packages": {"flash-attn": 2.8}}, "packages=.*pass a dict"),
        ({"count": 1.5}, "count=1.5: pass a whole number"),
        ({"count": 0}, "count=0"),
        ({"count": True}, "count=True"),
    ],
)
def test_machine_simulated_checks_its_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(SettingError, match=message):
        cudaload.Machine.simulated("H100", **kwargs)


def test_a_finetune_that_does_not_fit_names_the_activations_not_the_weights() -> None:
    from transformers import LlamaConfig

    # Llama-3.2-1B-like: ~2.8 GiB of bf16 weights fit a T4; 4 x 16k tokens of activations do not.
    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
    )
    plan = cudaload.plan(
        config,
        machine=cudaload.Machine.simulated("T4"),
        finetune=True,
        quantize=None,
        seq_len=16384,
        batch_size=4,
        gradient_checkpointing=False,
    )
    placement = next(d for d in plan.decisions if d.setting == "device_map")
    assert placement.value == "cuda:0"
    assert "the weights (~2.8 GiB) fit" in placement.reason and "activations" in placement.reason
    assert "of weights exceed" not in placement.reason
    assert any("expect an out-of-memory error" in w and "seq_len" in w for w in plan.warnings)


# 9. A config.json that is not a regular file is refused, never read


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("fifo", "is not a regular file"),
        ("dev-zero", "is not a regular file"),
        ("huge", "is 16,777,217 bytes: cudaload reads only a regular config.json of at most 16 MiB"),
    ],
)
def test_a_config_json_that_is_not_a_regular_file_is_a_model_config_error(
    tmp_path: Path, kind: str, message: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    if kind == "fifo":
        os.mkfifo(folder / "config.json")  # no writer: opening it to read would block forever
    elif kind == "dev-zero":
        (folder / "config.json").symlink_to("/dev/zero")  # reading it would fill memory
    else:
        with open(folder / "config.json", "wb") as handle:
            handle.truncate(16 * 2**20 + 1)  # one byte over the cap, sparse on disk
    script = (
        "import sys, cudaload\n"
        "try:\n"
        "    cudaload.plan(sys.argv[1])\n"
        "except cudaload.ModelConfigError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDALOAD_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder)], capture_output=True, text=True, env=env, timeout=120
    )
    assert message in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("value", ["maybe", "2", "nope"])
def test_an_unknown_cudaload_probe_value_is_a_setting_error(value: str) -> None:
    from cudaload.capability.dtype_probe import probe_enabled

    with pytest.raises(SettingError, match=f"CUDALOAD_PROBE='{value}'"):
        probe_enabled({"CUDALOAD_PROBE": value})
    assert probe_enabled({"CUDALOAD_PROBE": " OFF "}) is False and probe_enabled({}) is True


def test_a_mixed_machine_is_described_per_gpu_model() -> None:
    machine = cudaload.Machine.simulated(["A100", "T4", "A100"])
    assert machine.describe() == "2x NVIDIA A100-SXM4-80GB + 1x Tesla T4 (sm_75)"
    assert cudaload.Machine.simulated("H100", count=4).describe() == "4x NVIDIA H100 80GB HBM3 (sm_90)"


def test_an_offloaded_quantized_plan_does_not_advise_quantizing() -> None:
    from cudaload.policy.placement import decide_placement

    t4 = cudaload.Machine.simulated("T4")
    too_big = 40 * 2**30  # exceeds a T4's 16 GiB: offloaded to CPU either way
    _, _, plain = decide_placement(t4, too_big, quantized=False)
    _, _, quantized = decide_placement(t4, too_big, quantized=True)
    assert "Quantize (4-bit)" in plain[0]
    assert "Quantize" not in quantized[0] and "more GPUs" in quantized[0]
