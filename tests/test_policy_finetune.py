"""Fine-tuning policy tables over simulated machines: quantization, placement, TrainingArguments."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from cudaload import FinetuneConfigError, Machine, MissingPackageError, PlacementError, QuantizationError
from cudaload.facts.machine import Launch
from cudaload.facts.model import ModelFacts
from cudaload.policy import Request, decide_plan
from cudaload.request import TrainingRequest
from model_shapes import PROJ, llama

BNB = {"bitsandbytes": "0.50.2", "peft": "0.21.2"}


def finetune(machine: Machine, model: ModelFacts | None = None, **request):
    """A fine-tuning plan; `request`'s fine-tuning keys go into its TrainingRequest, the rest into the Request."""
    fields = {f.name for f in dataclasses.fields(TrainingRequest)}
    training = TrainingRequest(**{k: v for k, v in request.items() if k in fields})
    others = {k: v for k, v in request.items() if k not in fields}
    return decide_plan(machine, model or llama(8), Request(training=training, **others))


DDP8 = Launch("torchrun", rank=3, local_rank=3, world_size=8, local_world_size=8, strategy="ddp")
FSDP = Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="fsdp")
ZERO3 = Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="deepspeed", zero_stage=3)

# machine, model size, quantize asked -> quantize planned, device_map, bf16, fp16, tf32, optim
TABLE = [
    ("T4", 1, None, 8, "auto", "4bit", "cuda:0", False, True, None, "paged_adamw_8bit"),
    ("T4", 1, None, 1, "auto", None, "cuda:0", False, True, None, "adamw_torch_fused"),
    ("A100", 1, None, 8, "auto", None, "cuda:0", True, False, True, "adamw_torch_fused"),
    ("A100", 1, None, 70, "auto", "4bit", "cuda:0", True, False, True, "paged_adamw_8bit"),  # ~37 GiB in 4-bit
    ("A100", 8, DDP8, 8, "4bit", "4bit", {"": 3}, True, False, True, "paged_adamw_8bit"),
    ("H100", 8, DDP8, 8, None, None, {"": 3}, True, False, True, "adamw_torch_fused"),
    # FSDP shards the parameters, which bitsandbytes' 8-bit optimizers do not train (issues 89, 1633): fused AdamW
    ("H100", 2, FSDP, 8, "4bit", "4bit", None, True, False, True, "adamw_torch_fused"),
    ("H100", 2, ZERO3, 8, None, None, None, True, False, True, "adamw_torch_fused"),
    (None, 1, None, 8, "auto", None, "cpu", False, False, None, "adamw_torch_fused"),
    (None, 1, None, 1, "4bit", "4bit", "cpu", False, False, None, "adamw_torch_fused"),
]


