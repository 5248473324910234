"""The quantization methods a fine-tuning plan can quantize the base with: one record each.

A method is data: the `quantize=` choice it answers to, the package that runs it (`QuantPackage`), how its
transformers config is built (plain keyword arguments; the loader builds the real config object from them, so
the policy never imports transformers), how many bytes a quantized weight takes, what its frozen matmul saves
for the backward, and which optimizer trains LoRA on it. The policy (policy/quantization.py, memory.py,
training.py), the loader and the CLI read this table and nothing else, and a method's package is what
detection lists and what install hints may name (facts/packages.py: detected_packages, install_hint): a new
method, as torchao int8 was, is a record here, not an edit in every module that mentions 4-bit.

This module imports nothing of cudaload.

Sources: transformers 5.22.2 `BitsAndBytesConfig` and `TorchAoConfig` (utils/quantization_config.py), bitsandbytes
0.50.2 (nn/modules.py, autograd/_functions.py), peft docs (accelerate/deepspeed.md, fsdp.md), peft 0.21.2
tuners/lora/torchao.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..frozen import frozen

__all__ = [
    "CHECKPOINT_OPTIMIZER",
    "DEFAULT_CONFIG_CLASS",
    "DEFAULT_QUANT_METHOD",
    "QUANT_METHODS",
    "QuantMethod",
    "QuantPackage",
    "config_method",
    "quant_packages",
    "quantization_method",
    "quantize_choices",
]


@frozen
class QuantPackage:
    """The distribution that runs a quantization method, registered where cudaload names packages.

    Attributes:
        distribution: Its name on the package registry (e.g. "bitsandbytes"): what detection lists and an
            install hint names.
        module: Its import name (e.g. "bitsandbytes").
        min_version: The oldest release transformers accepts for it (its `<NAME>_MIN_VERSION` in
            utils/import_utils.py); an older one is refused at planning, with the install hint for this one.
        extra: The extra of cudaload's pyproject.toml that installs it too (from a clone; e.g. "finetune").
    """

    distribution: str
    module: str
    min_version: str | None
    extra: str


@frozen
class QuantMethod:
    """One way cudaload quantizes a base model for LoRA.

    Attributes:
        choice: The `quantize=` value it answers to (e.g. "4bit"), also the key of QUANT_METHODS.
        summary: How the list of choices names it in an error (e.g. "'4bit' (QLoRA)").
        detail: What it is, in the reason of an explicit choice; "{dtype}" is the plan's dtype.
        package: The distribution that runs it (`QuantPackage`).
        quant_method: transformers' `quant_method` of the config it builds.
        config_class: The transformers class the loader builds from `build`'s keyword arguments.
        cpu_since: The first `package` version with a CPU backend; None: it needs a CUDA GPU.
        bits_per_weight: Bits a quantized linear weight takes in memory, its block scales included.
        row_scale_bytes: Bytes per output row of each quantized linear (e.g. LLM.int8's fp32 scale).
        saves_input: Its frozen matmul saves its input for the backward (LLM.int8 does; nf4 does not).
        optimizer: The TrainingArguments `optim` on a GPU, and why.
        auto: quantize="auto" picks it when 16-bit LoRA does not fit (one method has it).
        build: (the plan's dtype, parameters sharded by FSDP / ZeRO-3) -> the config's keyword arguments,
            JSON-ready (what the plan shows).
        objects: At load time only: the keyword arguments -> those `config_class` takes, where it takes an object
            a plan cannot hold (TorchAoConfig's torchao config); imports what it needs, so ImportError when
            `package` is missing. None: `config_class` takes the keyword arguments as they are.
        serialized: At read-back only: the keyword arguments -> the form the loaded model's
            `config.quantization_config.to_dict()` holds them in, where that is not the form given (TorchAoConfig
            writes its torchao config as torchao serializes it). None: the same form.
    """

    choice: str
    summary: str
    detail: str
    package: QuantPackage
    quant_method: str
    config_class: str
    cpu_since: str | None
    bits_per_weight: float
    row_scale_bytes: int
    saves_input: bool
    optimizer: tuple[str, str]
    auto: bool
    build: Callable[[str, bool], dict[str, Any]]
    objects: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    serialized: Callable[[dict[str, Any]], dict[str, Any]] | None = None


# bitsandbytes' 8-bit paged AdamW for every quantized base (a pre-quantized checkpoint's too).
PAGED_ADAMW = ("paged_adamw_8bit", "QLoRA on CUDA: 8-bit paged AdamW keeps optimizer spikes off the GPU")
CHECKPOINT_OPTIMIZER = PAGED_ADAMW
"""The optimizer for a base quantized by its checkpoint (no record of this table)."""

DEFAULT_CONFIG_CLASS = "BitsAndBytesConfig"
DEFAULT_QUANT_METHOD = "bitsandbytes"
"""What a quantization_config given as a plain dict, planned by no record, is built into (and called)."""


def _nf4(dtype: str, shards_parameters: bool) -> dict[str, Any]:
    # FSDP and DeepSpeed ZeRO-3 shard the packed 4-bit weights with the rest only when they are stored
    # in a float dtype, the compute dtype: peft docs/source/accelerate/deepspeed.md ("Use PEFT QLoRA and
    # DeepSpeed with ZeRO3": `bnb_4bit_quant_storage=quant_storage_dtype`, "`dtype` for
    # `AutoModelForCausalLM` is same as the `bnb_4bit_quant_storage` data type") and fsdp.md (FSDP-QLoRA).
    return {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": dtype,
        "bnb_4bit_quant_storage": dtype if shards_parameters else "uint8",
    }


def _int8(dtype: str, shards_parameters: bool) -> dict[str, Any]:
    return {"load_in_8bit": True}


def _torchao_int8(dtype: str, shards_parameters: bool) -> dict[str, Any]:
    # The torchao config by its class name: the plan holds JSON, `_torchao_objects` builds the object.
    return {"quant_type": "Int8WeightOnlyConfig"}


def _torchao_objects(kwargs: dict[str, Any]) -> dict[str, Any]:
    # TorchAoConfig takes a torchao `AOBaseConfig` object and refuses a string ("String-based quantization type
    # ... is no longer supported"): transformers 5.22 and 5.25 utils/quantization_config.py:
    # TorchAoConfig.post_init. `Int8WeightOnlyConfig()` is what peft names for LoRA on torchao (peft 0.21.2
    # tuners/lora/torchao.py: TorchaoLoraLinear.__init__). Raises ImportError without torchao.
    quantization = importlib.import_module("torchao.quantization")
    return {**kwargs, "quant_type": getattr(quantization, kwargs["quant_type"])()}


def _torchao_serialized(kwargs: dict[str, Any]) -> dict[str, Any]:
    # TorchAoConfig.to_dict() writes quant_type as {"default": config_to_dict(quant_type)} (transformers 5.22-5.25
    # utils/quantization_config.py: TorchAoConfig.to_dict), torchao's own form ({"_type": "Int8WeightOnlyConfig",
    # "_version": 2, "_data": {...}} in torchao 0.18.0 core/config.py: config_to_dict): the plan's class name is
    # serialized the same way, defaults and all, so the two compare equal exactly when the configs are the same.
    config = importlib.import_module("torchao.core.config")
    built = _torchao_objects(kwargs)["quant_type"]
    return {**kwargs, "quant_type": {"default": config.config_to_dict(built)}}


BITSANDBYTES = QuantPackage(
    "bitsandbytes",
    "bitsandbytes",
    # transformers 5.22 and 5.25 utils/import_utils.py: BITSANDBYTES_MIN_VERSION.
    "0.46.1",
    "finetune",
)


QUANT_METHODS: dict[str, QuantMethod] = {
    m.choice: m
    for m in (
        QuantMethod(
            choice="4bit",
            summary="'4bit' (QLoRA)",
            detail="nf4 + double quant, compute dtype = the plan's dtype ({dtype}), not BitsAndBytesConfig's default",
            package=BITSANDBYTES,
            quant_method="bitsandbytes",
            config_class="BitsAndBytesConfig",
            # bitsandbytes runs 4-/8-bit on CPU in every release transformers accepts (BITSANDBYTES_MIN_VERSION
            # 0.46.1 in 5.22-5.25): nf4 and LLM.int8 load + LoRA forward/backward measured on CPU with 0.46.1,
            # 0.47.0 and 0.50.2 (2026-12-06). Older releases have no CPU backend, and transformers refuses them.
            cpu_since="0.46.1",
            # nf4: 4 bits; absmax per block of 64 as uint8 (double quantization): 8/64; an fp32 scale per
            # 256 of those blocks: 32/(64·256). 4.127 bits per weight, as the QLoRA paper says
            # (blocks of 64: bitsandbytes 0.50.2 nn/modules.py: Params4bit.__new__).
            bits_per_weight=4 + 8 / 64 + 32 / (64 * 256),
            row_scale_bytes=0,
            # MatMul4Bit saves only the weight (bitsandbytes 0.50.2 autograd/_functions.py: MatMul4Bit.forward).
            saves_input=False,
            optimizer=PAGED_ADAMW,
            auto=True,
            build=_nf4,
        ),
        QuantMethod(
            choice="8bit",
            summary="'8bit'",
            detail="LLM.int8",
            package=BITSANDBYTES,
            quant_method="bitsandbytes",
            config_class="BitsAndBytesConfig",
            cpu_since="0.46.1",
            # LLM.int8: int8 weights (CB) and one fp32 scale per output row (SCB).
            bits_per_weight=8,
            row_scale_bytes=4,
            # MatMul8bitLt saves its input (bitsandbytes 0.50.2 autograd/_functions.py: MatMul8bitLt.forward).
            saves_input=True,
            optimizer=PAGED_ADAMW,
            auto=False,
            build=_int8,
        ),
        QuantMethod(
            choice="torchao-int8",
            summary="'torchao-int8' (torchao int8 weight-only)",
            detail="torchao int8 weight-only (Int8WeightOnlyConfig), the rest in the plan's dtype ({dtype})",
            # transformers 5.22 and 5.25 utils/import_utils.py: TORCHAO_MIN_VERSION (is_torchao_available, which
            # TorchAoConfig.post_init and TorchAoHfQuantizer.validate_environment require).
            package=QuantPackage("torchao", "torchao", "0.15.0", "torchao"),
            quant_method="torchao",
            config_class="TorchAoConfig",
            # Loaded on a CPU and LoRA-trained there with finite gradients (tests/test_quant_torchao.py, torchao
            # 0.18.0 with transformers 5.22.2 and 5.25 and peft 0.21.2, 2026-12-06): int8 weight-only is torchao's
            # Int8Tensor, plain torch ops. torchao 0.15.0 cannot train there: peft 0.21.2
            # import_utils.py: is_torchao_available raises ImportError below 0.16.0; 0.16 and 0.17 not checked.
            cpu_since="0.18.0",
            # int8 weights; transformers trains only torchao's 8-bit configs (quantizer_torchao.py:
            # TorchAoHfQuantizer.is_trainable). Per output row one float32 scale: torchao 0.18.0's Int8Tensor holds
            # `qdata` (int8) and `scale` (float32, [rows, 1]), read from a model loaded in bf16 on this CPU.
            bits_per_weight=8,
            row_scale_bytes=4,
            # Not measured: counted as saving its input, the larger estimate.
            saves_input=True,
            # No bitsandbytes needed: the fp32 LoRA weights train with the optimizer a 16-bit base gets on CUDA.
            optimizer=("adamw_torch_fused", "torchao int8 base: fused AdamW on the fp32 LoRA weights, as for 16-bit"),
            auto=False,
            build=_torchao_int8,
            objects=_torchao_objects,
            serialized=_torchao_serialized,
        ),
    )
}
"""Every method, by its `quantize=` choice, in the order the CLI and errors list them."""


def config_method(decisions: Iterable[Any]) -> QuantMethod | None:
    """The method whose config a plan's `quantization_config` keyword arguments are, read from the plan's
    decisions (its "quantize" Decision); None when no method of this table planned it (a dict of your own,
    which the loader builds into DEFAULT_CONFIG_CLASS)."""
    planned = next((d.value for d in decisions if d.setting == "quantize"), None)
    return QUANT_METHODS.get(planned) if isinstance(planned, str) else None


def quant_packages() -> dict[str, QuantPackage]:
    """Each method's package by distribution, read from QUANT_METHODS at each call (a method registered after
    import counts): the packages detection lists and install hints may name."""
    return {m.package.distribution: m.package for m in QUANT_METHODS.values()}


def quantize_choices() -> tuple[str | None, ...]:
    """Every `quantize=` value: each method's choice, "auto" and None (no quantization)."""
    return (*QUANT_METHODS, "auto", None)


def quantization_method(config: Any) -> str | None:
    """transformers' `quant_method` of a quantization_config (a dict's key or a config object's attribute, a str
    enum read as its value); DEFAULT_QUANT_METHOD for a dict without one that loads bitsandbytes (load_in_4bit
    or load_in_8bit True: planning refuses any other dict without one, capability/quant_config.py); None for
    anything else."""
    method = config.get("quant_method") if isinstance(config, Mapping) else getattr(config, "quant_method", None)
    if method is None:
        says_bits = isinstance(config, Mapping) and True in (config.get("load_in_4bit"), config.get("load_in_8bit"))
        return DEFAULT_QUANT_METHOD if says_bits else None
    return str(getattr(method, "value", method))
