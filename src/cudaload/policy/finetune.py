"""LoRA settings, k-bit preparation and TrainingArguments flags for fine-tuning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..capability.facts import Machine
from ..errors import FinetuneConfigError
from ..model_facts import ModelFacts
from ..plans import Decision, Rejected

__all__ = ["LORA_DEFAULTS", "decide_lora", "decide_training_arguments", "lora_targets"]

# r=16 with alpha=2r is the common practitioner default (peft docs, most QLoRA recipes use
# r 8-64); dropout 0.05 as in the QLoRA paper's smaller models; adapters on every projection
# (QLoRA: "LoRA on all linear layers is needed to match full fine-tuning").
LORA_DEFAULTS: dict[str, Any] = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "bias": "none"}

TASK_TYPES = {
    "AutoModelForCausalLM": "CAUSAL_LM",
    "AutoModelForSequenceClassification": "SEQ_CLS",
    "AutoModelForTokenClassification": "TOKEN_CLS",
    "AutoModelForSeq2SeqLM": "SEQ_2_SEQ_LM",
    "AutoModelForQuestionAnswering": "QUESTION_ANS",
    "AutoModel": "FEATURE_EXTRACTION",
}


def lora_targets(model: ModelFacts, requested: Any) -> tuple[str, ...]:
    """The leaf module names LoRA wraps; a requested name that matches nothing raises."""
    if requested is None or requested == "all-linear":
        if not model.linear_names:
            raise FinetuneConfigError(f"{model.model_class} has no linear layers for LoRA to wrap.")
        return model.linear_names
    names = (requested,) if isinstance(requested, str) else tuple(requested)
    unknown = [n for n in names if n not in model.linear_names]
    if unknown:
        raise FinetuneConfigError(
            f"LoRA target_modules {unknown} match no linear layer of {model.model_class}. Its linear layers are "
            f"{list(model.linear_names)}; pick from those, or pass 'all-linear'."
        )
    return names


def decide_lora(model: ModelFacts, overrides: Mapping[str, Any] | None) -> tuple[Decision, dict[str, Any]]:
    overrides = dict(overrides or {})
    targets = lora_targets(model, overrides.pop("target_modules", None))
    config: dict[str, Any] = {**LORA_DEFAULTS, **overrides, "target_modules": list(targets)}
    config.setdefault("task_type", TASK_TYPES.get(model.auto_class, "CAUSAL_LM"))
    if model.conv1d:
        config["fan_in_fan_out"] = True  # GPT-2's Conv1D stores weights transposed
    yours = sorted(overrides)
    reason = (
        f"r={config['r']}, alpha={config['lora_alpha']}, dropout={config['lora_dropout']} on every projection "
        f"({', '.join(targets)})" + (f"; yours: {', '.join(yours)}" if yours else "")
    )
    return Decision("lora", config, reason, source="user" if yours else "auto"), config


def decide_training_arguments(
    machine: Machine, dtype: str, quantized: bool, checkpointing: bool
) -> tuple[tuple[Decision, ...], dict[str, Any]]:
    gpu = machine.weakest_gpu
    decisions: list[Decision] = []

    def add(setting: str, value: Any, reason: str, *rejected: Rejected) -> None:
        decisions.append(Decision(f"training.{setting}", value, reason, tuple(rejected)))

    if gpu is not None:
        add("bf16", dtype == "bfloat16", f"mixed precision in the plan's dtype ({dtype})")
        add("fp16", dtype == "float16", f"mixed precision in the plan's dtype ({dtype})")
        if gpu.bf16:
            add("tf32", True, f"{gpu.sm} has TF32 tensor cores: fp32 matmuls (LoRA, optimizer) run faster")
        if quantized:
            add(
                "optim",
                "paged_adamw_8bit",
                "QLoRA on CUDA: 8-bit paged AdamW keeps optimizer spikes off the GPU",
                Rejected("adamw_torch", "4x the optimizer memory"),
            )
        else:
            add("optim", "adamw_torch_fused", "fused AdamW: one kernel per step on CUDA")
    else:
        # The dtype decision already weighed bf16 on this CPU (measured, or by its ISA): follow it.
        bf16 = dtype == "bfloat16"
        add("bf16", bf16, f"CPU autocast in the plan's dtype ({dtype})" if bf16 else f"the plan's dtype is {dtype}")
        add("fp16", False, "fp16 on CPU is emulated")
        add(
            "optim",
            "adamw_torch",
            "CPU: paged and fused optimizers are CUDA-only",
            Rejected("paged_adamw_8bit", "needs CUDA"),
        )
        add("dataloader_pin_memory", False, "no GPU to copy to: pinned memory only costs (torch warns)")
        add(
            "use_cpu",
            True,
            "without it Trainer under torchrun on a CPU-only machine runs each rank alone "
            "(world size 1, no gradient averaging)",
        )
    add(
        "gradient_checkpointing",
        checkpointing,
        "recompute activations in the backward: memory grows with layers, not with layers x activations"
        if checkpointing
        else "your choice: keep activations (faster, more memory)",
    )
    if checkpointing:
        add(
            "gradient_checkpointing_kwargs",
            {"use_reentrant": False},
            "non-reentrant checkpointing works with frozen inputs and DDP (the reentrant default does not)",
        )
    launch = machine.launch
    if launch.distributed and launch.strategy == "ddp":
        add(
            "ddp_find_unused_parameters",
            False,
            "LoRA leaves the frozen base unused by the optimizer; searching for unused parameters costs a graph "
            "walk per step",
        )
    args = {d.setting.removeprefix("training."): d.value for d in decisions}
    return tuple(decisions), args
