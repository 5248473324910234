"""Full fine-tuning (`train="full"`): planned (no LoRA, no quantization, gradients + AdamW state in the estimate),
loaded with every weight trainable, trained by HF Trainer, and through the CLI and the launch files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import cudaload
from cudaload import FinetuneConfigError, SettingError, load_for_finetune, training_arguments
from cudaload.cli import main
from cudaload.facts.shapes import LLAMA_SHAPES

A100 = cudaload.Machine.simulated("A100")
H100X8 = cudaload.Machine.simulated("H100", count=8)


def _stored_parameters(path: Path) -> tuple[int, int]:
    """(parameters, bytes) of the checkpoint as torch holds it: read from the model, not from cudaload's facts."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_full_training_plan_trains_every_weight_without_lora_or_quantization(tiny_models) -> None:
    path = tiny_models["qwen3"]
    plan = cudaload.plan(path, machine=A100, finetune=True, train="full")
    train = plan.decision("train")
    assert (train.value, train.source) == ("full", "user") and "AdamW" in train.reason
    assert plan.decision("quantize").value is None and "quantization_config" not in plan.kwargs
    assert {"lora", "kbit_preparation"}.isdisjoint(d.setting for d in plan.decisions)
    assert plan.finetune is not None and plan.finetune.lora is None and plan.finetune.train == "full"
    assert plan.finetune.to_dict()["train"] == "full"
    # bf16 on an A100: 2 bytes of weight, 2 of gradient and 4 of AdamW moments (torch keeps them in the weight's
    # dtype) a parameter, counted from the checkpoint as torch loads it.
    parameters, weight_bytes = _stored_parameters(path)
    estimate = plan.finetune.memory_estimate["16bit"]
    assert (estimate["weights"], estimate["gradients"], estimate["optimizer"]) == (
        weight_bytes,
        2 * parameters,
        4 * parameters,
    )
    assert "lora" not in estimate
    parts = ("weights", "gradients", "optimizer", "activations", "overhead")
    assert estimate["total"] == sum(estimate[k] for k in parts)
    assert plan.finetune.training_arguments["optim"] == "adamw_torch_fused"
    # The default is still LoRA, and says what full training would be.
    lora = cudaload.plan(path, machine=A100, finetune=True)
    assert lora.decision("train").value == "lora" and lora.finetune is not None and lora.finetune.lora is not None


def test_quantize_auto_plans_no_quantization_for_full_training_where_lora_would_take_4bit() -> None:
    t4 = cudaload.Machine.simulated("T4", packages={"bitsandbytes": "0.50.2", "peft": "0.21.2"})
    model = LLAMA_SHAPES["7B"]
    assert cudaload.plan(model, machine=t4, finetune=True).decision("quantize").value == "4bit"
    full = cudaload.plan(model, machine=t4, finetune=True, train="full")
    quantize = full.decision("quantize")
    assert quantize.value is None and quantize.source == "auto" and "quantization_config" not in full.kwargs
    # 7B in fp16 on a T4: 2 + 2 + 4 bytes a weight, which cannot fit 16 GB: the plan spreads and says so.
    assert full.finetune is not None and full.finetune.memory_estimate["16bit"]["optimizer"] == 4 * model.parameters


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"quantize": "4bit"}, r"train='full' with quantize='4bit'.*cannot be trained"),
        ({"quantize": "8bit"}, r"train='full' with quantize='8bit'"),
        ({"lora": {"r": 8}}, r"train='full' with lora=.*adds no LoRA adapters"),
        ({"train": "qlora"}, r"train='qlora': pass 'lora'.*or 'full'"),
    ],
)
def test_full_training_refuses_what_it_cannot_apply(tiny_models, kwargs: dict[str, Any], match: str) -> None:
    kwargs = {"train": "full", **kwargs}
    with pytest.raises(SettingError, match=match):
        cudaload.plan(tiny_models["qwen3"], machine=A100, finetune=True, **kwargs)


def test_train_without_finetune_is_refused(tiny_models) -> None:
    with pytest.raises(FinetuneConfigError, match=r"train='full' only applies to a fine-tuning plan"):
        cudaload.plan(tiny_models["qwen3"], machine=A100, train="full")


def test_full_training_needs_no_peft(tiny_models, monkeypatch: pytest.MonkeyPatch) -> None:
    no_peft = cudaload.Machine.simulated("A10G")  # a simulated machine has no peft unless given it
    assert any("no peft" in w for w in cudaload.plan(tiny_models["qwen3"], machine=no_peft, finetune=True).warnings)
    full = cudaload.plan(tiny_models["qwen3"], machine=no_peft, finetune=True, train="full")
    assert not any("peft" in w for w in full.warnings)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    model = load_for_finetune(str(tiny_models["llama"]), train="full", dtype="float32", seq_len=16)
    assert all(p.requires_grad for p in model.parameters())


