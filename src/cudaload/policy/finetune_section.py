"""The fine-tuning section of a plan: LoRA or full training, quantization from each option's training-memory
estimate, k-bit preparation, the model's cache, the parallelism and the TrainingArguments flags.

Its own module so that an inference plan (and so `load()` in a fresh process) imports none of the training and
distributed policy: `decide_plan` imports it only when the request fine-tunes."""

from __future__ import annotations

from typing import Any

from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..facts.quant_methods import QUANT_METHODS
from ..frozen import frozen
from ..plans import Decision, FinetunePlan, Rejected
from ..plans.checkpoint import CheckpointPlan
from ..request import TrainingRequest
from .current_device import as_launched, current_gpu_when_training
from .engine_arguments import engine_arguments
from .full_training import decide_train, full_training_estimate, full_training_quantize
from .lora_targets import lora_leaves, rank_warnings
from .memory import TrainingMemory, lora_estimates
from .parallelism import SHARDS_WEIGHTS, parallel_section
from .quantization import decide_quantization
from .sharded_quantization import quantize_across_ranks
from .training import decide_lora, decide_training_arguments, launched_precision_warnings, missing_peft

__all__ = ["FinetuneSection", "finetune_section"]


@frozen
class FinetuneSection:
    """A fine-tuning plan's section: the `FinetunePlan`, its decisions, the quantization and the training bytes."""

    plan: FinetunePlan
    decisions: tuple[Decision, ...]
    quantize: str | None
    quantization_config: dict[str, Any] | None
    training_bytes: int
    warnings: tuple[str, ...]


def finetune_section(
    machine: Machine,
    judged: Machine,
    model: ModelFacts,
    training: TrainingRequest,
    device_map: Any,
    dtype: str,
    checkpoint: CheckpointPlan | None,
) -> FinetuneSection:
    """LoRA or full training, quantization (from the training-memory estimate of each option), k-bit
    preparation, the model's cache, the parallelism and the TrainingArguments flags."""
    dequantized_to = checkpoint.dequantized_to if checkpoint is not None else None
    train = decide_train(training, dtype)
    adapters: tuple[Decision, ...] = ()  # LoRA's: the adapters and the base's preparation
    warnings: tuple[str, ...]
    if training.train == "full":  # every weight trained: no adapters, no quantization (policy/full_training.py)
        lora_config = None
        estimates = full_training_estimate(machine, model, training, dtype, dequantized_to)
        quant, quant_config, warnings = full_training_quantize(training, checkpoint, model.source), None, ()
    else:
        lora, lora_config = decide_lora(model, training.lora)
        targets = lora_leaves(model, lora_config["target_modules"])
        estimates = lora_estimates(
            model, dtype=dtype, r=int(lora_config["r"]), targets=targets, seq_len=training.seq_len,
            batch=training.batch_size, checkpointing=training.gradient_checkpointing, on_gpu=bool(machine.gpus),
            checkpoint=checkpoint,
        )  # fmt: skip
        quant, quant_config, warnings = decide_quantization(
            machine, model, training.quantize, dtype, estimates, device_map, checkpoint, training.own_quantization
        )
        across = quantize_across_ranks(machine, model, training, dtype, estimates, lora_config, quant, checkpoint)
        if across is not None:
            quant, quant_config = across, quant_config if across.value is not None else None
        adapters = (lora, _kbit_preparation(quant.value))
    parallelism, parallel = parallel_section(machine, model, training, dtype, quant.value, estimates, lora_config)
    if parallel is not None and parallel.chosen in SHARDS_WEIGHTS and quant.value in QUANT_METHODS:
        # QLoRA with FSDP / ZeRO-3: the sharded 4-bit weights are stored in the compute dtype (quant storage).
        quant_config = QUANT_METHODS[quant.value].build(dtype, True)
    # A job of several ranks planned outside it gets the flags its ranks get (ddp_find_unused_parameters, ...).
    launched = as_launched(judged, parallel.as_dict() if parallel is not None else None)
    arguments, training_args = decide_training_arguments(
        launched,
        dtype,
        quant.value or False,
        training.gradient_checkpointing,
        current_gpu_when_training(machine),
        strategy=parallel.chosen if parallel is not None else None,
    )
    engine = engine_arguments(parallel, training, model)
    arguments = (*arguments, *engine)
    training_args = {**training_args, **{d.setting.removeprefix("training."): d.value for d in engine}}
    peft = missing_peft(machine) if lora_config is not None else ()  # full training needs no peft
    warnings = (*peft, *warnings, *launched_precision_warnings(judged, model, dtype))
    warnings = (*warnings, *(rank_warnings(model, lora_config) if lora_config is not None else ()))
    use_cache = _training_cache(training.gradient_checkpointing)
    plan = FinetunePlan(
        lora=lora_config,
        training_arguments=training_args,
        memory_estimate=_estimates_dict(estimates, training),
        gradient_checkpointing=training.gradient_checkpointing,
        checkpointing_kwargs=next((d.value for d in arguments if d.setting.endswith("checkpointing_kwargs")), {}),
        use_cache=use_cache.value,
        parallelism=parallel.as_dict() if parallel is not None else None,
        train=training.train,
    )
    return FinetuneSection(
        plan=plan,
        decisions=(train, quant, *adapters, use_cache, *arguments, *parallelism),
        quantize=quant.value,
        quantization_config=quant_config,
        training_bytes=estimates[quant.value].total,
        warnings=warnings,
    )


def _kbit_preparation(quantize: str | None) -> Decision:
    if quantize is None:
        return Decision("kbit_preparation", "freeze", "freeze the base; LoRA adapters are the only trainable weights")
    return Decision(
        "kbit_preparation",
        "freeze+checkpointing",
        "freeze the base, checkpoint without reentrancy, enable input grads; norms stay in the compute dtype",
        (
            Rejected(
                "prepare_model_for_kbit_training",
                "peft's helper upcasts every non-quantized weight to fp32 (81 GB vs 63 GB peak in one report)",
            ),
        ),
    )


def _training_cache(checkpointing: bool) -> Decision:
    """config.use_cache while fine-tuning: off. Training reads no KV cache, and with checkpointing on
    transformers turns it off by itself with a warning ("Caching is incompatible with gradient
    checkpointing", modeling_layers.py `GradientCheckpointingLayer.__call__`)."""
    reason = "training runs whole sequences and never reads a KV cache; building one costs memory"
    if checkpointing:
        reason += " (and transformers would turn it off under checkpointing, with a warning)"
    return Decision("use_cache", False, reason, (Rejected(True, "a cache is only read when generating"),))


def _estimates_dict(estimates: dict[str | None, TrainingMemory], training: TrainingRequest) -> dict[str, Any]:
    return {
        "assumes": {
            "seq_len": training.seq_len,
            "batch_size": training.batch_size,
            "gradient_checkpointing": training.gradient_checkpointing,
        },
        **{("16bit" if q is None else q): e.as_dict() for q, e in estimates.items()},
    }
