"""The plan as from_pretrained takes it: transformers' config objects, and the rank's current CUDA device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import MissingPackageError, SettingError, describe_error
from ..facts.packages import install_hint
from ..facts.quant_methods import DEFAULT_CONFIG_CLASS, config_method
from ..plans import SUB_MODEL_ATTENTION, Plan, mutable

__all__ = ["from_pretrained_kwargs", "set_rank_device"]


def from_pretrained_kwargs(plan: Plan) -> dict[str, Any]:
    """The plan's from_pretrained keyword arguments as the objects transformers takes: its JSON-ready
    `kwargs` with a `BitsAndBytesConfig` for a planned quantization and, for tensor parallelism, a
    `DistributedConfig` where transformers has one. What `load()` passes to from_pretrained (with
    `output_loading_info=True`); use it to load a plan with transformers yourself.

    Args:
        plan: A `Plan` from `plan()`.

    Returns:
        A new dict of from_pretrained keyword arguments (the plan is not changed).

    Raises:
        SettingError: `plan` is not a Plan.
        MissingPackageError: The plan's quantization method needs a package this process cannot import.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> a100 = cudaload.Machine.simulated("A100", packages={"bitsandbytes": "0.50.2", "peft": "0.21.2"})
        >>> plan = cudaload.plan(path, machine=a100, finetune=True, quantize="4bit")
        >>> plan.kwargs["quantization_config"]["bnb_4bit_quant_type"]
        'nf4'
        >>> type(cudaload.from_pretrained_kwargs(plan)["quantization_config"]).__name__
        'BitsAndBytesConfig'
    """
    if not isinstance(plan, Plan):
        raise SettingError(
            f"from_pretrained_kwargs() takes a Plan from cudaload.plan(), not {type(plan).__name__} ({plan!r:.60})."
        )
    kwargs: dict[str, Any] = mutable(plan.kwargs)  # plain dicts: transformers and accelerate may change what they get
    quant = kwargs.get("quantization_config")
    if isinstance(quant, Mapping):
        import transformers

        method = config_method(plan.decisions)  # the record's data; the real config object is built here
        config_class = getattr(transformers, method.config_class if method else DEFAULT_CONFIG_CLASS)
        if method is not None and method.objects is not None:
            try:
                quant = method.objects(dict(quant))  # the objects a plan cannot hold (TorchAoConfig's torchao config)
            except ImportError as exc:
                package, module = method.package.distribution, method.package.module
                # Its own module missing: not installed here; another module missing: its install is broken.
                ours = exc.name is not None and (exc.name == module or exc.name.startswith(f"{module}."))
                found = "is not installed here" if ours else f"cannot be imported here ({describe_error(exc)})"
                raise MissingPackageError(
                    f"{plan.model}: the plan quantizes with quantize={method.choice!r}, which needs {package}, and "
                    f"{package} {found}: {install_hint(package, method.package.min_version)}, or plan without it."
                ) from exc
        if method is None and "quant_method" in quant:
            # A dict of yours with its method: transformers routes it (planning checked its method and keys).
            from transformers.quantizers.auto import AutoQuantizationConfig

            try:
                kwargs["quantization_config"] = AutoQuantizationConfig.from_dict(dict(quant))
            except ImportError as exc:
                raise MissingPackageError(
                    f"{plan.model}: your quantization_config (quant_method={quant['quant_method']!r}) needs a "
                    f"package this process cannot import ({describe_error(exc)}): install it (the method's "
                    "package, see transformers' quantization docs), or plan without it."
                ) from exc
        else:
            kwargs["quantization_config"] = config_class(**quant)
    per_sub_model = next((d.value for d in plan.decisions if d.setting == SUB_MODEL_ATTENTION), None)
    if per_sub_model and kwargs.get("attn_implementation") == plan.decision("attn_implementation").value:
        # transformers takes attention per sub-config as a dict, "" for the top (policy/attention.py:
        # decide_sub_model_attention); only for the option it was decided with, not a fallback.
        parts = dict(item.split("=", 1) for item in str(per_sub_model).split(", "))
        kwargs["attn_implementation"] = {"": kwargs["attn_implementation"], **parts}
    if "tp_plan" in kwargs and "distributed_config" not in kwargs and "tp_size" not in kwargs:
        # transformers >= 5.1x takes TP through DistributedConfig (a bare tp_plan= warns FutureWarning); older 5.x
        # takes tp_plan=, as does a plan without the planner's facts (`ApplyFacts.tensor_parallel_argument`).
        facts = plan.apply_facts
        if facts is None or facts.tensor_parallel_argument != "distributed_config":
            return kwargs
        from transformers.distributed import DistributedConfig  # type: ignore[attr-defined]

        kwargs["distributed_config"] = DistributedConfig(tp_plan=kwargs.pop("tp_plan"))
    return kwargs


def set_rank_device(plan: Plan, set_device: Any = None) -> int | None:
    """Make the plan's `cuda_device` the current CUDA device before from_pretrained (a quantized FSDP /
    ZeRO-3 rank: its loader places the weights on `torch.cuda.current_device()`; a pre-quantized checkpoint on
    mixed GPUs: its quantizer judges the current device); returns the index, or None when the plan has no
    such decision or this process has no CUDA device of that index (a plan made for another machine: the
    load then fails, or falls back, on its own terms, never on set_device). `set_device` defaults to
    `torch.cuda.set_device`, called only when CUDA is there; one you pass is always called."""
    try:
        index = int(plan.decision("cuda_device").value)
    except KeyError:
        return None
    if set_device is None:
        import torch

        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        set_device = torch.cuda.set_device
    set_device(index)
    return index
