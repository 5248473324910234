"""The pure policy: (machine facts, model facts, request) -> Plan.

No torch, no probing: every fact is an argument, so any machine can be planned for and
tests pass facts in. One module per decision; `decide_plan` composes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import ModelConfigError, PlacementError
from ..facts.machine import Machine
from ..facts.model import ModelFacts, multimodal_generator
from ..facts.placer import Placer
from ..facts.quant_methods import DEFAULT_QUANT_METHOD, config_method, quantization_method
from ..frozen import frozen
from ..plans import Decision, GenerationPlan, Plan
from ..request import PARALLELISM_CHOICES, Request, Workload
from .attention import decide_attention, decide_sub_model_attention
from .current_device import as_launched, decide_current_device, decide_rank_device
from .devices import check_max_memory, usable_machine
from .fit import HEADROOM, format_bytes, percent
from .generation import decide_generation
from .kernels import decide_use_kernels
from .lora_targets import lora_leaves
from .memory import lora_parameters, weight_bytes
from .placement import decide_placement
from .precision import decide_dtype
from .settle import settle_placement
from .stored_dtype import decide_stored_dtype
from .tensor_parallel import decide_tensor_parallel
from .tokenizer import decide_tokenizer
from .tuning import tune_on_gpu

# The edge (cli, bench) takes these too: the strategies --parallelism names, the usable machine doctor reports,
# bytes as GiB, the LoRA adapters' size (tests/test_layers.py: the edge imports only these of the policy).
__all__ = ["PARALLELISM_CHOICES", "Request", "Workload", "decide_plan", "decide_plan_generation", "format_bytes",
           "lora_leaves", "lora_parameters", "usable_machine"]  # fmt: skip


def decide_plan(machine: Machine, model: ModelFacts, request: Request, *, placer: Placer | None = None) -> Plan:
    """Every decision for `model` on `machine` as `request` asks, composed into a Plan.

    The names: `cudaload.plan()` (planner/) gathers the facts (detects the machine, reads the config) and
    calls this; this decides; `Plan` (plans/plan.py) is what it returns; `load()` applies it. `placer`
    is the fact provider for where transformers' own device_map="auto" puts the model (facts/placer.py;
    None: not asked). The placement step (settle.py `settle_placement`) composes, places and judges again
    until the GPUs judged are the GPUs the weights land on, in at most `PLACEMENT_ROUNDS` rounds; the
    generation sections follow. Nothing is judged after the Plan is returned.
    """
    machine, device_warnings = usable_machine(machine)
    warnings: list[str] = [*machine.warnings, *device_warnings, *machine.launch.notes]
    if machine.launch.problems:
        raise PlacementError(
            "The distributed launch variables are invalid: " + "; ".join(machine.launch.problems) + ". Fix them "
            "(torchrun and accelerate set them for you), or unset them for a single process."
        )

    def compose(judged: Machine) -> Plan:
        return _compose(machine, judged, model, request, warnings)

    plan = settle_placement(machine, model, request, compose, placer)
    generation = decide_plan_generation(machine, model, plan, request)
    # Each later link of the attention chain gets its own generation section now, so that load() only selects
    # the one of the attention it applied (a fallback changes compile, continuous batching, ...).
    fallbacks = tuple(
        (link, linked)
        for link in plan.attention_chain
        if generation is not None
        and link != plan.attn_implementation
        and (linked := decide_plan_generation(machine, model, plan.with_attention(link), request)) is not None
    )
    return replace(
        plan,
        generation=generation,
        generation_fallbacks=fallbacks,
        tokenizer=decide_tokenizer(model, generation),
        hub_code=request.hub_kernels is True or request.use_kernels is True,
    )


def decide_plan_generation(machine: Machine, model: ModelFacts, plan: Plan, request: Request) -> GenerationPlan | None:
    """The plan's generation section, decided for its dtype, attention and placement; None when the
    request asks for none, or asks "if the model generates" (generate=None) of a model that does not or
    whose config gives no KV-cache layout. `decide_plan` calls it once per link of the attention chain."""
    wanted = request.generation
    if wanted is None or (not wanted.required and (not model.generates or model.generation is None)):
        return None
    if model.generation is None:
        raise ModelConfigError(
            f"generate=True needs the KV-cache layout of {model.source}, and its facts have none: "
            + (
                f"{model.model_class} generates, but cudaload plans generate() (its KV cache) for text LMs loaded "
                "through AutoModelForCausalLM or AutoModelForSeq2SeqLM only, not a speech or image-text model's: "
                "plan it without generate=True (the load is still planned; generate() then runs with transformers' "
                "own cache settings)."
                if not model.generates and multimodal_generator(model.auto_class, model.model_class)
                else f"{model.auto_class} does not generate (plan a causal or seq2seq LM)."
                if not model.generates
                else "ModelFacts built by hand without generation=GenerationFacts(...), or a config whose decoder "
                "layers cudaload cannot read; pass the model's path, Hub id or PretrainedConfig."
            )
        )
    return decide_generation(
        machine,
        model.generation,
        dtype=plan.dtype,
        attention=plan.attn_implementation,
        weight_bytes=plan.weight_bytes or 0,
        device_map=plan.kwargs.get("device_map"),
        # cudaload quantizes by a method of facts/quant_methods.py; a pre-quantized checkpoint by its own
        quantized=_planned_quant_method(plan) if "quantization_config" in plan.kwargs else model.quantized,
        workload=request.workload,
        context=wanted.context,
        cache_implementation=wanted.cache_implementation,
        padding_side=wanted.padding_side,
    )


def _compose(machine: Machine, judged: Machine, model: ModelFacts, request: Request, found: list[str]) -> Plan:
    """decide_plan's decisions; `judged` is `machine` restricted to the GPUs the model goes on."""
    warnings = list(found)
    training = request.training
    # Fine-tuning runs forward and backward over whole sequences: a prefill-shaped workload.
    workload = (
        Workload(training.seq_len * training.batch_size, new_tokens=0, include_load=False, training=True)
        if training is not None
        else request.workload
    )
    dtype, dtype_warnings = decide_dtype(judged, model, request.dtype, workload)
    warnings += dtype_warnings
    # A bitsandbytes checkpoint's unquantized weights are applied in their stored dtype: planned as applied.
    dtype, stored_warnings = decide_stored_dtype(model, dtype, _asks_dequantize(request.passthrough))
    warnings += stored_warnings
    hub_code = request.hub_kernels is True or request.use_kernels is True
    attention, chain, cautions = decide_attention(
        judged,
        model,
        dtype.value,
        request.attn_implementation,
        hub_code,
        output_attentions=request.passthrough.get("output_attentions") is True,
    )
    warnings += cautions
    dtype, attention, chain = tune_on_gpu(judged, model, workload, dtype, attention, chain)
    use_kernels = decide_use_kernels(machine, request.use_kernels)
    decisions = [dtype, attention]
    per_sub_model = decide_sub_model_attention(model, attention)
    if per_sub_model is not None:
        decisions.append(per_sub_model)
    # An already-quantized checkpoint: kept quantized or dequantized by transformers on this machine (its policy and
    # the quantization methods' it asks are imported for such a checkpoint only: any other has none to decide).
    checkpoint = None
    if model.quantization is not None:
        from .checkpoint_quantization import decide_checkpoint_quantization

        checkpoint = decide_checkpoint_quantization(
            judged, model, dtype.value, use_kernels.value is True, _asks_dequantize(request.passthrough)
        )
    if checkpoint is not None:
        decisions.append(checkpoint.decision)
        warnings += checkpoint.warnings
    kwargs: dict[str, Any] = {"dtype": dtype.value, "attn_implementation": attention.value}
    section = None
    if training is not None:
        # Imported here: an inference plan, and load() in a fresh process, never pays for the training and
        # distributed policy's modules (issue 50: ~25 ms of the CPU a first load() spends importing).
        from .finetune_section import finetune_section

        section = finetune_section(machine, judged, model, training, request.device_map, dtype.value, checkpoint)
    quantize = section.quantize if section is not None else None
    if section is not None:
        decisions += section.decisions
        warnings += section.warnings
        if section.quantization_config is not None:
            kwargs["quantization_config"] = section.quantization_config
    dequantized_to = checkpoint.dequantized_to if checkpoint is not None else None
    size = weight_bytes(model, dtype.value, quantize, dequantized_to=dequantized_to)
    quantized = quantize is not None or (checkpoint is not None and dequantized_to is None)
    placed_on = as_launched(machine, section.plan.parallelism if section is not None else None)
    training_bytes = section.training_bytes if section is not None else None
    where = _placement_section(placed_on, model, request, size, quantized, training_bytes)
    decisions += [*where.decisions, use_kernels]
    warnings += where.warnings
    kwargs |= where.kwargs
    kwargs["use_kernels"] = use_kernels.value  # always passed: transformers 5.25 defaults it to True
    for key, value in request.passthrough.items():
        kwargs[key] = value
        decisions.append(Decision(key, value, "passed to from_pretrained as given", source="user"))
    return Plan(
        model=model.source,
        machine=machine.describe(),
        kwargs=kwargs,
        attention_chain=chain,
        decisions=tuple(decisions),
        warnings=tuple(warnings),
        explicit=frozenset(d.setting for d in decisions if d.source == "user"),
        model_class=model.model_class,
        auto_class=model.auto_class,
        parameters=model.parameters,
        weight_bytes=size,
        finetune=section.plan if section is not None else None,
        assumed_packages=machine.software.assumed_packages(),
    )


