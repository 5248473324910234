"""`plan()`: detect (or take) the machine, read the model's config, run the policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .capability.facts import Machine
from .errors import DtypeUnsupportedError, FinetuneConfigError, QuantizationError
from .model_facts import ModelFacts, read_model_facts
from .plans import Plan
from .policy import Request, make_plan
from .policy.request import Workload, workload_from

__all__ = ["plan", "split_overrides"]

_SETTINGS = ("attn_implementation", "dtype", "device_map", "max_memory", "use_kernels")


def split_overrides(overrides: dict[str, Any], **extra: Any) -> Request:
    """Turn from_pretrained-style kwargs into a Request; unknown keys pass through untouched."""
    rest = dict(overrides)
    if "torch_dtype" in rest:  # transformers' old name for dtype
        if "dtype" in rest:
            raise DtypeUnsupportedError("Both dtype= and torch_dtype= were given; pass only dtype=.")
        rest["dtype"] = rest.pop("torch_dtype")
    known = {k: rest.pop(k) for k in _SETTINGS if k in rest}
    return Request(**known, passthrough=rest, **extra)


def plan(
    model: Any,
    *,
    machine: Machine | None = None,
    model_class: str = "AutoModelForCausalLM",
    finetune: bool = False,
    quantize: str | None = "auto",
    lora: Mapping[str, Any] | None = None,
    gradient_checkpointing: bool = True,
    seq_len: int = 2048,
    batch_size: int = 1,
    workload: str | tuple[int, int] | Workload | None = None,
    probe: bool = True,
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
    """
    chosen_workload = workload_from(workload)
    if not finetune and lora is not None:
        raise FinetuneConfigError("lora= only applies to a fine-tuning plan: pass finetune=True.")
    if finetune and quantize is not None and "quantization_config" in overrides:
        raise QuantizationError(
            f"Both quantize={quantize!r} and quantization_config= were given. Pass quantize='4bit'/'8bit' to let "
            "cudaload build the BitsAndBytesConfig, or quantize=None with your own quantization_config."
        )
    detected = machine is None
    if machine is None:
        from .capability import detect

        machine = detect()
    facts = (
        model
        if isinstance(model, ModelFacts)
        else read_model_facts(
            model,
            auto_class=model_class,
            trust_remote_code=bool(overrides.get("trust_remote_code", False)),
            revision=overrides.get("revision"),
        )
    )
    training = (
        dict(
            training=True,
            quantize=quantize,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
            seq_len=seq_len,
            batch_size=batch_size,
        )
        if finetune
        else {}
    )
    request = split_overrides(overrides, workload=chosen_workload, **training)
    if detected:
        from .capability import measure_for

        machine = measure_for(machine, facts, probe=probe, dtype_chosen=request.dtype is not None)
    result = make_plan(machine, facts, request)
    measured = machine.dtype_probe
    if measured is not None and not measured.from_cache:
        result = replace(result, timings={"probe": measured.cost_s})
    return result
