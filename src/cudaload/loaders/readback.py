"""Read back from the loaded model every value the plan shows, and name each one that differs.

A plan is a promise about the loaded model, and upstream defaults move under it (transformers 5.25 turned
`use_kernels` on when it is not passed; a checkpoint's generation_config can ask for another cache). So after
loading, each value the plan shows is compared with the model's own state, never with what cudaload passed:
a difference is a CudaloadWarning naming both values (and a test failure, the suite runs with warnings as
errors). Only what is read here is compared; what cannot be read from a model is not guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..facts.quant_methods import config_method
from ..plans import Plan

__all__ = ["lora_targets_read_back", "read_back"]

_COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def read_back(plan: Plan, model: Any) -> tuple[str, ...]:
    """One sentence per value of `plan` the loaded `model` does not hold (empty when all match)."""
    differences = [
        *_attention(plan, model),
        *_dtype(plan, model),
        *_device(plan, model),
        *_use_kernels(plan, model),
        *_cache(plan, model),
        *_quantization(plan, model),
    ]
    return tuple(f"{plan.model}: {d}" for d in differences)


def lora_targets_read_back(plan: Plan, peft_model: Any) -> tuple[str, ...]:
    """The LoRA target modules the plan shows, against those peft wrapped (its `targeted_module_names`)."""
    if plan.finetune is None or plan.finetune.lora is None:
        return ()
    planned = plan.finetune.lora.get("target_modules")
    wrapped = getattr(peft_model, "targeted_module_names", None)
    if not isinstance(planned, (list, tuple, set, frozenset)) or wrapped is None:
        return ()  # "all-linear" or a regex: peft resolves it; there is no list of names to compare
    hit = {name.rsplit(".", 1)[-1] for name in wrapped}
    missed = sorted(set(planned) - hit)
    extra = sorted(hit - set(planned))
    if not missed and not extra:
        return ()
    return (
        f"{plan.model}: the plan's LoRA target_modules are {sorted(planned)}, and peft wrapped {sorted(hit)}"
        + (f" (none named {', '.join(missed)})" if missed else "")
        + ".",
    )


def _attention(plan: Plan, model: Any) -> Iterable[str]:
    planned = plan.kwargs.get("attn_implementation")
    config = getattr(model, "config", None)
    loaded = getattr(config, "_attn_implementation", None)
    if not isinstance(planned, str) or loaded is None:
        return
    if str(loaded) != planned:
        yield f"the plan's attn_implementation is {planned!r}, and the loaded model uses {loaded!r}."


def _dtype(plan: Plan, model: Any) -> Iterable[str]:
    planned = plan.kwargs.get("dtype")
    loaded = _held_dtype(model)
    # An fp8 or int storage dtype is no compute dtype (FineGrainedFP8 keeps its weights in float8_e4m3fn).
    if planned in _COMPUTE_DTYPES and loaded in _COMPUTE_DTYPES and loaded != planned:
        yield f"the plan's dtype is {planned}, and the loaded model holds {loaded}."


def _held_dtype(model: Any) -> str:
    """The floating dtype that holds most of the model's weights. Not `model.dtype` (the first floating
    parameter's): some classes keep a few weights in float32 by design (Ergo's norms and router, any
    `_keep_in_fp32_modules`), and the first may be one of them."""
    counts: dict[str, int] = {}
    parameters = getattr(model, "parameters", None)
    for parameter in parameters() if callable(parameters) else ():
        if parameter.is_floating_point():
            name = str(parameter.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + parameter.numel()
    return max(counts, key=lambda name: counts[name]) if counts else ""


def _device(plan: Plan, model: Any) -> Iterable[str]:
    planned = plan.kwargs.get("device_map")
    if isinstance(planned, Mapping) and set(planned) == {""}:
        planned = planned[""]
    if isinstance(planned, int) and not isinstance(planned, bool):
        planned = f"cuda:{planned}"
    if not isinstance(planned, str) or planned in ("auto", "balanced", "balanced_low_0", "sequential"):
        return  # a spread map is reported by placement (offloaded modules), not compared as one device
    loaded = str(getattr(model, "device", ""))
    want = "cuda:0" if planned == "cuda" else planned
    if loaded and loaded != want:
        yield f"the plan's device_map puts the model on {want}, and it is on {loaded}."


def _use_kernels(plan: Plan, model: Any) -> Iterable[str]:
    if "use_kernels" not in plan.kwargs or not hasattr(model, "use_kernels"):
        return
    planned, loaded = bool(plan.kwargs["use_kernels"]), bool(model.use_kernels)
    if planned != loaded:
        yield (
            f"the plan's use_kernels is {planned}, and the loaded model's is {loaded}"
            + (" (its layers were swapped for Hub kernels)" if loaded else "")
            + "."
        )


def _cache(plan: Plan, model: Any) -> Iterable[str]:
    """The cache generate() will build: the plan's generate_kwargs over the model's generation_config."""
    generation = plan.generation
    config = getattr(model, "generation_config", None)
    if generation is None or config is None or generation.cache_implementation is None:
        return
    asked = generation.generate_kwargs.get("cache_implementation")
    loaded = asked if asked is not None else getattr(config, "cache_implementation", None)
    # generate()'s own default is a DynamicCache; it unsets "hybrid" (transformers 5.22-5.25 generation/utils.py:
    # GenerationMixin._prepare_generation_config), so Gemma 2/3 checkpoints that carry it get the dynamic one too.
    effective = "dynamic" if loaded in (None, "hybrid") else loaded
    if effective != generation.cache_implementation:
        yield (
            f"the plan's generation cache is {generation.cache_implementation!r}, and generate() will build "
            f"{effective!r} (the model's generation_config.cache_implementation)."
        )


def _quantization(plan: Plan, model: Any) -> Iterable[str]:
    planned = plan.kwargs.get("quantization_config")
    if not isinstance(planned, Mapping):
        return
    loaded = getattr(getattr(model, "config", None), "quantization_config", None)
    if loaded is None:
        yield "the plan quantizes the model, and the loaded model has no quantization_config."
        return
    as_dict = loaded.to_dict() if hasattr(loaded, "to_dict") else dict(loaded)
    method = config_method(plan.decisions)
    if method is not None and method.serialized is not None:
        planned = method.serialized(dict(planned))  # the form to_dict() writes (torchao's serialized config)
    for key, want in planned.items():
        have = as_dict.get(key)
        if _normal(have) != _normal(want):
            yield f"the plan's quantization_config has {key}={_normal(want)}, and the loaded model's {_normal(have)}."


def _normal(value: Any) -> Any:
    """torch dtypes and their names compare equal ("torch.bfloat16" is "bfloat16"); a serialized config (a dict)
    compares as it is."""
    if value is None or isinstance(value, (bool, int, Mapping)):
        return value
    return str(value).removeprefix("torch.")
