"""The dtype a pre-quantized bitsandbytes checkpoint's unquantized weights are applied in: the one they are
stored in, whatever dtype= says, so the plan says that dtype instead of the read-back warning after loading.

Measured (2026-12-06, CPU machine, bitsandbytes 0.50.2, transformers 5.22.2 and 5.25): a Qwen3 nf4 checkpoint
whose norms and embeddings are stored bf16, loaded with dtype=float32 (or float16), holds them in bf16; the
uint8 packed weights are the quantizer's. transformers 5.22 and 5.25 `core_model_loading`
(`convert_and_load_state_dict_in_model`) casts a pre-quantized checkpoint's tensors through the quantizer's
`HfQuantizer.get_new_dtype` instead of to dtype=. The stored dtype comes from the safetensors header
(capability/model_config.py, the "stored_dtype" option of `CheckpointQuantization`).
"""

from __future__ import annotations

from ..facts.model import ModelFacts
from ..plans import Decision, Rejected

__all__ = ["decide_stored_dtype"]


def decide_stored_dtype(model: ModelFacts, dtype: Decision, dequantize: bool) -> tuple[Decision, tuple[str, ...]]:
    """`dtype`, or the stored dtype of a bitsandbytes checkpoint's unquantized weights when they differ (with a
    warning when you asked for the other one); `dequantize`: your quantization_config asks transformers to
    dequantize, which applies dtype= to every weight."""
    checkpoint = model.quantization
    if checkpoint is None or checkpoint.method != "bitsandbytes" or dequantize or checkpoint.dequantize:
        return dtype, ()
    stored = checkpoint.option("stored_dtype")
    if stored is None or stored == dtype.value:
        return dtype, ()
    yours = dtype.source == "user"
    reason = (
        f"the checkpoint is {checkpoint.label} with its unquantized weights (norms, embeddings, ...) stored in "
        f"{stored}: transformers loads them in {stored} whatever dtype= says, so that is the dtype applied"
    )
    why = "asked" if yours else "chosen for this machine"
    rejected = (
        Rejected(dtype.value, f"{why}, but transformers keeps this checkpoint's unquantized weights in {stored}"),
        *(r for r in dtype.rejected if r.value != stored),
    )
    warnings = (
        (
            f"dtype={dtype.value!r} was asked, but {model.source} is a {checkpoint.label} checkpoint whose "
            f"unquantized weights transformers loads in their stored {stored}: planned {stored}. To run in "
            f"{dtype.value}, load an unquantized checkpoint (or one saved in {dtype.value}).",
        )
        if yours
        else ()
    )
    return Decision("dtype", stored, reason, rejected, dtype.source), warnings
