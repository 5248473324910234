"""`plan()`: detect (or take) the machine, read the model's config, run the policy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .capability.model_config import model_class_name, read_model_facts
from .errors import (
    AttentionUnavailableError,
    DtypeUnsupportedError,
    FinetuneConfigError,
    ModelConfigError,
    PlacementError,
    QuantizationError,
    SettingError,
)
from .facts.machine import Machine
from .facts.model import ModelFacts
from .plans import Plan
from .policy import decide_plan
from .request import (
    GenerationRequest,
    Request,
    TrainingRequest,
    Workload,
    check_count,
    check_flag,
    workload_from,
)
from .upstream_imports import import_transformers

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["check_count", "check_flag", "plan", "split_overrides"]

_SETTINGS = ("attn_implementation", "dtype", "device_map", "max_memory", "use_kernels")


def _check_attention_name(name: str) -> None:
    """An attention name transformers would take: "eager", one registered in its AttentionInterface
    (sdpa, flash_attention_N, flex_attention, paged|..., yours), or a Hub kernel repo ("org/repo").

    transformers refuses any other name only inside from_pretrained (`get_correct_attn_implementation`
    in modeling_utils.py checks `["eager"] + ALL_ATTENTION_FUNCTIONS.valid_keys()`); checked here, a
    typo fails at plan time with a suggestion instead of after reading the config and weights.
    """
    import difflib

    import_transformers()
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    known = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    if name in known or ("/" in name and name.strip("/") == name and " " not in name):
        return
    close = difflib.get_close_matches(name.lower().replace("-", "_"), known, n=1, cutoff=0.6)
    raise AttentionUnavailableError(
        f"attn_implementation={name!r} is not an attention implementation transformers knows"
        + (f": did you mean {close[0]!r}?" if close else ".")
        + f" Known here: {', '.join(sorted(known))}, or a Hub kernel repo such as 'kernels-community/flash-attn2'; "
        "leave it unset to let cudaload choose."
    )


def split_overrides(overrides: dict[str, Any], **extra: Any) -> Request:
    """Turn from_pretrained-style kwargs into a Request; unknown keys pass through untouched."""
    rest = dict(overrides)
    check_flag("use_kernels", rest.get("use_kernels"), allow_none=True)
    if "trust_remote_code" in rest:
        check_flag("trust_remote_code", rest["trust_remote_code"], allow_none=False)
    attn = rest.get("attn_implementation")
    if attn is not None and not isinstance(attn, str):
        raise SettingError(
            f"attn_implementation={attn!r} ({type(attn).__name__}): pass a name such as 'sdpa', 'eager', "
            "'flash_attention_2' or a Hub kernel repo, or leave it unset."
        )
    if attn is not None:
        _check_attention_name(attn)
    for flag in ("load_in_8bit", "load_in_4bit"):
        if flag in rest:
            bits = flag.removeprefix("load_in_")
            raise QuantizationError(
                f"{flag}={rest[flag]!r}: transformers 5 removed from_pretrained's {flag} (it reaches the model's "
                f"__init__ and fails there). Pass quantization_config=BitsAndBytesConfig({flag}=True) to load "
                f"quantized, or fine-tune with cudaload.load_for_finetune(model, quantize='{bits}')."
            )
    if "device" in rest:
        raise PlacementError(
            f"device={rest['device']!r}: from_pretrained has no device argument (it reaches the model's __init__ "
            "and fails there). cudaload places the model itself; to choose, pass device_map= ('cuda:0', 0, 'cpu' "
            "or 'auto')."
        )
    if "torch_dtype" in rest:  # transformers' old name for dtype
        if "dtype" in rest:
            raise DtypeUnsupportedError("Both dtype= and torch_dtype= were given; pass only dtype=.")
        rest["dtype"] = rest.pop("torch_dtype")
    known = {k: rest.pop(k) for k in _SETTINGS if k in rest}
    return Request(**known, passthrough=rest, **extra)


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
        from .capability import detect

        machine = detect()
    facts = model if isinstance(model, ModelFacts) else _read_facts(model, model_class, overrides)
    if detected:
        machine = _measured(machine, facts, probe, request)
    result = decide_plan(machine, facts, request)
    if result.finetune is not None:
        from .capability.transformers_api import check_lora_settings

        check_lora_settings(result.finetune.lora, lora)  # peft's own check, here, before any weight is read
    if not isinstance(model, ModelFacts):
        result = _judged_upstream(model, result, overrides)
    measured = machine.dtype_probe
    if measured is not None and not measured.from_cache:
        result = replace(result, timings={"probe": measured.cost_s})
    return result


# from_pretrained's arguments that choose which files it reads: transformers 5.22-5.25
# `_BaseAutoModelClass.from_pretrained` (models/auto/auto_factory.py) passes its `hub_kwargs` (these first
# six, and `revision`, which plan() passes on its own) with `code_revision` to AutoConfig.from_pretrained, and
# `gguf_file` among the rest of its kwargs. The facts are read through the same ones.
SOURCE_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "proxies",
    "subfolder",
    "token",
    "code_revision",
    "gguf_file",
)


def _read_facts(model: Any, model_class: str | None, overrides: Mapping[str, Any]) -> ModelFacts:
    """The facts of what from_pretrained will read with these overrides: the same subfolder, cache,
    GGUF file and config, so that the model planned is the model loaded."""
    name = str(model) if isinstance(model, os.PathLike) else model
    # "" is transformers' own default for subfolder (and reads no GGUF file): the same as unset.
    where = {key: overrides[key] for key in SOURCE_KWARGS if overrides.get(key) not in (None, "")}
    for key in ("subfolder", "gguf_file"):
        if key in where and not isinstance(where[key], (str, os.PathLike)):
            raise SettingError(
                f"{key}={where[key]!r} ({type(where[key]).__name__}): pass a file or folder name, or leave it unset."
            )
    trust = overrides.get("trust_remote_code", False) is True
    given_config = overrides.get("config")
    if given_config is not None:
        import_transformers()
        from transformers import PretrainedConfig

        if not isinstance(given_config, PretrainedConfig):
            # AutoModel*.from_pretrained reads the checkpoint's own config when config= is not a config object
            # (auto_factory.py), so a path given here would be planned and then silently not used.
            raise SettingError(
                f"config={given_config!r:.60} ({type(given_config).__name__}): from_pretrained uses config= only "
                "as a PretrainedConfig (an Auto class ignores anything else). Pass "
                "AutoConfig.from_pretrained(...) built the way you want, or leave it unset."
            )
        # from_pretrained builds the model from this config and reads only the weights from `model`.
        facts = read_model_facts(given_config, auto_class=model_class, trust_remote_code=trust)
        return replace(facts, source=str(name))
    local = isinstance(name, str) and os.path.isdir(name)
    if local:
        for key in ("cache_dir", "force_download", "local_files_only", "proxies", "token"):
            where.pop(key, None)  # Hub-only: transformers reads a local folder as it is
    if local and "subfolder" in where:
        # transformers' cached_file reads <folder>/<subfolder>/<file>; so do the facts (and cache them).
        inner = os.path.join(name, where.pop("subfolder"))
        if not os.path.isdir(inner):
            raise ModelConfigError(
                f"subfolder={overrides['subfolder']!r}: {name!r} has no such folder. Its folders: "
                f"{sorted(e for e in os.listdir(name) if os.path.isdir(os.path.join(name, e)))[:6]}."
            )
        facts = read_model_facts(
            inner,
            auto_class=model_class,
            trust_remote_code=trust,
            revision=overrides.get("revision"),
            config_kwargs=where or None,
        )
        return replace(facts, source=name)
    return read_model_facts(
        name,
        auto_class=model_class,
        trust_remote_code=trust,
        revision=overrides.get("revision"),
        config_kwargs=where or None,
    )


def _check_model(model: Any) -> None:
    if not isinstance(model, (str, os.PathLike, ModelFacts)):
        import_transformers()
        from transformers import PretrainedConfig

        if not isinstance(model, PretrainedConfig):
            raise ModelConfigError(
                f"plan() takes a local path, a Hub id, a PretrainedConfig or ModelFacts, not "
                f"{type(model).__name__} ({model!r:.60})."
            )
    if isinstance(model, (str, os.PathLike)) and not str(model).strip():
        raise ModelConfigError("plan() was given an empty model name: pass a local path or a Hub id.")


def _generation_request(
    generate: bool | None,
    finetune: bool,
    context: int | None,
    cache_implementation: str | None,
    padding_side: str | None,
) -> GenerationRequest | None:
    """What plan()'s generation arguments ask: None for no generation section."""
    settings = {"context": context, "cache_implementation": cache_implementation, "padding_side": padding_side}
    if not generate and any(v is not None for v in settings.values()):
        given = ", ".join(f"{k}={v!r}" for k, v in settings.items() if v is not None)
        raise SettingError(f"{given} only applies to a generation plan: pass generate=True as well.")
    if generate and finetune:
        raise SettingError(
            "generate=True and finetune=True: a fine-tuning plan trains, it does not plan generation. Plan the "
            "generation separately (cudaload.plan(model, generate=True))."
        )
    if generate is False or finetune:
        return None
    return GenerationRequest(generate is True, context, cache_implementation, padding_side)


