"""`plan()`: detect (or take) the machine, read the model's config, run the policy."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..capability.quant_config import check_quantization_config
from ..errors import SettingError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Plan
from ..request import Workload, check_flag, model_class_name, workload_from
from .apply_facts import apply_facts
from .arguments import check_model, generation_request, parallel_request, split_overrides, training_request
from .check_proof import check_proof
from .gather import read_facts, upstream_placer, with_measurements
from .plan_store import plan_key, store_plan, stored_plan

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["plan"]


def plan(
    model: str | os.PathLike[str] | PretrainedConfig | ModelFacts,
    *,
    machine: Machine | None = None,
    model_class: str | type | None = None,
    finetune: bool = False,
    train: str | None = None,
    quantize: str | None = "auto",
    lora: Mapping[str, Any] | None = None,
    gradient_checkpointing: bool | None = None,
    seq_len: int | None = None,
    batch_size: int | None = None,
    workload: str | tuple[int, int] | Workload | None = None,
    probe: bool = True,
    hub_kernels: bool | None = None,
    generate: bool | None = False,
    context: int | None = None,
    cache_implementation: str | None = None,
    padding_side: str | None = None,
    nodes: int | None = None,
    ranks_per_node: int | None = None,
    interconnect: str | None = None,
    parallelism: str | None = None,
    node_memory: int | str | None = None,
    **overrides: Any,
) -> Plan:
    """The from_pretrained settings for `model` on `machine` (default: this one), each with its reason.

    Loads no weights. Your from_pretrained keyword arguments are validated and kept (an impossible one
    raises); the rest is decided for the machine and the model. What is measured, what needs your consent and
    what each section of the plan holds: [What plan() decides](#what-plan-decides) on the API page.

    Args:
        model: A local path (str or PathLike), a Hub id (read through the local cache), a transformers
            `PretrainedConfig`, or `ModelFacts`.
        machine: The `Machine` to plan for. Default None: this one, detected, with its measurements. A machine
            you pass, e.g. `Machine.simulated("T4")`, is planned as given.
        model_class: The transformers Auto class or model class the model will be loaded with, or its name.
            Default None: the checkpoint's own architecture (config.json's "architectures").
        finetune: Plan fine-tuning (LoRA, quantization, TrainingArguments, a memory estimate) instead of
            inference (default False).
        train: Fine-tuning only: "lora" (default None: "lora", adapters on a frozen base) or "full" (every
            weight trained in the plan's dtype, no adapters, no quantization; the estimate counts each weight's
            gradient and AdamW's two moments in that dtype).
        quantize: Fine-tuning only: "4bit", "8bit", None or "auto" (the default: 4-bit only when 16-bit LoRA
            would not fit at `seq_len` x `batch_size`; with train="full" none, and "4bit"/"8bit" are refused).
        lora: Fine-tuning only: LoraConfig keyword overrides (default None: planned from the model; not with
            train="full").
        gradient_checkpointing: Fine-tuning only: trade compute for activation memory (default None: True).
        seq_len: Fine-tuning only: the sequence length the memory estimate assumes (default None: 2048).
        batch_size: Fine-tuning only: the batch size the memory estimate assumes (default None: 1).
        workload: What a measured CPU dtype choice optimises: "balanced" (the default, also for None),
            "prefill-heavy", "decode-heavy", a (prompt_tokens, new_tokens) pair or a `Workload`.
        probe: Measure this CPU's dtype speeds when no tuning record applies (default True; CUDALOAD_PROBE=0
            also turns it off). Only used when `machine` is None.
        hub_kernels: Consent to plan a `kernels-community` attention kernel that is not cached (default None:
            cached kernels only).
        generate: True: plan generation (`plan.generation`); False (the default): don't; None: plan it when
            the config can be read for it.
        context: Generation only: prompt + new tokens the largest batch is computed for (default: the
            workload's, capped at the model's max positions).
        cache_implementation: Generation only: your cache implementation ("dynamic", "static", "offloaded",
            "offloaded_static", "quantized"); default None: planned.
        padding_side: Generation only: "left" or "right"; default None: planned.
        nodes: Fine-tuning only: the machines the job will run on, each like `machine`; the plan then decides
            `parallelism` and sizes each rank. Default None: only under a multi-rank launch.
        ranks_per_node: Fine-tuning only: processes per node (default None: one per GPU; 1 on a CPU).
        interconnect: Fine-tuning only: the link between nodes, one of
            `cudaload.facts.interconnect.INTERCONNECTS`, optionally with the NICs a node has after a colon
            ("ethernet-100g:2"; default None: "ethernet-100g", the slow one).
        parallelism: Fine-tuning only: "auto" (default), "deepspeed" or one strategy ("ddp", "fsdp",
            "fsdp-hybrid", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero3-offload";
            "tp+fsdp", tensor parallel, is refused for training).
        node_memory: Fine-tuning only: each node's RAM, bytes or a size such as "512GiB" (default None: this
            machine's; a simulated machine's as simulated, 64 GiB unless told). ZeRO-3 offload's CPU state must
            fit it.
        **overrides: from_pretrained keyword arguments. cudaload's own settings (`attn_implementation`,
            `dtype` or its old name `torch_dtype`, `device_map`, `max_memory`, `use_kernels`) are validated
            and honoured; any other is passed through untouched (those that choose the files, e.g.
            `subfolder` or `revision`, also to read the config).

    Returns:
        The `Plan`: the from_pretrained kwargs, the attention fallback chain and one `Decision` per setting
        (print `plan.explain()`).

    Raises:
        SettingError: a flag that is not a real bool, a size that is not a positive int, a setting given where
            it does not apply (generation settings without `generate=True`), an impossible generation setting,
            an unknown `train`, or train="full" with a quantized base or `lora`.
        WorkloadError: an unknown `workload`.
        ModelConfigError: a `model` of another type or whose config cannot be read (the message says what the
            folder holds instead), or `generate=True` for a model without a KV-cache layout.
        RemoteCodeError: the model needs `trust_remote_code=True` and it was not given.
        FinetuneConfigError: `lora` or `train` without `finetune=True`, or LoRA settings not valid for this model.
        QuantizationError: an unknown `quantize`, or a quantization that cannot apply to this checkpoint.
        DtypeUnsupportedError: a `dtype` this machine cannot run (bfloat16 before sm80, an unknown name).
        AttentionUnavailableError: an `attn_implementation` this machine or model cannot run.
        PlacementError: a `device_map`/`max_memory` that cannot work here, invalid launch variables, or a
            `parallelism` that does not fit the ranks or the nodes' RAM, or that this launch's engine or
            training cannot apply (tensor parallel).
        MissingPackageError: `use_kernels=True` or a 4-/8-bit `quantize` without its package.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> plan = cudaload.plan(path, machine=cudaload.Machine.simulated("T4"))
        >>> plan.dtype, plan.attn_implementation, plan.kwargs["device_map"]
        ('float16', 'sdpa', 'cuda:0')
    """
    for name, value, allow_none in (("generate", generate, True), ("finetune", finetune, False)):
        check_flag(name, value, allow_none)
    generation = generation_request(generate, finetune, context, cache_implementation, padding_side)
    check_model(model)
    check_flag("probe", probe, allow_none=False)
    training = training_request(finetune, quantize, lora, gradient_checkpointing, seq_len, batch_size, overrides, train)
    training = parallel_request(training, nodes, ranks_per_node, interconnect, parallelism, node_memory)
    # A quantization_config transformers would not build as given (a string, another method's dict, a typo) is
    # refused here, before any weight is read, not after loading as 4-bit bitsandbytes.
    check_quantization_config(overrides.get("quantization_config"), str(getattr(model, "source", model)))
    model_class = model_class_name(model_class)
    # Validated before anything is read: a bad flag must not reach the config loader.
    check_flag("hub_kernels", hub_kernels, allow_none=True)
    request = split_overrides(
        overrides, workload=workload_from(workload), hub_kernels=hub_kernels, generation=generation, training=training
    )
    if machine is not None and not isinstance(machine, Machine):
        raise SettingError(
            f"machine={machine!r:.60} ({type(machine).__name__}): pass a cudaload.Machine, e.g. "
            f"cudaload.Machine.simulated({machine!r:.20}) for a GPU you do not have, or leave it unset for this one."
        )
    detected = machine is None
    if machine is None:
        from ..capability import detect

        machine = detect()
    facts = model if isinstance(model, ModelFacts) else read_facts(model, model_class, overrides)
    if detected:
        machine = with_measurements(machine, facts, probe, request)
    # A plan decided before from the same inputs is read back: the policy is neither imported nor run (plan_store.py).
    key = plan_key(model, machine, facts, request, overrides) if detected else None
    result = stored_plan(key, machine) if key is not None else None
    if result is None:
        from ..policy import decide_plan

        # Where transformers itself places a spread depends on the dtype the policy picks: a fact the policy asks for.
        placer = None if isinstance(model, ModelFacts) else upstream_placer(model, facts, overrides)

        def decide(judged: Machine) -> Plan:
            return decide_plan(judged, facts, request, placer=placer)

        result = decide(machine)
        if key is not None:
            store_plan(key, result, machine, decide)
    if result.finetune is not None and result.finetune.lora is not None:
        from ..capability.transformers_api import check_lora_settings

        check_lora_settings(result.finetune.lora, lora)  # peft's own check, here, before any weight is read
    if detected and result.finetune is None and isinstance(model, (str, os.PathLike)):
        # Whether load()'s test forward already passed for this checkpoint, kwargs, versions and machine.
        result = replace(result, check_proof=check_proof(str(model), result, machine, overrides))
    result = replace(result, apply_facts=apply_facts(result, machine if detected else None))
    measured = machine.dtype_probe
    if measured is not None and not measured.from_cache:
        result = replace(result, timings={"probe": measured.cost_s})
    if measured is not None and measured.confidence != "quiet" and request.dtype is None:
        from ..announce import announce  # a disturbed probe only

        # Said here, where the dtype is known: the plan kept the checkpoint's (policy/precision.py: _kept_checkpoint).
        kept = next((d.value for d in result.decisions if d.setting == "dtype"), "the checkpoint's dtype")
        announce(
            "cudaload.probe",
            f"the CPU dtype probe for {facts.source} was disturbed ({measured.conditions}): kept {kept}; "
            f"`cudaload probe {facts.source}` measures again",
            logging.WARNING,
        )
    return result
