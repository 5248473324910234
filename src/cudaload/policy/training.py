"""LoRA settings, k-bit preparation and TrainingArguments flags for fine-tuning."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import DtypeUnsupportedError, FinetuneConfigError
from ..facts.machine import Gpu, Machine
from ..facts.model import ModelFacts
from ..facts.packages import install_hint
from ..plans import Decision, Rejected
from ..upstream import CHECKPOINTING_RENAMED_SINCE
from .lora_targets import check_regex, is_target_regex, lora_leaves, lora_targets
from .memory import quantized_optimizer
from .parallelism import SHARDS_WEIGHTS

__all__ = [
    "LORA_DEFAULTS",
    "decide_lora",
    "decide_training_arguments",
    "launched_precision_warnings",
    "launcher_precision",
    "lora_targets",
]

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


def _task_type(model: ModelFacts) -> str:
    """peft's task type for the class the model loads through (`_known_task_type`), else a guess."""
    return _known_task_type(model) or ("CAUSAL_LM" if "LMHead" in model.model_class else "FEATURE_EXTRACTION")


def _known_task_type(model: ModelFacts) -> str | None:
    """peft's task type for the class the model loads through: its Auto class, or for a model class
    (e.g. "BertForSequenceClassification") the Auto class its name's suffix belongs to; None otherwise."""
    if model.auto_class in TASK_TYPES:
        return TASK_TYPES[model.auto_class]
    for auto, task in TASK_TYPES.items():
        suffix = auto.removeprefix("AutoModel")
        if suffix and model.model_class.endswith(suffix):
            return task
    return None


def _check_task_type(model: ModelFacts, requested: Any) -> None:
    """A peft task_type of another head than the class loaded (e.g. SEQ_CLS on a causal LM) is refused: peft
    would wrap the model in that task's PeftModel (peft 0.21 peft_model.py: PeftModelForSequenceClassification),
    whose forward and saved modules (`score`, `classifier`) are not this model's."""
    asked = str(getattr(requested, "value", requested))  # peft's TaskType is a str enum
    known = _known_task_type(model)
    if known is None or asked == known or asked not in TASK_TYPES.values():
        return
    wanted = next(auto for auto, task in TASK_TYPES.items() if task == asked)
    raise FinetuneConfigError(
        f"lora task_type={asked!r}: that is peft's task for {wanted}, but {model.model_class} loads through "
        f"{model.auto_class} (task_type {known!r}). To train that head, plan with model_class={wanted!r}; "
        "otherwise drop task_type (cudaload sets the model's own)."
    )


def _expert_targets(model: ModelFacts, requested: Any) -> list[str] | None:
    """peft `target_parameters` for fused MoE experts: validated against the model's."""
    if requested is None:
        return None
    names = [requested] if isinstance(requested, str) else list(requested)
    unknown = [n for n in names if n not in model.expert_parameters]
    if unknown:
        found = list(model.expert_parameters) or "none (not a fused-expert MoE)"
        raise FinetuneConfigError(
            f"LoRA target_parameters {unknown} match no fused expert weight of {model.model_class}. Its expert "
            f"parameters are {found}."
        )
    return names