def _training_request(
    finetune: bool,
    quantize: str | None,
    lora: Mapping[str, Any] | None,
    gradient_checkpointing: bool | None,
    seq_len: int | None,
    batch_size: int | None,
    overrides: Mapping[str, Any],
) -> TrainingRequest | None:
    """The fine-tuning section of the request (None for inference, where giving any of it is an error)."""
    if not finetune:
        training_only = {
            "lora": lora,
            "gradient_checkpointing": gradient_checkpointing,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "quantize": None if quantize == "auto" else quantize,  # None: inference is never quantized by it
        }
        if any(v is not None for v in training_only.values()):
            named = ", ".join(f"{k}={v!r}" for k, v in training_only.items() if v is not None)
            raise FinetuneConfigError(
                f"{named} only applies to a fine-tuning plan: pass finetune=True (load_for_finetune() does)"
                + (
                    ", or a quantization_config= of your own to quantize for inference."
                    if training_only["quantize"] is not None
                    else "."
                )
            )
        return None
    check_flag("gradient_checkpointing", gradient_checkpointing, allow_none=True)
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        check_count(name, value)
    if quantize is not None and "quantization_config" in overrides:
        raise QuantizationError(
            f"Both quantize={quantize!r} and quantization_config= were given. Pass quantize='4bit'/'8bit' to let "
            "cudaload build the BitsAndBytesConfig, or quantize=None with your own quantization_config."
        )
    own = overrides.get("quantization_config")
    return TrainingRequest(
        own_quantization=_bitsandbytes_bits(own) if own is not None else None,
        quantize=quantize,
        lora=lora,
        gradient_checkpointing=True if gradient_checkpointing is None else gradient_checkpointing,
        seq_len=2048 if seq_len is None else seq_len,
        batch_size=1 if batch_size is None else batch_size,
    )


