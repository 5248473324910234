"""`plan()`: detect (or take) the machine, read the model's config, run the policy."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..announce import announce
from ..capability.model_config import model_class_name
from ..errors import SettingError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Plan
from ..policy import decide_plan
from ..request import Workload, check_flag, workload_from
from .arguments import _check_model, _generation_request, _training_request, parallel_request, split_overrides
from .check_proof import check_proof
from .gather import _judged_upstream, _measured, _read_facts

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["plan"]


def plan(
    model: str | os.PathLike[str] | PretrainedConfig | ModelFacts,
    *,
    machine: Machine | None = None,
    model_class: str | type | None = None,
    finetune: bool = False,
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
    **overrides: Any,
) -> Plan:
    """The from_pretrained settings for `model` on `machine` (default: this one). Loads no weights.

    `overrides` are from_pretrained keyword arguments: the ones cudaload decides
    (attn_implementation, dtype, device_map, max_memory, use_kernels) are validated and
    honoured, an impossible one raises; any other is passed through untouched.

    With `finetune=True` the plan also covers quantization (`quantize`: "4bit", "8bit", None
    or "auto"), LoRA (`lora`: LoraConfig overrides), gradient checkpointing, TrainingArguments
    flags and a memory estimate at `seq_len` x `batch_size`.

    On a CPU the dtype is the one measured fastest here for `workload` ("balanced": load + a
    512-token prompt + 128 new tokens; "prefill-heavy", "decode-heavy", or a (prompt_tokens,
    new_tokens) pair): from a tuning record saved by `cudaload bench --save`, else a short matmul
    probe of this CPU, cached per machine. `probe=False` (or CUDALOAD_PROBE=0) plans from the static
    table instead. A machine you pass is planned as given: a simulated one has no measurements.

    Hub code needs consent: a `kernels-community` attention kernel that is not in the local cache
    is planned only with `hub_kernels=True` (or `use_kernels=True`, itself opt-in Hub code).

    With `generate=True` the plan also has `plan.generation` (see `GenerationPlan`): the KV-cache
    size per token, the largest batch of `context`-token sequences (default: the workload's prompt +
    new tokens) that fits beside the weights, the cache implementation and whether generate() will
    compile, and the tokenizer padding side. `cache_implementation` and `padding_side` are your
    choices for those, validated and kept. `generate=None` plans generation when the config can be
    read for it and leaves `plan.generation` None otherwise (what `load()` does for generating models).

    Args:
        model: A local path (str or PathLike), a Hub id (read through the local cache; with
            HF_HUB_OFFLINE=1 only what is cached), a transformers `PretrainedConfig`, or
            `ModelFacts` (with `generate=True`, facts that carry their `generation` layout, as
            `read_model_facts()` reads them).
        machine: The `Machine` to plan for. Default None: `detect()` this one, with its
            measurements (tuning records, the CPU dtype probe). A machine you pass, e.g.
            `Machine.simulated("T4")`, is planned as given.
        model_class: The transformers Auto class (or model class) the model will be loaded with,
            as a class or its name; it decides the model class whose parameters and attention
            support are read. Default None: the checkpoint's own architecture (config.json's
            "architectures": a saved `BertModel` through AutoModel, a causal LM through
            AutoModelForCausalLM).
        finetune: Plan fine-tuning (LoRA, quantization, TrainingArguments, a memory estimate)
            instead of inference (default False).
        quantize: Fine-tuning only: "4bit", "8bit", None or "auto" (the default: 4-bit only when
            16-bit LoRA would not fit at `seq_len` x `batch_size`).
        lora: Fine-tuning only: LoraConfig keyword overrides (default None: planned from the model).
        gradient_checkpointing: Fine-tuning only: trade compute for activation memory (default
            None: True).
        seq_len: Fine-tuning only: sequence length the memory estimate assumes (default None: 2048).
        batch_size: Fine-tuning only: batch size the memory estimate assumes (default None: 1).
        workload: What a measured CPU dtype choice optimises: "balanced" (the default, also for
            None), "prefill-heavy", "decode-heavy", a (prompt_tokens, new_tokens) pair or a
            `Workload`; it also sets the default generation context.
        probe: Measure this CPU's dtype speeds when no tuning record applies (default True;
            CUDALOAD_PROBE=0 also turns it off). Only used when `machine` is None.
        hub_kernels: Consent to plan a `kernels-community` attention kernel that is not cached
            (default None: cached kernels only).
        generate: True: plan generation (`plan.generation`); False (the default): don't; None:
            plan it when the config can be read for it.
        context: Generation only: prompt + new tokens `max_batch` is computed for (default: the
            workload's, capped at the model's max positions).
        cache_implementation: Generation only: your cache implementation ("dynamic", "static",
            "offloaded", "offloaded_static", "quantized"); default None: planned.
        padding_side: Generation only: "left" or "right"; default None: planned.
        nodes: Fine-tuning only: the machines the job will run on, each like `machine`; with it the plan
            decides `parallelism` (DDP, FSDP2 full or hybrid shard, DeepSpeed ZeRO, tensor parallel) and
            sizes each rank (`plan.finetune.parallelism`). Default None: only under a multi-rank launch.
        ranks_per_node: Fine-tuning only: processes per node (default None: one per GPU; 1 on a CPU).
        interconnect: Fine-tuning only: the link between nodes, one of
            `cudaload.facts.interconnect.INTERCONNECTS` (default None: "ethernet-100g", the slow one).
        parallelism: Fine-tuning only: "auto" (default), "deepspeed" or one strategy ("ddp", "fsdp",
            "fsdp-hybrid", "deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero3-offload", "tp+fsdp").
        **overrides: from_pretrained keyword arguments. cudaload's own settings
            (`attn_implementation`, `dtype` or its old name `torch_dtype`, `device_map`,
            `max_memory`, `use_kernels`) are validated and honoured; any other (`revision`,
            `trust_remote_code`, `quantization_config`, ...) is passed through untouched. Those that
            choose which files are read (`subfolder`, `revision`, `cache_dir`, `gguf_file`, `token`,
            `config` as a PretrainedConfig, ...) are also used to read the config, as from_pretrained
            reads it, so the model planned is the model loaded.

    Returns:
        The `Plan`: the from_pretrained kwargs, the attention fallback chain and one `Decision`
        per setting (print `plan.explain()`).

    Raises:
        SettingError: a flag that is not a real bool (`use_kernels`, `hub_kernels`, `generate`,
            `trust_remote_code`, `gradient_checkpointing`, ...), a `seq_len`/`batch_size` that is not
            a positive int, a non-string `attn_implementation`, generation settings without
            `generate=True` or with `finetune=True`, an impossible generation setting, a `config=`
            that is not a PretrainedConfig, or a `subfolder`/`gguf_file` that is not a name.
        WorkloadError: an unknown `workload`.
        ModelConfigError: `model` of another type, an empty name, a config that cannot be read
            (the message says what the folder holds instead: a PEFT adapter, GGUF files, models in
            subfolders), a `subfolder` that is not there, or `generate=True` for a model without a
            KV-cache layout (not a causal or seq2seq LM, or ModelFacts without `generation`).
        RemoteCodeError: the model needs `trust_remote_code=True` and it was not given.
        FinetuneConfigError: `lora` without `finetune=True`, or LoRA settings not valid for this model.
        QuantizationError: an unknown `quantize`, an already quantized checkpoint, or both
            `quantize` and `quantization_config` with `finetune=True`.
        DtypeUnsupportedError: an unknown `dtype`, bfloat16 on a GPU older than sm80, both
            `dtype` and `torch_dtype`, or a fine-tuning launch precision that cannot work
            (`accelerate launch --mixed_precision fp16` for an fp16-fragile family, bf16 before sm80).
        AttentionUnavailableError: an `attn_implementation` this machine or model cannot run.
        PlacementError: a `device_map`/`max_memory` that cannot work here (`"meta"` anywhere, or
            every weight on `"disk"`), or invalid launch variables.
        MissingPackageError: `use_kernels=True` or a 4-/8-bit `quantize` without its package.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> plan = cudaload.plan(path, machine=cudaload.Machine.simulated("T4"))
        >>> plan.dtype, plan.attn_implementation, plan.kwargs["device_map"]
        ('float16', 'sdpa', 'cuda:0')
        >>> h100 = cudaload.Machine.simulated("H100")
        >>> plan = cudaload.plan(path, machine=h100, generate=True, workload="decode-heavy")
        >>> plan.generation.generate_kwargs, plan.generation.padding_side
        ({'cache_implementation': 'static'}, 'left')
    """
    for name, value, allow_none in (("generate", generate, True), ("finetune", finetune, False)):
        check_flag(name, value, allow_none)
    generation = _generation_request(generate, finetune, context, cache_implementation, padding_side)
    _check_model(model)
    check_flag("probe", probe, allow_none=False)
    training = _training_request(finetune, quantize, lora, gradient_checkpointing, seq_len, batch_size, overrides)
    training = parallel_request(training, nodes, ranks_per_node, interconnect, parallelism)
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
    facts = model if isinstance(model, ModelFacts) else _read_facts(model, model_class, overrides)
    if detected:
        machine = _measured(machine, facts, probe, request)
    result = decide_plan(machine, facts, request)
    if result.finetune is not None:
        from ..capability.transformers_api import check_lora_settings

        check_lora_settings(result.finetune.lora, lora)  # peft's own check, here, before any weight is read
    if not isinstance(model, ModelFacts):
        result = _judged_upstream(model, result, overrides)
    if detected and result.finetune is None and isinstance(model, (str, os.PathLike)):
        # Whether load()'s test forward already passed for this checkpoint, kwargs, versions and machine.
        result = replace(result, check_proof=check_proof(str(model), result, machine, overrides))
    measured = machine.dtype_probe
    if measured is not None and not measured.from_cache:
        result = replace(result, timings={"probe": measured.cost_s})
    if measured is not None and measured.confidence != "quiet" and request.dtype is None:
        # Said here, where the dtype is known: the plan kept the checkpoint's (policy/precision.py: _kept_checkpoint).
        kept = next((d.value for d in result.decisions if d.setting == "dtype"), "the checkpoint's dtype")
        announce(
            "cudaload.probe",
            f"the CPU dtype probe for {facts.source} was disturbed ({measured.conditions}): kept {kept}; "
            f"`cudaload probe {facts.source}` measures again",
            logging.WARNING,
        )
    return result
