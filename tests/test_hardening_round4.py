"""Hardening, round 4 (issue 28): a user's choices are applied or refused, never shown and then dropped.
Real tiny models saved locally; no mocks."""

from __future__ import annotations

import copy
import json
import pickle
import warnings
from pathlib import Path

import pytest

import cudaload
from cudaload import PlacementError, SettingError
from cudaload.capability.launch import read_launch
from cudaload.capability.visible import RawDevice, visible_gpus

H100 = cudaload.Machine.simulated("H100")


@pytest.mark.parametrize("value", ["no", 1, "False"])
def test_gradient_checkpointing_must_be_a_real_bool(tiny_models: dict[str, Path], value: object) -> None:
    # Before: "no" is truthy, so plan() accepted it and load_for_finetune() turned checkpointing on.
    with pytest.raises(SettingError, match=r"gradient_checkpointing=.*pass True or False"):
        cudaload.plan(tiny_models["qwen3"], machine=H100, finetune=True, gradient_checkpointing=value)


@pytest.mark.parametrize("flag", ["strict", "allow_missing_weights"])
def test_load_for_finetune_flags_must_be_real_bools(tiny_models: dict[str, Path], flag: str) -> None:
    with pytest.raises(SettingError, match=rf"{flag}='yes' \(str\)"):
        cudaload.load_for_finetune(tiny_models["qwen3"], quantize=None, **{flag: "yes"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("seq_len", -100000),
        ("seq_len", 0),
        ("batch_size", -3),
        ("batch_size", 0),
        ("batch_size", True),
        ("batch_size", 2048.5),
        ("seq_len", "2048"),
    ],
)
def test_seq_len_and_batch_size_are_positive_whole_numbers(
    tiny_models: dict[str, Path], name: str, value: object
) -> None:
    # Before: seq_len=-100000 gave a memory estimate of -33.8 GiB that "fits"; batch_size=True/2048.5 passed.
    with pytest.raises(SettingError, match=rf"{name}=.*whole number of at least 1"):
        cudaload.plan(tiny_models["qwen3"], machine=H100, finetune=True, **{name: value})


