"""Turn measurements of this machine into estimated times of the user's workload.

Two sources, both facts on the Machine (the policy measures nothing itself):
- a tuning record (`cudaload bench --save`): the real model shape measured on this machine, per
  dtype x attention; preferred, and used only when its fingerprint matches this machine;
- the CPU dtype probe: `F.linear` timed per dtype at a prefill GEMM, a decode GEMV (with its weight's
  share of one token's attention over a cached context: SDPA decode is far slower in bf16 than in fp32
  on some CPUs, capability/dtype_timing.py) and a weight cast, scaled here to the model's linear
  layers. It leaves out per-token Python overhead (the same in every dtype), so its totals undercount
  but rank the dtypes. The probe
  keeps every round it measured: `compare_rounds` scales each round to the workload on its own,
  so the comparison comes with its spread (`facts.spread`), and noise can be called a tie.
"""

from __future__ import annotations

from ..facts.machine import DtypeProbe, Machine, TunedVariant, TuningRecord
from ..facts.model import ModelFacts
from ..facts.spread import Spread, spread
from ..frozen import frozen
from ..request import Workload

__all__ = ["Estimate", "compare_rounds", "matching_record", "probe_estimate", "record_estimate"]


@frozen
class Estimate:
    """Estimated seconds for one workload in one dtype (and attention, for a record)."""

    load: float
    prefill: float
    decode: float

    @property
    def total(self) -> float:
        return self.load + self.prefill + self.decode


def probe_estimate(probe: DtypeProbe, model: ModelFacts, dtype: str, workload: Workload) -> Estimate | None:
    """Scale the probe's per-weight timings to the model: prefill by FLOPs (tokens x weights),
    decode by weights read per token, load by weights cast from the checkpoint's dtype."""
    prefill, decode = probe.prefill(dtype), probe.decode(dtype)
    if prefill is None or decode is None:
        return None
    elements = probe.weight_elements
    body = model.linear_parameters or model.parameters  # decoder projections
    head = (model.vocab_size or 0) * (model.hidden_size or 0)  # lm_head: one row per generated token
    prefill_s = prefill * (workload.prompt_tokens / probe.prefill_tokens) * body / elements
    prefill_s += decode * head / elements  # generate() keeps only the last position's logits
    decode_s = max(0, workload.new_tokens - 1) * decode * (body + head) / elements
    load_s = 0.0
    if workload.include_load:
        load_s = probe.cast(model.checkpoint_dtype or "float32", dtype) * model.parameters / elements
    return Estimate(load=load_s, prefill=prefill_s, decode=decode_s)


def compare_rounds(
    probe: DtypeProbe, model: ModelFacts, workload: Workload, candidate: str, reference: str = "float32"
) -> Spread | None:
    """`reference` seconds / `candidate` seconds for `workload`, estimated from each probe round on
    its own (> 1: the candidate is faster), summarised; None when a round lacks either dtype or
    estimates no time at all."""
    ratios = []
    for one in probe.per_round():
        ours, theirs = probe_estimate(one, model, candidate, workload), probe_estimate(one, model, reference, workload)
        if ours is None or theirs is None or ours.total <= 0:
            return None  # (a reference of 0 s gives a ratio of 0, which `spread` refuses)
        ratios.append(theirs.total / ours.total)
    return spread(ratios)


def record_estimate(variant: TunedVariant, record: TuningRecord, workload: Workload) -> Estimate:
    """The record's measurements, prefill scaled linearly from the record's prompt length."""
    prefill = variant.prefill_s * workload.prompt_tokens / max(1, record.prompt_tokens)
    decode = max(0, workload.new_tokens - 1) / variant.decode_tokens_per_s if variant.decode_tokens_per_s > 0 else 0.0
    return Estimate(load=variant.load_s if workload.include_load else 0.0, prefill=prefill, decode=decode)


def matching_record(machine: Machine, model: ModelFacts) -> tuple[TuningRecord | None, tuple[str, ...]]:
    """The newest tuning record for this model's shape measured on this very machine, and why each
    other record was ignored (another torch, CPU, GPU, thread count, or model shape)."""
    ignored: list[str] = []
    for record in machine.tuning:
        if record.model_key != model.shape_key:
            ignored.append(f"the tuning record of {record.measured_at} is for another model shape")
            continue
        differs = machine.fingerprint_differences(record.fingerprint)
        if differs:
            ignored.append(f"the tuning record of {record.measured_at} is stale: {'; '.join(differs)}")
            continue
        return record, tuple(ignored)
    return None, tuple(ignored)