def _check_lora_numbers(overrides: Mapping[str, Any]) -> None:
    """r, lora_alpha and lora_dropout checked here, before the base model loads (peft would only
    refuse them after)."""
    for key, value in overrides.items():
        # NaN and infinity pass every comparison test below (nan <= 0 is False), and peft accepts them; the
        # adapted model then gives NaN logits. Patterns (alpha_pattern, rank_pattern) hold numbers too.
        numbers = value.items() if isinstance(value, Mapping) else ((None, value),)
        for inner, number in numbers:
            if isinstance(number, float) and not math.isfinite(number):
                where = f"{key}[{inner!r}]" if inner is not None else key
                raise FinetuneConfigError(
                    f"lora {where}={number!r}: a LoRA number must be finite; a NaN or infinite scale makes every "
                    "logit of the adapted model NaN. Pass a finite number (lora_alpha is commonly 2 x r)."
                )
    r = overrides.get("r", 1)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise FinetuneConfigError(f"lora r={r!r}: the LoRA rank is a positive integer (e.g. 8, 16, 64).")
    alpha = overrides.get("lora_alpha", 1)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise FinetuneConfigError(f"lora lora_alpha={alpha!r}: a positive number (commonly 2 x r).")
    dropout = overrides.get("lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise FinetuneConfigError(f"lora lora_dropout={dropout!r}: a probability in [0, 1).")


def decide_lora(model: ModelFacts, overrides: Mapping[str, Any] | None) -> tuple[Decision, dict[str, Any]]:
    if overrides is not None and not isinstance(overrides, Mapping):
        raise FinetuneConfigError(f"lora={overrides!r}: pass a dict of LoraConfig arguments, e.g. {{'r': 8}}.")
    overrides = dict(overrides or {})
    _check_lora_numbers(overrides)
    if "task_type" in overrides:
        _check_task_type(model, overrides["task_type"])
    requested = overrides.pop("target_modules", None)
    regex = is_target_regex(model, requested)
    if regex:
        check_regex(requested)
    targets = lora_leaves(model, requested) if regex else lora_targets(model, requested)
    experts = _expert_targets(model, overrides.pop("target_parameters", None))
    # A regex goes to peft as given (peft matches it against full names, which the facts do not hold).
    config: dict[str, Any] = {**LORA_DEFAULTS, **overrides, "target_modules": requested if regex else list(targets)}
    if experts is not None:
        # peft's ParamWrapper (the LoRA layer for a parameter) raises "does not work with
        # lora_dropout != 0" (peft/tuners/lora/layer.py): checked here, before any weight loads.
        if overrides.get("lora_dropout", 0) != 0:
            raise FinetuneConfigError(
                f"lora target_parameters={experts} with lora_dropout={overrides['lora_dropout']}: peft adapts "
                "parameters only without dropout. Pass lora_dropout=0, or drop target_parameters."
            )
        config["lora_dropout"] = 0.0
        config["target_parameters"] = experts
    config.setdefault("task_type", _task_type(model))
    if model.conv1d:
        config["fan_in_fan_out"] = True  # GPT-2's Conv1D stores weights transposed
    yours = sorted([*overrides, *(["target_parameters"] if experts is not None else [])])
    where = f"every projection ({', '.join(targets)})"
    if regex:
        where = f"the modules whose full names match {requested!r} (peft's regex; sized as {', '.join(targets)})"
    rejected: tuple[Rejected, ...] = ()
    if model.expert_parameters:
        # transformers 5 fuses each MoE layer's experts into 3-D parameters: nn.Linear names reach
        # attention (and any dense MLP) only. peft >= 0.17 adapts parameters via target_parameters.
        where = f"the linear projections ({', '.join(targets)})"
        if experts is not None:
            where += f" and the fused experts ({', '.join(experts)})"
        else:
            rejected = (
                Rejected(
                    f"target_parameters={list(model.expert_parameters)}",
                    "the MoE experts are fused parameters, not linear layers, so they are not adapted; pass "
                    f"lora={{'target_parameters': {list(model.expert_parameters)}}} to adapt them too (peft "
                    "target_parameters)",
                ),
            )
    reason = f"r={config['r']}, alpha={config['lora_alpha']}, dropout={config['lora_dropout']} on {where}" + (
        f"; yours: {', '.join(yours)}" if yours else ""
    )
    return Decision("lora", config, reason, rejected, source="user" if yours else "auto"), config


def missing_peft(machine: Machine) -> tuple[str, ...]:
    """A fine-tuning plan for a machine without peft: load_for_finetune there raises, so the plan says it (as a
    quantize that needs a missing package raises) instead of looking ready."""
    if machine.software.has("peft"):
        return ()
    where = "the simulated machine has no peft" if machine.source == "simulated" else "peft is not installed"
    return (f"{where}: load_for_finetune needs it to add the LoRA adapters ({install_hint('peft')}).",)


def checkpointing_argument(machine: Machine) -> str:
    """TrainingArguments' name for checkpointing: transformers 5.23 renamed `gradient_checkpointing`
    (and `_kwargs`) to `activation_checkpointing`; the old names still work but warn (FutureWarning)."""
    renamed = machine.software.at_least("transformers", CHECKPOINTING_RENAMED_SINCE)
    return "activation_checkpointing" if renamed else "gradient_checkpointing"


# transformers' own default became non-reentrant (PR #43203, "Switch gradient checkpointing default to
# `use_reentrant=False`"): 5.22.2's `gradient_checkpointing_enable` and 5.25's `_activation_checkpointing_enable`
# (modeling_utils.py) both set `{"use_reentrant": False}` when given no kwargs; checked on those two.
NON_REENTRANT_DEFAULT_SINCE = "5.22.dev0"


def _reentrant_reason(machine: Machine) -> str:
    version = machine.software.version("transformers")
    if machine.software.at_least("transformers", NON_REENTRANT_DEFAULT_SINCE):
        return (
            f"non-reentrant checkpointing works with frozen inputs and DDP; transformers {version} defaults to it "
            "too, but said explicitly, since torch.utils.checkpoint and peft's k-bit preparation read an unset "
            "use_reentrant as reentrant"
        )
    return "non-reentrant checkpointing works with frozen inputs and DDP (a reentrant default does not)"


def launcher_precision(machine: Machine) -> tuple[Decision, Decision] | None:
    """The bf16/fp16 TrainingArguments flags as the launcher asked (`accelerate launch --mixed_precision`,
    ACCELERATE_MIXED_PRECISION); None when it asked nothing.

    TrainingArguments reads that variable and then lets its own flags override it (transformers 5.22-5.25
    training_args.py, "Mixed Precision": `if self.fp16: ... elif self.bf16: ...`), so a planned bf16=True
    would silently train bf16 under `--mixed_precision fp16` or `no`. The launch is the user's choice: the
    flags follow it. A GPU without bf16 cannot run a bf16 launch (accelerate raises only once training
    starts), so that is refused here.
    """
    launched = machine.launch.mixed_precision
    if launched is None:
        return None
    gpu = machine.weakest_gpu
    if launched == "bf16" and gpu is not None and not gpu.bf16:
        raise DtypeUnsupportedError(
            f"ACCELERATE_MIXED_PRECISION=bf16 (accelerate launch --mixed_precision bf16), but {gpu.name} ({gpu.sm}) "
            f"has no bf16: it needs {gpu.platform.bf16_since} or newer. Relaunch with --mixed_precision fp16 (or no)."
        )
    reason = (
        f"the launcher's: ACCELERATE_MIXED_PRECISION={launched} (accelerate launch --mixed_precision {launched}); "
        "TrainingArguments' flag would override it"
    )
    return (
        Decision("training.bf16", launched == "bf16", reason, source="user"),
        Decision("training.fp16", launched == "fp16", reason, source="user"),
    )


# torch lists "cpu" among the devices with fused optimizer kernels
# (torch 2.13 utils/_foreach_utils.py: _get_fused_kernels_supported_devices), and transformers defaults `optim` to
# "adamw_torch_fused" when torch >= 2.8 (in the class body: transformers 5.22-5.25 training_args.py:
# TrainingArguments.default_optim).
CPU_FUSED_ADAMW_SINCE = "2.8"


def _cpu_optimizer(machine: Machine) -> tuple[str, str, Rejected, Rejected]:
    """AdamW on a CPU: transformers' fused default where torch has fused AdamW on the CPU."""
    torch = machine.software.version("torch")
    paged = Rejected("paged_adamw_8bit", "paged optimizers need CUDA")
    if machine.software.at_least("torch", CPU_FUSED_ADAMW_SINCE):
        return (
            "adamw_torch_fused",
            f'torch {torch} has fused AdamW on the CPU (torch/utils/_foreach_utils.py lists "cpu"), and '
            f"transformers defaults to it from torch {CPU_FUSED_ADAMW_SINCE} (training_args.py, default_optim): "
            "one kernel per parameter group instead of one op per tensor",
            Rejected("adamw_torch", "one op per tensor per step: slower than fused AdamW on the same CPU"),
            paged,
        )
    found = f"torch {torch}" if torch else "torch not installed"
    return (
        "adamw_torch",
        f"{found}: transformers uses fused AdamW only from torch {CPU_FUSED_ADAMW_SINCE}, so the unfused one",
        Rejected("adamw_torch_fused", f"transformers picks it from torch {CPU_FUSED_ADAMW_SINCE}; {found}"),
        paged,
    )


def _sharded(machine: Machine, strategy: str | None) -> str | None:
    """The strategy that shards the parameters this plan trains, planned or launched, in words; None: none."""
    if strategy in SHARDS_WEIGHTS:
        return f"the planned {strategy}"
    launch = machine.launch
    if launch.distributed and launch.shards_parameters:
        return "this FSDP launch" if launch.strategy == "fsdp" else f"this DeepSpeed ZeRO-{launch.zero_stage} launch"
    return None


def decide_training_arguments(
    machine: Machine,
    dtype: str,
    quantized: bool | str,
    checkpointing: bool,
    current: Gpu | None = None,
    *,
    strategy: str | None = None,
) -> tuple[tuple[Decision, ...], dict[str, Any]]:
    """The TrainingArguments flags. `quantized`: the plan's `quantize` ("4bit", "checkpoint", ...; True: a
    quantized base of unnamed method) or False/None; a quantized base trains with its method's optimizer, but
    no 8-bit one where the parameters are sharded. `current`: the GPU that is torch's current device when
    TrainingArguments is built (it judges tf32 there). `strategy`: the plan's parallelism (None: none)."""
    gpu = machine.weakest_gpu
    decisions: list[Decision] = []

    def add(setting: str, value: Any, reason: str, *rejected: Rejected) -> None:
        decisions.append(Decision(f"training.{setting}", value, reason, tuple(rejected)))

    launched = launcher_precision(machine)
    if gpu is not None:
        if launched is not None:
            decisions.extend(launched)
        else:
            add("bf16", dtype == "bfloat16", f"mixed precision in the plan's dtype ({dtype})")
            add("fp16", dtype == "float16", f"mixed precision in the plan's dtype ({dtype})")
        # TF32 as the vendor's record says (TrainingArguments judges the current device: facts/platform_cuda.py).
        tf32, why_tf32, why_not = gpu.platform.tf32(gpu, current)
        if tf32 is not None:
            add("tf32", tf32, why_tf32, *((Rejected(not tf32, why_not),) if why_not else ()))
        if quantized:
            optim, why = quantized_optimizer(quantized if isinstance(quantized, str) else "checkpoint")
            paged = gpu.platform.paged_optimizers
            sharded = _sharded(machine, strategy)
            if optim.endswith("8bit") and sharded is not None:
                # bitsandbytes issues 89 ("8-bit optimizers dont work with FSDP") and 1633 (FSDP2): the optimizer
                # keeps its 8-bit state per local tensor, which under FSDP is a shard (a DTensor under FSDP2).
                add(
                    "optim",
                    "adamw_torch_fused",
                    f"fused AdamW: {sharded} shards the parameters, which bitsandbytes' 8-bit optimizers do not train",
                    Rejected(
                        optim,
                        f"bitsandbytes' 8-bit optimizers fail on sharded parameters (bitsandbytes issues 89 and 1633: "
                        f"FSDP, FSDP2), as {sharded} gives them",
                    ),
                )
            elif optim.startswith("paged_") and paged is not None:
                add(
                    "optim",
                    "adamw_torch_fused",
                    f"fused AdamW: {optim} is not planned on {gpu.platform.runtime}",
                    Rejected(optim, paged),
                )
            elif optim.endswith("8bit") and machine.software.version("bitsandbytes") is None:
                # A base quantized by its checkpoint (FP8, GPTQ, AWQ) needs no bitsandbytes to load, but Trainer
                # raises ImportError for a bitsandbytes optimizer without it (trainer_optimizer.py).
                add(
                    "optim",
                    "adamw_torch_fused",
                    "fused AdamW: the 8-bit paged optimizer needs bitsandbytes, which is not installed",
                    Rejected(
                        optim,
                        f"bitsandbytes is not installed ({install_hint('bitsandbytes')}): Trainer raises ImportError",
                    ),
                )
            else:
                eight_bit = optim.endswith("8bit")  # an 8-bit optimizer's state is a quarter of AdamW's
                add("optim", optim, why, *([Rejected("adamw_torch", "4x the optimizer memory")] if eight_bit else []))
        else:
            add("optim", "adamw_torch_fused", "fused AdamW: one kernel per step on CUDA")
    else:
        # The dtype decision already weighed bf16 on this CPU (measured, or by its ISA): follow it.
        bf16 = dtype == "bfloat16"
        if launched is not None:
            decisions.extend(launched)
        else:
            add("bf16", bf16, f"CPU autocast in the plan's dtype ({dtype})" if bf16 else f"the plan's dtype is {dtype}")
            add("fp16", False, "fp16 on CPU is emulated")
        add("optim", *_cpu_optimizer(machine))
        add("dataloader_pin_memory", False, "no GPU to copy to: pinned memory only costs (torch warns)")
        add(
            "use_cpu",
            True,
            "without it Trainer under torchrun on a CPU-only machine runs each rank alone "
            "(world size 1, no gradient averaging)",
        )
    name = checkpointing_argument(machine)
    add(
        name,
        checkpointing,
        "recompute activations in the backward: memory grows with layers, not with layers x activations"
        if checkpointing
        else "your choice: keep activations (faster, more memory)",
    )
    if checkpointing:
        add(f"{name}_kwargs", {"use_reentrant": False}, _reentrant_reason(machine))
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


_LAUNCHED_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def launched_precision_warnings(machine: Machine, model: ModelFacts, dtype: str) -> tuple[str, ...]:
    """What a launcher's mixed precision (followed by the TrainingArguments flags) means for this model: fp16
    for an fp16-fragile family is refused; another precision than the weights' dtype is said."""
    launched = machine.launch.mixed_precision
    if launched == "fp16" and model.fp16_fragile:
        raise DtypeUnsupportedError(
            f"ACCELERATE_MIXED_PRECISION=fp16 (accelerate launch --mixed_precision fp16), but {model.model_type} "
            "overflows in float16 (its activations exceed fp16's range: inf/NaN losses). Relaunch with "
            "--mixed_precision bf16 on an sm80+ GPU, or --mixed_precision no."
        )
    wanted = _LAUNCHED_DTYPES.get(launched or "")
    if wanted is None or wanted == dtype:
        return ()
    return (
        f"Launched with --mixed_precision {launched} (ACCELERATE_MIXED_PRECISION): training autocasts to "
        f"{wanted} as launched, while the weights load in {dtype} (the plan's dtype). Pass dtype={wanted!r} to "
        "load them in it too, or relaunch with the precision you want.",
    )