def test_the_optimizer_holds_what_the_estimate_counts(tiny_models) -> None:
    """One step of torch's fused AdamW (the planned `optim`) on a bf16 model loaded for full training: its
    state, the gradients and the weights are the estimate's bytes."""
    model = load_for_finetune(str(tiny_models["qwen3"]), train="full", dtype="bfloat16", seq_len=16)
    estimate = model.cudaload_plan.plan.finetune.memory_estimate["16bit"]
    assert model.cudaload_plan.plan.finetune.training_arguments["optim"] == "adamw_torch_fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(2, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    params = list(model.parameters())
    assert sum(p.grad.numel() * p.grad.element_size() for p in params) == estimate["gradients"]
    assert sum(p.numel() * p.element_size() for p in params) == estimate["weights"]
    moments = [t for state in optimizer.state.values() for k, t in state.items() if k != "step"]
    assert {t.dtype for t in moments} == {torch.bfloat16}
    assert sum(t.numel() * t.element_size() for t in moments) == estimate["optimizer"]
    # and a 0-d step counter a tensor, which the estimate leaves out
    assert all(state["step"].numel() == 1 for state in optimizer.state.values())


class _Rows(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.mark.slow
def test_trainer_trains_every_weight_of_a_full_training_load(tiny_models, tmp_path) -> None:
    from transformers import PreTrainedModel, Trainer, TrainingArguments

    model = load_for_finetune(str(tiny_models["qwen3"]), train="full", seq_len=16)
    assert isinstance(model, PreTrainedModel) and not hasattr(model, "peft_config")
    applied = model.cudaload_plan.plan
    assert applied.finetune.train == "full" and applied.finetune.lora is None
    assert applied.finetune.trainable_parameters == sum(p.numel() for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())
    renamed = hasattr(model, "is_activation_checkpointing")  # transformers 5.23 renamed it
    assert model.is_activation_checkpointing if renamed else model.is_gradient_checkpointing
    assert model.config.use_cache is False
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = TrainingArguments(
        **training_arguments(
            model,
            output_dir=str(tmp_path),
            max_steps=3,
            per_device_train_batch_size=4,
            learning_rate=1e-2,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
        )
    )
    ids = torch.randint(2, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model=model, args=args, train_dataset=_Rows(ids))
    assert trainer.train().global_step == 3
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and losses[-1] < losses[0]
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []


def test_cli_plan_shows_the_train_decision_and_the_full_training_memory(tiny_models, capsys) -> None:
    assert main(["plan", str(tiny_models["qwen3"]), "--gpu", "A100", "--finetune", "--train", "full"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("train "))
    assert row.split()[:2] == ["train", "full"]
    memory = " ".join(out.split("training memory estimate", 1)[1].split())
    assert memory.split(":", 1)[1].split()[0] == "full" and "gradients" in memory and "optimizer" in memory
    assert "train='full'" in out  # the next step loads it as planned
    with pytest.raises(SystemExit) as exited:
        main(["plan", str(tiny_models["qwen3"]), "--gpu", "A100", "--train", "full"])
    assert exited.value.code == 2
    assert "--train describes a fine-tuning plan: add --finetune" in capsys.readouterr().err


def test_launch_files_for_full_training(tiny_models, tmp_path, capsys) -> None:
    files = cudaload.launch_files(
        tiny_models["qwen3"], machine=H100X8, nodes=2, emit=["torchrun"], main_address="10.0.0.1", train="full"
    )
    decisions = files.manifest["decisions"]
    assert decisions["train"] == "full" and "lora" not in decisions and decisions["quantize"] is None
    assert files.plan.finetune is not None and files.plan.finetune.parallelism is not None
    strategy = files.plan.finetune.parallelism["strategy"]
    size = files.plan.finetune.parallelism["sizes"][strategy]
    parameters, _ = _stored_parameters(tiny_models["qwen3"])
    assert size["gradients"] == 2 * parameters  # every weight's gradient (DDP keeps a whole copy), not LoRA's
    # A rank that plans LoRA differs from this launch, and says where.
    from cudaload.launch import check_launched_plan

    lora = cudaload.plan(tiny_models["qwen3"], machine=H100X8, finetune=True, nodes=2)
    with pytest.raises(cudaload.LaunchMismatchError, match=r"train: this rank \"lora\", planned before the launch"):
        check_launched_plan(lora, files.manifest)
    argv = ["launch", str(tiny_models["qwen3"]), "--gpu", "H100", "--count", "8", "--nodes", "2", "--train", "full"]
    assert main([*argv, "--out", str(tmp_path / "job")]) == 0
    written = json.loads((tmp_path / "job" / "cudaload-launch.json").read_text())
    assert written["decisions"]["train"] == "full"


def test_load_refuses_a_full_training_plan_saying_what_it_would_not_apply(tiny_models) -> None:
    plan = cudaload.plan(tiny_models["llama"], finetune=True, train="full", dtype="float32")
    with pytest.raises(SettingError, match=r"\(full training, quantize=None\).*neither the trainable weights"):
        cudaload.load(plan)
