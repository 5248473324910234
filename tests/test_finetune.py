"""load_for_finetune() on this CPU, for real: bitsandbytes 4-bit, peft LoRA, a Trainer run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import cudaload
from cudaload import FinetuneConfigError, QuantizationError, load_for_finetune, training_arguments

pytestmark = pytest.mark.slow


def _batch(vocab: int = 256) -> torch.Tensor:
    return torch.randint(2, vocab, (4, 16), generator=torch.Generator().manual_seed(0))


def _train(model, steps: int = 6) -> list[float]:
    ids = _batch()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_qlora_on_cpu(tiny_models) -> None:
    import bitsandbytes as bnb

    model = load_for_finetune(str(tiny_models["qwen3"]), quantize="4bit", dtype="bfloat16")
    plan = model.cudaload_plan.plan
    quant = plan.kwargs["quantization_config"]
    assert quant["bnb_4bit_quant_type"] == "nf4" and quant["bnb_4bit_use_double_quant"] is True
    # Asked for bf16: the 4-bit layers compute in it, not in BitsAndBytesConfig's float32 default;
    # the weights left unquantized (embeddings, norms) were loaded in it too.
    assert quant["bnb_4bit_compute_dtype"] == "bfloat16"

    base = model.get_base_model()
    layers = [m for name, m in base.named_modules() if name.endswith(("q_proj.base_layer", "down_proj.base_layer"))]
    assert layers and all(isinstance(m, bnb.nn.Linear4bit) for m in layers)
    assert {m.compute_dtype for m in layers} == {torch.bfloat16}
    assert base.model.embed_tokens.weight.dtype == torch.bfloat16
    # nf4 with double quantization, as bitsandbytes stores it: two weights a byte, in blocks of 64.
    q_proj = base.model.layers[0].self_attn.q_proj.base_layer.weight
    assert q_proj.dtype == torch.uint8 and q_proj.numel() == 64 * 64 // 2
    assert q_proj.quant_state.blocksize == 64 and q_proj.quant_state.nested

    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # By hand from the config (hidden 64, 4 heads and 2 KV heads of 16, MLP 128, 2 layers), r=16 x
    # (fan in + fan out) per adapted projection: q 64+64, k/v 64+32, o 64+64, gate/up 64+128, down
    # 128+64 -> 1024 per layer x r 16 x 2 layers. (Summing the model's trainable numel, as
    # load_for_finetune does, would restate the implementation.)
    expected = 16 * (128 + 96 + 96 + 128 + 192 + 192 + 192) * 2
    assert expected == 32768
    assert plan.extras["trainable_parameters"] == expected
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    # transformers 5.23 renamed is_gradient_checkpointing (the old name warns).
    renamed = hasattr(base, "is_activation_checkpointing")
    assert base.is_activation_checkpointing if renamed else base.is_gradient_checkpointing

    # Gradients reach the first layer through the frozen 4-bit weights of the later ones.
    ids = _batch()
    model(input_ids=ids, labels=ids).loss.backward()
    first = [p.grad for n, p in model.named_parameters() if "layers.0.mlp.gate_proj.lora_B" in n]
    assert first[0] is not None and first[0].abs().sum() > 0
    model.zero_grad()

    losses = _train(model)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_plain_lora(tiny_models, arch) -> None:
    model = load_for_finetune(str(tiny_models[arch]), quantize=None)
    assert "quantization_config" not in model.cudaload_plan.plan.kwargs
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    losses = _train(model)
    assert losses[-1] < losses[0]


class _Rows(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_trainer_runs_with_the_planned_arguments(tiny_models, tmp_path) -> None:
    from transformers import Trainer, TrainingArguments

    model = load_for_finetune(str(tiny_models["qwen3"]), quantize="4bit")
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    args = TrainingArguments(
        **training_arguments(
            model,
            output_dir=str(tmp_path),
            max_steps=3,
            per_device_train_batch_size=2,
            learning_rate=1e-2,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
        )
    )
    trainer = Trainer(model=model, args=args, train_dataset=_Rows(_batch()))
    result = trainer.train()
    assert result.global_step == 3
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    # Every adapter tensor moved from its snapshot (lora_B starts at zero, lora_A is moved from the
    # second step on), not only some; and only adapters train.
    after = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert after.keys() == before.keys() and len(before) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    assert all("lora_" in n for n in before)
    assert [n for n, p in after.items() if torch.equal(p, before[n])] == []


def test_lora_overrides_and_bad_targets(tiny_models) -> None:
    model = load_for_finetune(
        str(tiny_models["llama"]), quantize=None, lora={"r": 4, "target_modules": ["q_proj", "v_proj"]}
    )
    config = model.peft_config["default"]
    assert config.r == 4 and set(config.target_modules) == {"q_proj", "v_proj"}
    assert model.cudaload_plan.plan.decision("lora").source == "user"
    with pytest.raises(FinetuneConfigError, match=r"match no linear layer.*q_proj"):
        load_for_finetune(str(tiny_models["llama"]), quantize=None, lora={"target_modules": ["query_key_value"]})


def test_unknown_quantize_value_is_a_clear_error(tiny_models) -> None:
    with pytest.raises(QuantizationError, match="'4bit' \\(QLoRA\\)"):
        load_for_finetune(str(tiny_models["llama"]), quantize="int4")


def test_an_already_quantized_model_is_not_quantized_again(tiny_models, tmp_path) -> None:
    model = load_for_finetune(str(tiny_models["llama"]), quantize="4bit")
    saved = tmp_path / "llama-4bit"
    model.get_base_model().save_pretrained(saved)
    with pytest.raises(QuantizationError, match="already quantized \\(bitsandbytes\\)"):
        load_for_finetune(str(saved), quantize="4bit")


def _unmeasured_dtype() -> torch.dtype:
    """The dtype plan() gives with the CPU probe off (CUDALOAD_PROBE=0), from this machine's facts:
    on CPU the static table, bf16 only with AMX-BF16 tiles (the `amx_bf16` flag of /proc/cpuinfo,
    docs/cpu-dtype.md), else fp32; on a GPU, bf16 from sm80 on, fp16 before."""
    from pathlib import Path

    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo: the CPU's flags are unknown here")
    return torch.bfloat16 if "amx_bf16" in cpuinfo.read_text().split() else torch.float32


@pytest.mark.parametrize("asked", [None, "bfloat16", "float32"])
def test_training_arguments_are_the_plans_and_yours_win(tiny_models, monkeypatch, asked) -> None:
    from transformers import TrainingArguments

    monkeypatch.setenv("CUDALOAD_PROBE", "0")  # unmeasured: the dtype follows from the machine's facts
    extra = {} if asked is None else {"dtype": asked}
    model = load_for_finetune(str(tiny_models["llama"]), quantize=None, **extra)
    expected = _unmeasured_dtype() if asked is None else getattr(torch, asked)
    # What was loaded, read off the model: the frozen base weights in the expected dtype.
    loaded = {p.dtype for n, p in model.named_parameters() if not p.requires_grad}
    assert loaded == {expected}
    args = training_arguments(model, output_dir="out", optim="sgd")
    assert args["optim"] == "sgd" and args["output_dir"] == "out"
    # transformers 5.23 renamed TrainingArguments' gradient_checkpointing_kwargs (the old name warns).
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    name = "activation_checkpointing" if "activation_checkpointing_kwargs" in fields else "gradient_checkpointing"
    assert args[f"{name}_kwargs"] == {"use_reentrant": False}
    # Mixed precision exactly when the weights were loaded in that half dtype; never fp16 on a CPU.
    assert args["bf16"] is (expected == torch.bfloat16)
    assert args["fp16"] is (expected == torch.float16)
    with pytest.raises(FinetuneConfigError, match="not a fine-tuning plan"):
        training_arguments(cudaload.plan(str(tiny_models["llama"])))


def test_moe_experts_are_said_to_be_left_out_and_can_be_adapted(tmp_path) -> None:
    # transformers 5 fuses each MoE layer's experts into 3-D parameters: target_modules reach
    # attention only; peft's target_parameters adapts the experts when asked.
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
    )
    path = tmp_path / "moe"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    experts = ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]

    planned = cudaload.plan(str(path), finetune=True, quantize=None).decision("lora")
    assert "fused experts" not in planned.reason and "linear projections" in planned.reason
    (offer,) = planned.rejected
    assert "target_parameters" in offer.reason and str(experts) in offer.value

    model = load_for_finetune(str(path), quantize=None, lora={"target_parameters": experts})
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any(".mlp.experts." in n and "lora_" in n for n in trainable)
    assert "fused experts" in model.cudaload_plan.plan.decision("lora").reason
    ids = torch.randint(0, 128, (1, 8))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)

    assert model.cudaload_plan.plan.extras["lora"]["lora_dropout"] == 0.0  # peft's ParamWrapper needs it
    with pytest.raises(FinetuneConfigError, match="peft adapts parameters only without dropout"):
        cudaload.plan(str(path), finetune=True, quantize=None, lora={"target_parameters": experts, "lora_dropout": 0.1})
    with pytest.raises(FinetuneConfigError, match="match no fused expert weight"):
        cudaload.plan(str(path), finetune=True, quantize=None, lora={"target_parameters": ["mlp.nope"]})
