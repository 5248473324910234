"""dtype: bf16 on sm80+, fp16 on older GPUs, fp32 for fp16-fragile families there; on CPU
bf16 only where AMX makes it fast."""

from __future__ import annotations

from ..capability.facts import Machine
from ..errors import DtypeUnsupportedError
from ..model_facts import ModelFacts
from ..plans import Decision, Rejected

__all__ = ["decide_dtype", "normalise_dtype"]

_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "float32": "float32",
    "half": "float16",
    "fp16": "float16",
    "float16": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
}


def normalise_dtype(value: object, checkpoint: str | None) -> str:
    """'bfloat16' for torch.bfloat16, 'bf16', ...; "auto" means the checkpoint's dtype."""
    name = str(value).removeprefix("torch.")
    if name == "auto":
        return checkpoint or "float32"
    if name not in _ALIASES:
        raise DtypeUnsupportedError(
            f"dtype={value!r} is not a dtype cudaload can plan with. Use 'bfloat16', 'float16', 'float32' "
            "or 'auto' (the checkpoint's dtype), or leave it unset."
        )
    return _ALIASES[name]


def _user_dtype(machine: Machine, model: ModelFacts, dtype: str) -> tuple[Decision, tuple[str, ...]]:
    gpu = machine.weakest_gpu
    warnings: list[str] = []
    if gpu is not None and dtype == "bfloat16" and not gpu.bf16:
        raise DtypeUnsupportedError(
            f"dtype='bfloat16' was asked, but bfloat16 needs compute capability 8.0 or newer and "
            f"{gpu.name} (cuda:{gpu.index}) has {gpu.capability[0]}.{gpu.capability[1]}. Use dtype='float16' "
            "(or 'float32'), or leave dtype unset to let cudaload choose."
        )
    if dtype == "float16" and model.fp16_fragile:
        warnings.append(
            f"dtype='float16' with {model.model_type}: this family is known to overflow in fp16 (empty or NaN "
            "output). Prefer 'bfloat16' on sm80+ or 'float32'."
        )
    reason = "your choice"
    if gpu is None and dtype == "bfloat16" and not machine.cpu.fast_bf16:
        reason += " (no AMX here: prefill slower than fp32, decode can be faster as it is memory-bound)"
    return Decision("dtype", dtype, reason, source="user"), tuple(warnings)


def decide_dtype(machine: Machine, model: ModelFacts, requested: str | None) -> tuple[Decision, tuple[str, ...]]:
    if requested is not None:
        return _user_dtype(machine, model, normalise_dtype(requested, model.checkpoint_dtype))
    ckpt = model.checkpoint_dtype
    gpu = machine.weakest_gpu
    if gpu is None:
        return _cpu_dtype(machine), ()
    where = f"{gpu.name} ({gpu.sm})"
    if gpu.bf16:
        if ckpt == "float16":
            return Decision(
                "dtype",
                "float16",
                f"checkpoint is fp16 and {where} runs it natively; casting to bf16 would drop 3 mantissa bits",
                (Rejected("bfloat16", "lossy cast of an fp16 checkpoint"), Rejected("float32", "2x memory, no gain")),
            ), ()
        note = " (downcast from the fp32 checkpoint, as vLLM does: half the memory)" if ckpt == "float32" else ""
        return Decision(
            "dtype",
            "bfloat16",
            f"{where} runs bf16 natively: fp32's range at half the memory{note}",
            (
                Rejected("float16", "narrower range: overflow risk, no speed gain on sm80+"),
                Rejected("float32", "2x memory and no tensor-core bf16 speed"),
            ),
        ), ()
    bf16_no = Rejected("bfloat16", f"{where} has no native bf16 (needs sm80+; torch emulates it slowly)")
    if model.fp16_fragile:
        warning = (
            f"{model.model_type} is known to overflow in fp16 and {where} has no native bf16: planned float32 "
            "(2x memory, slower). Pass dtype='float16' to trade correctness risk for speed."
        )
        return Decision(
            "dtype",
            "float32",
            f"{model.model_type} overflows in fp16 (vLLM refuses it) and {where} lacks bf16",
            (bf16_no, Rejected("float16", f"{model.model_type}: numerical instability in fp16")),
        ), (warning,)
    return Decision(
        "dtype",
        "float16",
        f"{where} predates bf16 (sm80): fp16 runs on its tensor cores",
        (bf16_no, Rejected("float32", "2x memory and no tensor-core speed")),
    ), ()


def _cpu_dtype(machine: Machine) -> Decision:
    """bf16 only with AMX; fp16 is never chosen for you on CPU (overflow risk with real weights).

    Measured prefill, bf16 vs fp32 (benchmarks/README.md): 4.3x faster on an AMX Xeon, 1.4x
    slower on an AVX512-BF16 Xeon without AMX, 4.1x slower on an AVX2 EPYC.
    """
    cpu = machine.cpu
    fp16 = (
        Rejected(
            "float16",
            "AVX512-FP16 runs it natively (~8% faster prefill than fp32 measured on such a Xeon), "
            "but fp16 overflows in some models; pass dtype='float16' to take that trade",
        )
        if "avx512_fp16" in cpu.flags or "amx_fp16" in cpu.flags
        else Rejected("float16", "no native fp16 on this CPU: converted op by op, slower than fp32")
    )
    if cpu.fast_bf16:
        return Decision(
            "dtype",
            "bfloat16",
            "CPU has AMX-BF16: bf16 matmuls run on tiles (prefill measured 4.3x faster than fp32)",
            (Rejected("float32", "2x the memory and slower on AMX"), fp16),
        )
    why_not = (
        "AVX512-BF16 without AMX: prefill measured 1.4x slower than fp32"
        if cpu.bf16_instructions
        else "no bf16 instructions: prefill measured 4.1x slower than fp32 (AVX2)"
    )
    return Decision(
        "dtype",
        "float32",
        "CPU without AMX: fp32 matmuls are fastest for prefill; decode is memory-bound, so bf16 (half the "
        "bytes) can win there (1.45x on an AVX2 EPYC, no gain on an AVX512-BF16 Xeon): pass dtype='bfloat16' "
        "for decode-heavy use",
        (Rejected("bfloat16", why_not), fp16),
    )