def _bitsandbytes_bits(config: Any) -> str:
    """What a quantization_config you pass does to the weights: "4bit" or "8bit" for a BitsAndBytesConfig
    (or its dict), "other" for another method. Read by attribute or key, as transformers' own config does."""

    def get(name: str) -> Any:
        return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)

    method = get("quant_method") or "bitsandbytes"
    method = str(getattr(method, "value", method)).lower()  # transformers' QuantizationMethod is a str enum
    if method != "bitsandbytes":
        return "other"
    if get("load_in_4bit") is True:
        return "4bit"
    if get("load_in_8bit") is True:
        return "8bit"
    return "other"


def _judged_upstream(model: Any, result: Plan, overrides: dict[str, Any]) -> Plan:
    """A spread (device_map "auto" with max_memory) of an unquantized model, judged as transformers itself will
    place it (capability/model_config.py `upstream_placement`, then policy/placement.py `judge_upstream_placement`)."""
    from .capability.model_config import upstream_placement
    from .policy.placement import judge_upstream_placement

    kwargs = result.kwargs
    if kwargs.get("device_map") != "auto" or "max_memory" not in kwargs or "quantization_config" in kwargs:
        return result
    if any(overrides.get(key) not in (None, "") for key in (*SOURCE_KWARGS, "config")):
        return result  # a subfolder, GGUF file, cache or config of yours: the meta model is built from the root's
    if any(d.setting == "checkpoint_quantization" for d in result.decisions):
        return result  # a quantizer sizes its own weights (and adjusts max_memory): not modelled here
    landed = upstream_placement(
        str(model) if isinstance(model, os.PathLike) else model,
        result.auto_class,
        str(kwargs["dtype"]),
        kwargs["max_memory"],
        trust_remote_code=overrides.get("trust_remote_code", False) is True,
        revision=overrides.get("revision"),
    )
    return result if landed is None else judge_upstream_placement(result, landed)


def _measured(machine: Machine, facts: ModelFacts, probe: bool, request: Request) -> Machine:
    """This machine with the measurements that apply to `facts` (tuning records, the CPU dtype probe)."""
    from .capability import measure_for

    on_cpu = not machine.usable().gpus
    return measure_for(machine, facts, probe=probe, dtype_chosen=request.dtype is not None, on_cpu=on_cpu)
