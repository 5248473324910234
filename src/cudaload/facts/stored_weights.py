"""What a checkpoint's `quantization_config` says about its stored weights: `CheckpointQuantization`, plain data.

`read_quantization_config()` parses the dict config.json carries (no transformers import) and
`count_quantized()` counts, on the parameter list of a meta model, the weights the method stores
quantized. Whether this machine can keep them quantized is the policy's question
(policy/checkpoint_quantization.py, `decide_checkpoint_quantization`).

How each method stores a weight (paths relative to site-packages, transformers 5.22.2 and 5.25.0):

- bitsandbytes 4-bit: upstream's `param_element_size` counts 0.5 bytes per quantized weight
  (transformers 5.22-5.25 quantizers/quantizer_bnb_4bit.py: Bnb4BitHfQuantizer.quantized_element_size);
  bitsandbytes also keeps an absmax per block of 64 weights (bitsandbytes 0.50.2 nn/modules.py: Params4bit.__new__):
  fp32 (32/64 bits), or with double quantization a uint8 plus one fp32 scale per 256 blocks
  (bitsandbytes 0.50.2 functional.py: quantize_4bit).
- bitsandbytes 8-bit: 1 byte
  (transformers 5.22-5.25 quantizers/quantizer_bnb_8bit.py: Bnb8BitHfQuantizer.quantized_element_size).
- GPTQ / AWQ: `bits` packed into int32 (qweight), one fp16 scale and one packed zero point per
  `group_size` inputs (optimum / gptqmodel QuantLinear layouts): bits + (16 + bits) / group_size.
- FP8 (`quant_method: "fp8"`, FineGrainedFP8): 1 byte
  (transformers 5.22-5.25 quantizers/quantizer_finegrained_fp8.py: FineGrainedFP8HfQuantizer.quantized_element_size)
  plus an fp32 `weight_scale_inv` per `weight_block_size` block (default 128 x 128).
- MXFP4 (gpt-oss): only the MoE experts' `gate_up_proj`/`down_proj` are quantized, their biases are
  not (transformers 5.22-5.25 quantizers/quantizer_mxfp4.py: Mxfp4HfQuantizer.param_needs_quantization); 16 uint8
  of packed fp4 values plus one uint8 scale per 32 values
  (transformers 5.22-5.25 integrations/mxfp4.py: Mxfp4GptOssExperts.__init__): 4.25 bits.
- compressed-tensors: `config_groups[*].weights.num_bits`, plus a 16-bit scale per group.

Which weights: the methods that replace `nn.Linear` layers skip the output embeddings (`lm_head`,
quantizers/base.py `get_keys_to_not_convert`) and the modules named in `modules_to_not_convert`
(bitsandbytes: `llm_int8_skip_modules`), matched as upstream matches them
(transformers 5.22-5.25 quantizers/quantizers_utils.py: should_convert_module).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..frozen import frozen

__all__ = ["CheckpointQuantization", "count_quantized", "read_quantization_config"]


@frozen
class CheckpointQuantization:
    """How an already-quantized checkpoint stores its weights, from its `quantization_config`.

    Attributes:
        method: `quant_method` as transformers spells it ("bitsandbytes", "gptq", "awq", "fp8",
            "mxfp4", "compressed-tensors", ...).
        label: The method in words, e.g. "bitsandbytes 4-bit (nf4, double quant)", "MXFP4".
        bits: Stored bits per quantized weight, scales included; None for a method cudaload does not
            know how to size (such a checkpoint is sized in the plan's dtype).
        targets: What the method quantizes: "linear" (nn.Linear layers), "experts" (fused MoE expert
            weights, 3-D), or "linear+experts".
        skip: `modules_to_not_convert` (or `llm_int8_skip_modules`): modules left unquantized.
        compute_dtype: The dtype the quantized matmuls compute in (`bnb_4bit_compute_dtype`); None when
            the config does not say.
        dequantize: The config asks transformers to dequantize at load (`dequantize: true`).
        options: Method-specific settings the policy reads (e.g. compressed-tensors' weight type, the
            bitsandbytes mode "4bit"/"8bit").
        quantized_parameters: Weights stored at `bits` (counted on the meta model by `count_quantized`);
            0 until counted.
    """

    method: str
    label: str
    bits: float | None
    targets: str = "linear"
    skip: tuple[str, ...] = ()
    compute_dtype: str | None = None
    dequantize: bool = False
    options: tuple[tuple[str, str], ...] = ()
    quantized_parameters: int = 0

    def option(self, name: str) -> str | None:
        return dict(self.options).get(name)

    def stored_bytes(self) -> int:
        """Bytes of the quantized weights as stored (0 when `bits` is unknown)."""
        return int(self.quantized_parameters * self.bits / 8) if self.bits is not None else 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointQuantization:
        """Rebuild one from `dataclasses.asdict` output read back from JSON (lists for tuples)."""
        return cls(
            **{
                **data,
                "skip": tuple(data.get("skip", ())),
                "options": tuple((str(k), str(v)) for k, v in data.get("options", ())),
            }
        )


def _dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).removeprefix("torch.")


def _bnb(config: Mapping[str, Any]) -> CheckpointQuantization:
    skip = tuple(config.get("llm_int8_skip_modules") or ())
    if config.get("load_in_8bit") and not config.get("load_in_4bit"):
        return CheckpointQuantization(
            "bitsandbytes", "bitsandbytes 8-bit (LLM.int8)", 8.0, skip=skip, options=(("mode", "8bit"),)
        )
    quant_type = str(config.get("bnb_4bit_quant_type") or "fp4")
    double = bool(config.get("bnb_4bit_use_double_quant"))
    # 4 bits a weight; absmax per block of 64: a uint8 + an fp32 per 256 blocks (double quant), else fp32.
    bits = 4 + (8 / 64 + 32 / (64 * 256) if double else 32 / 64)
    label = f"bitsandbytes 4-bit ({quant_type}{', double quant' if double else ''})"
    return CheckpointQuantization(
        "bitsandbytes",
        label,
        bits,
        skip=skip,
        compute_dtype=_dtype_name(config.get("bnb_4bit_compute_dtype")),
        options=(("mode", "4bit"),),
    )


def _grouped(method: str, config: Mapping[str, Any]) -> CheckpointQuantization:
    bits = int(config.get("bits") or config.get("w_bit") or 4)
    group = int(config.get("group_size") or config.get("q_group_size") or 128)
    # qweight packs `bits` per weight; each group of `group` inputs adds an fp16 scale and a packed zero point.
    per_weight = bits + ((16 + bits) / group if group > 0 else 0)
    name = "GPTQ" if method == "gptq" else "AWQ"
    shown = f"g{group}" if group > 0 else "per-channel"
    return CheckpointQuantization(
        method,
        f"{name} {bits}-bit ({shown})",
        per_weight,
        skip=tuple(config.get("modules_to_not_convert") or ()),
    )


def _fp8(config: Mapping[str, Any]) -> CheckpointQuantization:
    block = config.get("weight_block_size") or (128, 128)
    rows, cols = (int(block[0]), int(block[1])) if len(block) == 2 else (0, 0)
    # 1 byte a weight plus an fp32 weight_scale_inv per block.
    bits = 8 + (32 / (rows * cols) if rows and cols else 0)
    return CheckpointQuantization(
        "fp8",
        "FP8 (e4m3, block-wise scales)",
        bits,
        targets="linear+experts",
        skip=tuple(config.get("modules_to_not_convert") or ()),
        dequantize=bool(config.get("dequantize")),
    )


def _mxfp4(config: Mapping[str, Any]) -> CheckpointQuantization:
    return CheckpointQuantization(
        "mxfp4",
        "MXFP4",
        4 + 8 / 32,  # 16 uint8 (32 fp4 values) + one uint8 scale per 32 values
        targets="experts",
        skip=tuple(config.get("modules_to_not_convert") or ()),
        dequantize=bool(config.get("dequantize")),
    )


def _compressed_tensors(config: Mapping[str, Any]) -> CheckpointQuantization:
    groups = config.get("config_groups") or {}
    weights = next(
        (g.get("weights") for g in groups.values() if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping)),
        None,
    )
    if not weights:
        return CheckpointQuantization("compressed-tensors", "compressed-tensors", None)
    num_bits = int(weights.get("num_bits") or 8)
    kind = str(weights.get("type") or "int")
    group = weights.get("group_size")
    bits = num_bits + (16 / int(group) if isinstance(group, int) and group > 0 else 0)
    dequantize = bool(config.get("dequantize")) or config.get("run_compressed") is False
    return CheckpointQuantization(
        "compressed-tensors",
        f"compressed-tensors {kind}{num_bits} ({config.get('format') or 'unknown format'})",
        bits,
        skip=tuple(config.get("ignore") or ()),
        dequantize=dequantize,
        options=(
            ("type", kind),
            ("num_bits", str(num_bits)),
            ("optimized", str(bool(config.get("use_optimized_inference")))),
        ),
    )


def read_quantization_config(config: Any) -> CheckpointQuantization | None:
    """The checkpoint's quantization from its `quantization_config` (a dict, or a transformers config
    object with `to_dict()`); None when there is none.

    Examples:
        >>> q = read_quantization_config({"quant_method": "mxfp4"})
        >>> q.method, q.bits, q.targets
        ('mxfp4', 4.25, 'experts')
        >>> read_quantization_config({"quant_method": "bitsandbytes", "load_in_4bit": True,
        ...                           "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}).label
        'bitsandbytes 4-bit (nf4, double quant)'
    """
    if config is None:
        return None
    if not isinstance(config, Mapping):
        to_dict = getattr(config, "to_dict", None)
        config = to_dict() if callable(to_dict) else {"quant_method": getattr(config, "quant_method", None)}
    method = config.get("quant_method")
    if not method:
        return None
    method = str(getattr(method, "value", method))
    if method == "bitsandbytes":
        return _bnb(config)
    if method in ("gptq", "awq"):
        return _grouped(method, config)
    if method == "fp8":
        return _fp8(config)
    if method == "mxfp4":
        return _mxfp4(config)
    if method == "compressed-tensors":
        return _compressed_tensors(config)
    return CheckpointQuantization(method, method, None, dequantize=bool(config.get("dequantize")))


def _skipped(name: str, patterns: Iterable[str]) -> bool:
    """transformers' `should_convert_module`, negated (5.22-5.25 quantizers_utils.py: should_convert_module)."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return any(re.match(rf"(?:{key}){boundary}", name) or name.endswith(key) for key in patterns)


def count_quantized(
    quantization: CheckpointQuantization, parameters: Iterable[tuple[str, str, int]]
) -> CheckpointQuantization:
    """`quantization` with `quantized_parameters` counted over a meta model's parameters, given as
    (full parameter name, kind, numel): kind "linear" for an nn.Linear weight, "output" for the
    output embeddings' (never quantized), "expert" for a fused 3-D MoE expert weight, else "other"."""
    kinds = {"linear": ("linear",), "experts": ("expert",), "linear+experts": ("linear", "expert")}[
        quantization.targets
    ]
    count = 0
    for name, kind, numel in parameters:
        module = name.rpartition(".")[0]
        if kind in kinds and not _skipped(module, quantization.skip) and not _skipped(name, quantization.skip):
            count += numel
    return replace(quantization, quantized_parameters=count)