def test_plan_kwargs_are_read_only_and_the_plan_keeps_its_value(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(tiny_models["qwen3"], machine=H100, max_memory={0: "10GiB"})
    before = plan.to_json()
    # Before: this changed a frozen Plan and load() applied part of it while explain() kept the old value.
    with pytest.raises(TypeError, match="read-only"):
        plan.kwargs["dtype"] = "float16"  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        plan.kwargs["max_memory"][0] = "1GiB"
    with pytest.raises(TypeError, match="read-only"):
        plan.kwargs.update(dtype="float16")  # type: ignore[attr-defined]
    assert plan.to_json() == before
    assert json.loads(plan.to_json())["kwargs"]["max_memory"] == {"0": "10GiB"}
    for copied in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        assert copied == plan and hash(copied) == hash(plan)
    # What from_pretrained receives is a plain copy: accelerate converts max_memory's sizes in place.
    kwargs = cudaload.from_pretrained_kwargs(plan)
    kwargs["max_memory"][0] = 1
    assert plan.kwargs["max_memory"] == {0: "10GiB"}


@pytest.mark.parametrize("device_map", ["meta", {"": "meta"}, {"model": "cpu", "lm_head": "meta"}])
def test_device_map_meta_is_refused_at_plan_time(tiny_models: dict[str, Path], device_map: object) -> None:
    # Before: plan() accepted it and load() failed with a raw RuntimeError from the test forward.
    with pytest.raises(PlacementError, match="'meta' loads no weights"):
        cudaload.plan(tiny_models["qwen3"], device_map=device_map)


@pytest.mark.parametrize("device_map", ["disk", {"": "disk"}])
def test_device_map_all_on_disk_is_refused_at_plan_time(tiny_models: dict[str, Path], device_map: object) -> None:
    # Before: plan() accepted it and the load failed inside transformers.
    with pytest.raises(PlacementError, match="every weight on disk"):
        cudaload.plan(tiny_models["qwen3"], device_map=device_map)


A100 = dict(name="NVIDIA A100-SXM4-80GB", capability=(8, 0), total_memory=80 * 2**30, multiprocessors=108)


@pytest.mark.parametrize(("visible", "repeated"), [("0,0", "0"), ("1,0,1", "1"), ("GPU-0aaa0,GPU-0aaa0", "GPU-0aaa0")])
def test_a_repeated_cuda_visible_device_is_said(visible: str, repeated: str) -> None:
    raw = [
        RawDevice(nvml_index=i, uuid=f"GPU-{i}aaa{i}-0000", pci_bus_id=f"0000:{i + 1:02X}:00.0", **A100) for i in (0, 1)
    ]
    gpus, warnings = visible_gpus(raw, visible, "PCI_BUS_ID")
    # CUDA (and torch.cuda._parse_visible_devices) shows no GPU when a device repeats; before, silently.
    assert gpus == ()
    assert any(f"names device {repeated} twice" in w and "no GPU at all" in w for w in warnings)


def test_an_invalid_cuda_visible_entry_is_not_called_a_repeat() -> None:
    raw = [RawDevice(nvml_index=0, uuid="GPU-0aaa0-0000", pci_bus_id="0000:01:00.0", **A100)]
    _, warnings = visible_gpus(raw, "x,0,0", "PCI_BUS_ID")
    assert not any("twice" in w for w in warnings)


def test_load_refuses_a_finetune_plan_and_load_for_finetune_takes_it(tiny_models: dict[str, Path]) -> None:
    finetune_plan = cudaload.plan(tiny_models["qwen3"], finetune=True, quantize=None, dtype="float32", seq_len=64)
    # Before: load(finetune_plan) returned a model without LoRA, and without a word.
    with pytest.raises(SettingError, match=r"fine-tuning plan .*load_for_finetune\(plan\)"):
        cudaload.load(finetune_plan)
    model = cudaload.load_for_finetune(finetune_plan)
    assert type(model).__name__ == "PeftModelForCausalLM"
    assert model.cudaload_plan.plan.finetune.trainable_parameters > 0
    with pytest.raises(SettingError, match=r"load_for_finetune\(plan\) was given lora, dtype"):
        cudaload.load_for_finetune(finetune_plan, lora={"r": 4}, dtype="float32")
    with pytest.raises(cudaload.FinetuneConfigError, match="inference plan"):
        cudaload.load_for_finetune(cudaload.plan(tiny_models["qwen3"]))


def test_pipeline_takes_a_plan_and_blames_only_what_was_passed(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(tiny_models["qwen3"], dtype="float32", generate=True)
    # Before: SettingError "load(plan) was given model_class=..., generate": arguments the user never passed.
    pipe = cudaload.pipeline("text-generation", plan)
    assert pipe.cudaload_plan.dtype == "float32" and pipe.tokenizer.padding_side == "left"
    with pytest.raises(SettingError, match=r"was given dtype: a Plan is loaded as planned") as caught:
        cudaload.pipeline("text-generation", plan, dtype="float32")
    assert "generate" not in str(caught.value) and "model_class" not in str(caught.value)
    with pytest.raises(SettingError, match="loads through AutoModelForSequenceClassification"):
        cudaload.pipeline("text-classification", plan)


BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    """A folder whose root holds a BERT encoder's config.json and weights, and whose `llm/` holds a causal LM."""
    import shutil

    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("two") / "repo"
    BertModel(BertConfig(**BERT)).save_pretrained(root)
    shutil.copytree(tiny_models["qwen3"], root / "llm")
    return root


def test_subfolder_is_planned_and_loaded_as_transformers_reads_it(two_models: Path) -> None:
    from transformers import AutoModelForCausalLM

    bare = AutoModelForCausalLM.from_pretrained(two_models, subfolder="llm")
    # Before: cudaload planned the root's BertModel and loaded llm/ as a headless Qwen3Model (lm_head dropped).
    plan = cudaload.plan(two_models, subfolder="llm")
    assert (plan.model_class, plan.auto_class) == ("Qwen3ForCausalLM", "AutoModelForCausalLM")
    assert plan.model == str(two_models) and plan.kwargs["subfolder"] == "llm"
    assert plan.generation is None and plan.parameters == sum(p.numel() for p in bare.parameters())
    model = cudaload.load(two_models, subfolder="llm", dtype="float32")
    assert type(model).__name__ == type(bare).__name__ == "Qwen3ForCausalLM"
    assert model.cudaload_plan.generation is not None  # read from llm/, as its config and generation config are
    with pytest.raises(cudaload.ModelConfigError, match=r"subfolder='nope': .* has no such folder.*\['llm'\]"):
        cudaload.plan(two_models, subfolder="nope")


def test_a_folder_without_config_says_what_it_holds(two_models: Path, tmp_path: Path) -> None:
    import shutil

    nested = tmp_path / "nested"
    shutil.copytree(two_models / "llm", nested / "llm")
    # Before: "Check that config.json is valid JSON" for a folder that has no config.json.
    with pytest.raises(cudaload.ModelConfigError, match=r"no config.json, but \['llm'\] do: pass subfolder='llm'") as e:
        cudaload.plan(nested)
    assert "valid JSON" not in str(e.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(cudaload.ModelConfigError, match=r"has no config.json \(it holds notes.txt\)") as e:
        cudaload.plan(empty)
    assert "valid JSON" not in str(e.value)


def test_a_peft_adapter_folder_is_named_as_one(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_models["qwen3"])
    with warnings.catch_warnings():  # peft <= 0.21.2 reads a name transformers 5.23 deprecated (FutureWarning)
        warnings.filterwarnings("ignore", r"`is_gradient_checkpointing` is deprecated", FutureWarning)
        get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "adapter")
    # Before: "Could not read the config ... Check that config.json is valid JSON" (there is none).
    with pytest.raises(cudaload.ModelConfigError, match="PEFT adapter") as e:
        cudaload.plan(tmp_path / "adapter")
    message = str(e.value)
    assert str(tiny_models["qwen3"]) in message and "PeftModel.from_pretrained" in message
    assert "valid JSON" not in message


def test_gguf_file_is_read_through_transformers_and_named_in_errors(tmp_path: Path) -> None:
    (tmp_path / "model.Q4_1.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(cudaload.ModelConfigError, match=r"pass gguf_file='model.Q4_1.gguf'") as e:
        cudaload.plan(tmp_path)
    assert "valid JSON" not in str(e.value)
    # With gguf_file= the config is read from the file, as from_pretrained reads it (not from a config.json).
    with pytest.raises(cudaload.ModelConfigError, match=r"GGUF magic bytes.*gguf_file='model.Q4_1.gguf'"):
        cudaload.plan(tmp_path, gguf_file="model.Q4_1.gguf")


def test_config_object_is_planned_and_anything_else_refused(two_models: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(two_models / "llm")
    plan = cudaload.plan(two_models / "llm", config=config, machine=H100)
    assert plan.model_class == "Qwen3ForCausalLM" and plan.model == str(two_models / "llm")
    # transformers' Auto classes read the checkpoint's own config when config= is not a config object.
    with pytest.raises(SettingError, match=r"config='llm' \(str\): from_pretrained uses config= only as a"):
        cudaload.plan(two_models, config="llm")


def _hub_cache(cache: Path, repo: str, files: Path) -> None:
    """`files` laid out as huggingface_hub's cache keeps a downloaded repository (refs/main -> a snapshot)."""
    import shutil

    folder = cache / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    shutil.copytree(files, folder / "snapshots" / commit)


def test_cache_dir_is_read_as_from_pretrained_reads_it(two_models: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    _hub_cache(tmp_path, "acme/tiny", two_models)
    bare = AutoModelForCausalLM.from_pretrained("acme/tiny", cache_dir=tmp_path, subfolder="llm")
    # Before: the config was looked up in the default cache, so plan() failed where bare transformers loads.
    plan = cudaload.plan("acme/tiny", cache_dir=str(tmp_path), subfolder="llm")
    assert plan.model_class == type(bare).__name__ == "Qwen3ForCausalLM"
    assert plan.kwargs["cache_dir"] == str(tmp_path)
    model = cudaload.load("acme/tiny", cache_dir=str(tmp_path), subfolder="llm", dtype="float32")
    assert type(model).__name__ == "Qwen3ForCausalLM"


def test_a_plan_for_a_simulated_gpu_loaded_here_says_so(tiny_models: dict[str, Path]) -> None:
    import torch

    assert not torch.cuda.is_available()  # this suite runs on a CPU build of torch (tests/test_gpu.py has the GPU)
    plan = cudaload.plan(tiny_models["qwen3"], machine=H100)
    # Before: "AssertionError: Torch not compiled with CUDA enabled. Likely cause: see the cause above."
    with pytest.raises(cudaload.LoadFailedError) as e:
        cudaload.load(plan)
    message = str(e.value)
    assert "device_map='cuda:0') and torch here cannot use CUDA" in message
    assert f"This plan was made for {plan.machine}, a machine given to plan()" in message
    assert "without machine=" in message
    assert "see the cause above" not in message


def test_an_unrecognised_load_failure_says_what_was_passed(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(cudaload.LoadFailedError) as e:
        cudaload.load(tiny_models["qwen3"], dtype="float32", key_mapping=5)
    message = str(e.value)
    assert "see the cause above" not in message
    assert "from_pretrained was called with dtype='float32'" in message and "key_mapping=5" in message
    assert "This plan was made for" not in message  # planned here: nothing to say about another machine


def _launched(precision: str, gpu: str = "A100") -> cudaload.Machine:
    launch = read_launch({"ACCELERATE_MIXED_PRECISION": precision})
    assert launch.mixed_precision == precision.lower()
    packages = {"bitsandbytes": "0.50.2", "peft": "0.21.2"}
    return cudaload.Machine.simulated(gpu, launch=launch, packages=packages)


@pytest.mark.parametrize(
    ("precision", "bf16", "fp16"), [("fp16", False, True), ("no", False, False), ("BF16", True, False)]
)
def test_training_precision_follows_the_launcher(
    tiny_models: dict[str, Path], precision: str, bf16: bool, fp16: bool
) -> None:
    plan = cudaload.plan(tiny_models["llama"], machine=_launched(precision), finetune=True, quantize=None)
    # Before: bf16=True whatever the launcher said, and TrainingArguments' bf16 overrides the launcher's precision.
    args = cudaload.training_arguments(plan)
    assert (args["bf16"], args["fp16"]) == (bf16, fp16)
    decision = plan.decision("training.bf16")
    assert decision.source == "user" and f"ACCELERATE_MIXED_PRECISION={precision.lower()}" in decision.reason
    said = [w for w in plan.warnings if "--mixed_precision" in w]
    assert bool(said) == (precision == "fp16")  # fp16 autocast over bf16 weights is said; bf16 and "no" match them


def test_an_impossible_launcher_precision_is_refused(tiny_models: dict[str, Path]) -> None:
    from transformers import Gemma2Config

    gemma = Gemma2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    with pytest.raises(
        cudaload.DtypeUnsupportedError, match=r"fp16.*gemma2 overflows in float16.*--mixed_precision bf16"
    ):
        cudaload.plan(gemma, machine=_launched("fp16"), finetune=True, quantize=None)
    with pytest.raises(cudaload.DtypeUnsupportedError, match=r"bf16.*T4.*sm80 or newer"):
        cudaload.plan(tiny_models["llama"], machine=_launched("bf16", "T4"), finetune=True, quantize=None)
    with pytest.raises(PlacementError, match="ACCELERATE_MIXED_PRECISION='fp32' is not one of"):
        cudaload.plan(
            tiny_models["llama"],
            machine=cudaload.Machine.simulated("A100", launch=read_launch({"ACCELERATE_MIXED_PRECISION": "fp32"})),
        )


def test_the_405b_fine_tune_plan_does_not_contradict_itself() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=16384,
        intermediate_size=53248,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=8,
        vocab_size=128256,
        dtype="bfloat16",
    )
    machine = cudaload.Machine.simulated("H100", count=8, packages={"bitsandbytes": "0.50.2", "peft": "0.21.2"})
    plan = cudaload.plan(config, machine=machine, finetune=True)
    # Before: device_map said "spread over 8 GPUs" and a warning said "Even 4-bit needs ~218.4 GiB and ... has
    # 72.0 GiB usable" (one GPU's budget), in the same plan.
    assert plan.decision("quantize").value == "4bit" and "spread over 8 GPUs" in plan.decision("device_map").reason
    assert "placement spreads it over the 8 GPUs" in plan.decision("quantize").reason
    assert not [w for w in plan.warnings if "Even 4-bit" in w]
    # Beyond the 8 GPUs together, it is still said, with their joint budget.
    longer = cudaload.plan(config, machine=machine, finetune=True, seq_len=2048 * 64)
    assert [w for w in longer.warnings if "Even 4-bit" in w and "(the 8 GPUs 576.0 GiB together)" in w]


def test_your_own_4bit_quantization_config_is_what_the_plan_explains(tiny_models: dict[str, Path]) -> None:
    from transformers import BitsAndBytesConfig

    machine = cudaload.Machine.simulated("A100", packages={"bitsandbytes": "0.50.2", "peft": "0.21.2"})
    own = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bfloat16")
    plan = cudaload.plan(tiny_models["llama"], machine=machine, finetune=True, quantize=None, quantization_config=own)
    planned = cudaload.plan(tiny_models["llama"], machine=machine, finetune=True, quantize="4bit")
    # Before: "your choice: full-precision base weights", the 16-bit optimizer and the 16-bit estimate.
    decision = plan.decision("quantize")
    assert decision.value == "4bit" and "your quantization_config: bitsandbytes 4bit" in decision.reason
    assert plan.finetune.training_arguments["optim"] == planned.finetune.training_arguments["optim"]
    assert plan.weight_bytes == planned.weight_bytes
    assert plan.kwargs["quantization_config"] is own  # passed to from_pretrained as given
    as_dict = cudaload.plan(
        tiny_models["llama"], machine=machine, finetune=True, quantize=None, quantization_config={"load_in_8bit": True}
    )
    assert as_dict.decision("quantize").value == "8bit"


def test_a_pipeline_on_a_subfolder_reads_its_tokenizer_there(two_models: Path) -> None:
    # The root has no tokenizer (a BERT saved without one); llm/ has the causal LM's.
    pipe = cudaload.pipeline("text-generation", two_models, subfolder="llm", dtype="float32")
    assert type(pipe.model).__name__ == "Qwen3ForCausalLM"
    assert pipe(["w5 w6"], max_new_tokens=2, do_sample=False)[0][0]["generated_text"].startswith("w5 w6")


def test_tokenizer_for_training_must_be_a_real_bool(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(SettingError, match=r"training='no' \(str\): pass True or False"):
        cudaload.tokenizer_for(cudaload.plan(tiny_models["qwen3"]), training="no")


def test_an_empty_subfolder_is_transformers_default_and_a_non_name_is_refused(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(tiny_models["qwen3"], machine=H100, subfolder="")
    assert plan.model_class == "Qwen3ForCausalLM"
    with pytest.raises(SettingError, match=r"subfolder=3 \(int\): pass a file or folder name"):
        cudaload.plan(tiny_models["qwen3"], machine=H100, subfolder=3)
