"""A pre-quantized checkpoint on AMD GPUs: what transformers does with it under ROCm, and what cudaload plans.

No transformers quantizer tells ROCm from CUDA (none reads `torch.version.hip` in 5.22 or 5.25): on ROCm
`torch.cuda.is_available()` is True and `torch.cuda.get_device_capability()` is the gfx target's (9.4 for gfx942),
so each quantizer's CUDA rule decides. For FP8 that rule is "capability >= 8.9", which every CDNA GPU passes
(transformers 5.22-5.25 quantizers/quantizer_finegrained_fp8.py: FineGrainedFP8HfQuantizer.validate_environment):
the weights stay float8_e4m3fn (integrations/finegrained_fp8.py: FP8Linear) and run through the Triton
`kernels-community/finegrained-fp8` Hub kernel (integrations/finegrained_fp8.py: fp8_linear), or DeepGEMM, which
is CUDA only. MI300's FP8 is the other format, float8_e4m3fnuz (vLLM vllm/platforms/rocm.py:
`RocmPlatform.is_fp8_fnuz` for gfx94x, `fp8_dtype`); MI200 has no FP8 at all (`RocmPlatform.supports_fp8`: gfx94x,
gfx95x, gfx12 only); and which ROCm targets the Hub kernel is built for is not documented. So cudaload refuses to
plan an FP8 checkpoint kept quantized on an AMD GPU and says how to load it dequantized (transformers' own
`FineGrainedFP8Config(dequantize=True)`, what it does itself below sm89). GPTQ, AWQ and MXFP4 load through their
CUDA rules too; whether their kernels (gptqmodel's, the Triton MXFP4 kernels) run on the gfx target is not checked:
planned as transformers would, with a warning that says so.
"""

from __future__ import annotations

from ..errors import QuantizationError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..facts.stored_weights import CheckpointQuantization

__all__ = ["FNUZ_PREFIX", "check_on_rocm"]

FNUZ_PREFIX = "gfx94"
"""gfx targets whose FP8 is float8_e4m3fnuz (vLLM `RocmPlatform.is_fp8_fnuz`: "gfx94" in the arch name)."""

_FP8_RULE = "transformers 5.22-5.25 quantizer_finegrained_fp8.py: FineGrainedFP8HfQuantizer.validate_environment"
_UNCHECKED = frozenset({"gptq", "awq", "mxfp4", "compressed-tensors"})


def check_on_rocm(
    machine: Machine, model: ModelFacts, checkpoint: CheckpointQuantization, dequantize: bool
) -> tuple[str, ...]:
    """Warnings for a pre-quantized checkpoint on AMD GPUs (empty on any other machine).

    Raises:
        QuantizationError: an FP8 checkpoint that transformers would keep quantized on an AMD GPU.
    """
    amd = [g for g in machine.gpus if g.vendor == "amd"]
    if not amd or dequantize or checkpoint.dequantize:
        return ()
    gpu = amd[0]
    what = f"{model.source} is a pre-quantized {checkpoint.label} checkpoint"
    if checkpoint.method == "fp8":
        fmt = (
            f"{gpu.arch}'s FP8 is float8_e4m3fnuz, not the checkpoint's float8_e4m3fn (vLLM RocmPlatform.is_fp8_fnuz)"
            if gpu.arch.startswith(FNUZ_PREFIX)
            else f"which ROCm targets that kernel is built for ({gpu.arch} included) is not documented"
        )
        raise QuantizationError(
            f"{what}. On {gpu.name} ({gpu.arch}) transformers keeps it in FP8 (ROCm reports capability "
            f"{gpu.capability[0]}.{gpu.capability[1]} >= 8.9: {_FP8_RULE}) and runs it through the "
            f"kernels-community/finegrained-fp8 Triton kernel, and {fmt}. Load it dequantized to bf16: pass "
            "quantization_config=FineGrainedFP8Config(dequantize=True) (transformers), or use a bf16 checkpoint."
        )
    if checkpoint.method in _UNCHECKED:
        return (
            f"{what}: transformers loads it on {gpu.name} ({gpu.arch}) by its CUDA rule (no quantizer reads "
            "torch.version.hip), and whether its kernels run on that gfx target is not checked by cudaload.",
        )
    return ()