@frozen
class _Placement:
    """The placement section: its decisions, the from_pretrained kwargs they set, and their warnings."""

    decisions: tuple[Decision, ...]
    kwargs: dict[str, Any]
    warnings: tuple[str, ...]


def _placement_section(
    machine: Machine, model: ModelFacts, request: Request, size: int, quantized: bool, training_bytes: int | None
) -> _Placement:
    """Where the weights go: tensor parallelism, device_map, max_memory and, for a quantized model under
    FSDP / ZeRO-3, the rank's own GPU."""
    tp_requested = bool({"tp_plan", "tp_size", "distributed_config"} & set(request.passthrough))
    tensor_parallel = decide_tensor_parallel(
        machine, model, size, request.training is not None, tp_requested or request.device_map is not None
    )
    caps = check_max_memory(machine, request.max_memory) if request.max_memory is not None else None
    placement, max_memory, warnings = decide_placement(
        machine,
        size,
        request.device_map,
        quantized=quantized,
        training_bytes=training_bytes,
        tensor_parallel=tensor_parallel,
        tp_requested=tp_requested,
        caps=caps,
        trained="gradients" if request.training is not None and request.training.train == "full" else "LoRA",
    )
    decisions = [placement, *([tensor_parallel] if tensor_parallel is not None else [])]
    kwargs: dict[str, Any] = {}
    rank_device = decide_rank_device(machine, quantized, placement.value) or decide_current_device(
        machine, model, placement.value
    )
    if rank_device is not None:
        decisions.append(rank_device)  # applied by loaders.set_rank_device before from_pretrained
    if placement.value is not None:
        kwargs["device_map"] = placement.value
    if tensor_parallel is not None and tensor_parallel.value is not None:
        kwargs["tp_plan"] = tensor_parallel.value
    if caps is not None:
        kwargs["max_memory"] = caps
        decisions.append(Decision("max_memory", caps, "your choice", source="user"))
    elif max_memory is not None:
        kwargs["max_memory"] = max_memory
        reason = f"{percent(HEADROOM)} of each device's free memory (total memory when free is unknown)"
        decisions.append(Decision("max_memory", max_memory, reason))
    return _Placement(tuple(decisions), kwargs, tuple(warnings))


def _planned_quant_method(plan: Plan) -> str:
    """transformers' `quant_method` of the quantization_config in the plan (a dict of yours: its quant_method,
    bitsandbytes when it names none: planning refused any other, capability/quant_config.py)."""
    method = config_method(plan.decisions)
    if method is not None:
        return method.quant_method
    return quantization_method(plan.kwargs.get("quantization_config")) or DEFAULT_QUANT_METHOD


def _asks_dequantize(passthrough: Mapping[str, Any]) -> bool:
    """Your own quantization_config (passed through) asks transformers to dequantize the checkpoint."""
    config = passthrough.get("quantization_config")
    value = config.get("dequantize") if isinstance(config, Mapping) else getattr(config, "dequantize", False)
    return value is True
