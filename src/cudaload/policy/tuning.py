"""On a GPU, a tuning record of this model measured on this machine picks among the valid options.

Without a record the GPU tables decide (bf16 on sm80+, the attention chain by generation). With
one, the plan takes the measured fastest (dtype, attention) pair for the workload among the
options the tables allow: dtypes the GPU runs natively (never fp16 for an fp16-fragile family) and
the links of the attention chain. A setting the user gave is never replaced.
"""

from __future__ import annotations

from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
from ..request import Workload
from .measured import matching_record, record_estimate

__all__ = ["tune_on_gpu"]


def tune_on_gpu(
    machine: Machine,
    model: ModelFacts,
    workload: Workload,
    dtype: Decision,
    attention: Decision,
    chain: tuple[str, ...],
) -> tuple[Decision, Decision, tuple[str, ...]]:
    gpu = machine.weakest_gpu
    if gpu is None or "user" in (dtype.source, attention.source):
        return dtype, attention, chain
    record, ignored = matching_record(machine, model)
    if record is None:
        if ignored:
            dtype = Decision(dtype.setting, dtype.value, f"{dtype.reason}; {'; '.join(ignored)}", dtype.rejected)
        return dtype, attention, chain
    allowed = {dtype.value, "bfloat16", "float16"} if gpu.bf16 else {dtype.value, "float16"}
    if model.fp16_fragile:
        allowed.discard("float16")
    timed = {
        (v.dtype, v.attn_implementation): record_estimate(v, record, workload).total
        for v in record.variants
        if v.dtype in allowed and v.attn_implementation in chain
    }
    if not timed:
        return dtype, attention, chain
    best_dtype, best_attention = min(timed, key=lambda pair: timed[pair])
    best = timed[(best_dtype, best_attention)]
    source = f"measured on this machine by `cudaload bench --save` on {record.measured_at} ({record.path})"
    work = workload.describe()

    def slower(seconds: float) -> str:
        return f"est. {seconds:.2f} s for {work}, {seconds / best:.2f}x the fastest" if best > 0 else "measured"

    per_dtype = {d: min(t for (dd, _), t in timed.items() if dd == d) for d, _ in timed}
    dtype = Decision(
        "dtype",
        best_dtype,
        f"fastest measured here with {best_attention}: est. {best:.2f} s for {work} ({source})",
        tuple(Rejected(d, slower(t)) for d, t in per_dtype.items() if d != best_dtype)
        + tuple(r for r in dtype.rejected if r.value not in per_dtype),
    )
    per_link = {a: t for (d, a), t in timed.items() if d == best_dtype}
    attention = Decision(
        "attn_implementation",
        best_attention,
        f"fastest measured link of the chain in {best_dtype}: est. {best:.2f} s for {work} ({source})",
        tuple(Rejected(a, slower(t)) for a, t in per_link.items() if a != best_attention) + attention.rejected,
    )
    # The measured winner first; the rest keep the table's order as fallbacks.
    return dtype, attention, (best_attention, *(link for link in chain if link != best_attention))
