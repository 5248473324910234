"""Upstream facts the policy is built on that are one table each, kept as data so tests can hold them against the
installed transformers (a release that changes them fails a test, not a user), and the version comparison every
upstream table uses. FlashAttention's records and rules are in upstream_flash.py, the Hub kernel branches and
`kernels` ranges in upstream_kernels.py.

Sources: vLLM `_FLOAT16_NOT_SUPPORTED_MODELS`; transformers' quantizers (`is_compileable`) and its 5.23 rename of
gradient checkpointing. Imports nothing of cudaload.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

__all__ = [
    "CHECKPOINTING_RENAMED_SINCE",
    "COMPILEABLE_QUANT_METHODS",
    "FP16_FRAGILE_FAMILIES",
    "version_at_least",
]


def version_at_least(version: str, minimum: str) -> bool:
    """`version` >= `minimum` by PEP 440; False for a version that does not parse."""
    try:
        return Version(version) >= Version(minimum)
    except InvalidVersion:
        return False


# Families that overflow in fp16: exactly vLLM's `_FLOAT16_NOT_SUPPORTED_MODELS` (vllm/config/model.py:
# "Numerical instability. Please use bfloat16 or float32 instead."), which vLLM applies on every GPU.
FP16_FRAGILE_FAMILIES = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})


COMPILEABLE_QUANT_METHODS = frozenset({"compressed-tensors", "fp8", "gemma", "gguf", "mxfp8", "nvfp4", "torchao"})
"""`quant_method`s whose quantizer says `is_compileable` True (transformers 5.22-5.25
quantizers/quantizer_compressed_tensors.py, quantizer_finegrained_fp8.py, quantizer_gemma.py,
quantizer_gguf.py, quantizer_nvfp4.py, quantizer_torchao.py; quantizers/auto.py: AUTO_QUANTIZER_MAPPING maps
"mxfp8" to FineGrainedFP8HfQuantizer too); every other quantizer inherits False
from quantizers/base.py (`HfQuantizer.is_compileable`), and generate() then never compiles
(`_valid_auto_compile_criteria`)."""


CHECKPOINTING_RENAMED_SINCE = "5.23.dev0"
"""transformers renamed gradient checkpointing to activation checkpointing (TrainingArguments' flags, the model's
switch) in 5.23: every 5.23 release, pre-releases included (".dev0" is the first of them)."""