@pytest.mark.parametrize(
    ("gpu", "count", "launch", "size", "asked", "quantize", "device_map", "bf16", "fp16", "tf32", "optim"), TABLE
)
def test_finetune_table(gpu, count, launch, size, asked, quantize, device_map, bf16, fp16, tf32, optim) -> None:
    machine = Machine.simulated(gpu, count=count, packages=BNB, launch=launch)
    plan = finetune(machine, llama(size), quantize=asked)
    assert plan.decision("quantize").value == quantize
    assert plan.kwargs.get("device_map") == device_map
    args = plan.extras["training_arguments"]
    assert (args["bf16"], args["fp16"], args.get("tf32"), args["optim"]) == (bf16, fp16, tf32, optim)
    assert args["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert ("ddp_find_unused_parameters" in args) == (launch is DDP8)
    if quantize == "4bit":
        config = plan.kwargs["quantization_config"]
        assert config["bnb_4bit_compute_dtype"] == plan.kwargs["dtype"]
        assert config["bnb_4bit_quant_type"] == "nf4" and config["bnb_4bit_use_double_quant"]
        # FSDP shards the packed 4-bit weights with the rest only if they are stored as a float dtype.
        assert config["bnb_4bit_quant_storage"] == (plan.kwargs["dtype"] if launch is FSDP else "uint8")
    else:
        assert "quantization_config" not in plan.kwargs


@pytest.mark.parametrize(
    ("transformers", "name"), [("5.22.2", "gradient_checkpointing"), ("5.24.0", "activation_checkpointing")]
)
def test_checkpointing_argument_follows_transformers(transformers, name) -> None:
    machine = Machine.simulated("A100", packages={**BNB, "transformers": transformers})
    args = finetune(machine, llama(8)).extras["training_arguments"]
    assert args[name] is True and args[f"{name}_kwargs"] == {"use_reentrant": False}
    assert not ({"gradient_checkpointing", "activation_checkpointing"} - {name}) & set(args)


def test_auto_says_how_it_estimated() -> None:
    plan = finetune(Machine.simulated("T4", packages=BNB))
    reason = plan.decision("quantize").reason
    assert "does not fit" in reason and "GiB" in reason and "activations" in reason
    estimate = plan.extras["memory_estimate"]
    assert estimate["4bit"]["total"] < estimate["8bit"]["total"] < estimate["16bit"]["total"]
    # QLoRA on CUDA trains with paged 8-bit AdamW (~10 bytes per LoRA parameter), 16-bit LoRA with
    # fp32 AdamW (16 bytes): the same adapters cost less optimizer state under 4-bit.
    assert 0 < estimate["4bit"]["lora"] < estimate["16bit"]["lora"]


def test_auto_without_bitsandbytes_is_plain_lora_with_a_warning() -> None:
    plan = finetune(Machine.simulated("T4"))
    assert plan.decision("quantize").value is None
    assert any("will not fit" in w for w in plan.warnings)
    with pytest.raises(MissingPackageError, match="bitsandbytes is not installed"):
        finetune(Machine.simulated("T4"), quantize="4bit")


def test_old_bitsandbytes_is_refused_with_the_release_transformers_accepts() -> None:
    # bitsandbytes' first CPU backend is also transformers' minimum (BITSANDBYTES_MIN_VERSION 0.46.1): the version
    # is the reason on any machine.
    for gpu in (None, "A100"):
        with pytest.raises(MissingPackageError, match=r"0.45.0 is older than 0.46.1.*'bitsandbytes>=0.46.1'"):
            finetune(Machine.simulated(gpu, packages={"bitsandbytes": "0.45.0"}), quantize="4bit")


def test_a_release_without_a_cpu_backend_is_refused_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudaload.facts.quant_methods import QUANT_METHODS

    monkeypatch.setitem(QUANT_METHODS, "4bit", replace(QUANT_METHODS["4bit"], cpu_since="0.48.0"))
    with pytest.raises(MissingPackageError, match=r"bitsandbytes 0.47.0 has no CPU backend \(0.48\+ has one\)"):
        finetune(Machine.simulated(None, packages={"bitsandbytes": "0.47.0"}), quantize="4bit")
    assert finetune(Machine.simulated("A100", packages={"bitsandbytes": "0.47.0"}), quantize="4bit")


def test_quantized_model_under_ddp_never_gets_auto() -> None:
    machine = Machine.simulated("A100", count=8, packages=BNB, launch=DDP8)
    with pytest.raises(PlacementError, match="quantized model"):
        finetune(machine, quantize="4bit", device_map="auto")


@pytest.mark.parametrize(
    ("asked", "error", "match"),
    [
        ("int4", QuantizationError, "is not a choice"),
        ("4bit", QuantizationError, "already quantized"),
    ],
)
def test_bad_quantize(asked, error, match) -> None:
    model = replace(llama(1), quantized="bitsandbytes") if match == "already quantized" else llama(1)
    with pytest.raises(error, match=match):
        finetune(Machine.simulated("A100", packages=BNB), model, quantize=asked)


def test_lora_defaults_and_overrides() -> None:
    plan = finetune(Machine.simulated("A100", packages=BNB))
    lora = plan.extras["lora"]
    assert (lora["r"], lora["lora_alpha"], lora["lora_dropout"], lora["task_type"]) == (16, 32, 0.05, "CAUSAL_LM")
    assert sorted(lora["target_modules"]) == sorted(PROJ)
    qlora = finetune(Machine.simulated("A100", packages=BNB), quantize="4bit")
    assert qlora.decision("kbit_preparation").rejected[0].value == "prepare_model_for_kbit_training"
    custom = finetune(Machine.simulated("A100", packages=BNB), lora={"r": 64, "target_modules": "all-linear"})
    assert custom.extras["lora"]["r"] == 64 and custom.decision("lora").source == "user"
    with pytest.raises(FinetuneConfigError, match="match no linear layer"):
        finetune(Machine.simulated("A100", packages=BNB), lora={"target_modules": ["c_attn"]})


def test_quantize_and_a_quantization_config_together_are_refused() -> None:
    from cudaload import plan

    machine = Machine.simulated("A100", packages=BNB)
    with pytest.raises(QuantizationError, match="Both quantize='auto' and quantization_config"):
        plan(llama(1), machine=machine, finetune=True, quantization_config={"load_in_4bit": True})
    mine = plan(llama(1), machine=machine, finetune=True, quantize=None, quantization_config={"load_in_8bit": True})
    assert mine.kwargs["quantization_config"] == {"load_in_8bit": True}
    assert "quantization_config" in mine.explicit


def test_quantization_and_placement_agree_on_what_fits() -> None:
    # bf16 weights of 17.9 GiB: above 80% of an A10G's 22 GiB (the inference weights budget) but the
    # whole training estimate is under the 90% training budget, so: no 4-bit, and on one GPU.
    model = replace(llama(8), parameters=int(17.9 * 2**30 / 2))
    # seq_len 128: the logits path of the loss (12 bytes per logit, 128K vocabulary) must stay small.
    plan = finetune(Machine.simulated("A10G", packages=BNB), model, seq_len=128)
    assert plan.decision("quantize").value is None
    assert plan.kwargs["device_map"] == "cuda:0"
    assert "to train" in plan.decision("device_map").reason
    assert not any("offload" in w for w in plan.warnings)


@pytest.mark.parametrize(
    ("torch", "optim"), [("2.13.0", "adamw_torch_fused"), ("2.8.0", "adamw_torch_fused"), ("2.7.1", "adamw_torch")]
)
def test_cpu_fine_tuning_keeps_fused_adamw_where_torch_has_it(torch: str, optim: str) -> None:
    machine = Machine.simulated(packages={**BNB, "torch": torch})
    plan = finetune(machine, llama(1))
    decision = plan.decision("training.optim")
    assert decision.value == optim
    assert "CUDA-only" not in decision.reason
    if optim == "adamw_torch_fused":
        assert "_foreach_utils.py" in decision.reason and "training_args.py" in decision.reason
        assert [r.value for r in decision.rejected] == ["adamw_torch", "paged_adamw_8bit"]


def test_tf32_follows_the_current_device_trainingarguments_judges() -> None:
    # T4 (cuda:0) + A100 (cuda:1): the model goes on the A100, but TrainingArguments(tf32=True) checks
    # torch.cuda.current_device() (is_torch_tf32_available), cuda:0 here, and raises.
    mixed = finetune(Machine.simulated(["T4", "A100"], packages=BNB), quantize=None, device_map="cuda:1")
    tf32 = mixed.decision("training.tf32")
    assert tf32.value is False and "cuda:0 (Tesla T4, sm_75)" in tf32.reason
    assert (
        finetune(Machine.simulated(["A100", "T4"], packages=BNB), quantize=None, device_map="cuda:0")
        .decision("training.tf32")
        .value
        is True
    )


def test_a_paged_8bit_optimizer_is_planned_only_where_bitsandbytes_is_installed() -> None:
    from cudaload.policy.training import decide_training_arguments

    _, without = decide_training_arguments(
        Machine.simulated("A100", packages={"peft": "0.21.2"}), "bfloat16", "checkpoint", True
    )
    _, with_bnb = decide_training_arguments(Machine.simulated("A100", packages=BNB), "bfloat16", "checkpoint", True)
    assert (without["optim"], with_bnb["optim"]) == ("adamw_torch_fused", "paged_adamw_8bit")


def test_qlora_that_would_offload_to_the_cpu_is_refused_when_planned() -> None:
    with pytest.raises(PlacementError, match="llm_int8_enable_fp32_cpu_offload"):
        finetune(Machine.simulated("T4", packages=BNB), llama(70), quantize="4bit")
