"""Typed results of the inference benchmark: one row per variant, the ratios, the summary.

Ratios read "plan speed-up": variant time / plan time (decode: plan tok/s / variant tok/s), so
>1 means the plan is faster and <1 means that variant beats the plan. The summary turns it
around per metric: the plan's time over the best variant's and over bare `from_pretrained`'s
(1.00 = as fast; above 1 the plan is slower by that factor). Memory ratios are peak bytes over
peak bytes. All are ratios of medians; the "paired" ratios are the median of the per-round
ratios (variant and plan ran seconds apart in each round): steadier when the machine drifts.
`write_result` files the JSON; `save_tuning_record` stores the measured grid for later plans.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..frozen import frozen
from ..plans import jsonable
from .harness import Variant

__all__ = [
    "METRICS",
    "VariantResult",
    "baseline_of",
    "median",
    "ratio",
    "rows_of",
    "save_tuning_record",
    "shape_key",
    "summarise",
    "write_result",
]

METRICS = ("load", "prefill", "decode", "end_to_end", "memory")
"""What the summary compares; decode is a rate (higher is better), the rest lower is better."""


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: list[float]) -> float | None:
    """max/min over the measured rounds: how far apart repeated runs of the same thing were."""
    return round(max(values) / min(values), 3) if values and min(values) > 0 else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 4)


def _paired(numerators: list[float], denominators: list[float]) -> float | None:
    """Median of the per-round ratios over the rounds both measured: every variant's rounds start in the same
    round, so a variant stopped early (decided or time-boxed) pairs with the first rounds of the other."""
    n = min(len(numerators), len(denominators))
    if not n or min(denominators[:n]) <= 0:
        return None
    return round(statistics.median([a / b for a, b in zip(numerators[:n], denominators[:n], strict=True)]), 4)


def _end_to_end(v: Variant) -> float | None:
    """The reference workload: one load, then generate() of the prompt (prefill + decode)."""
    load_s, generate_s = median(v.load_s), median(v.generate_s)
    return load_s + generate_s if load_s is not None and generate_s is not None else None


@frozen
class VariantResult:
    """One variant's numbers (medians of the measured rounds) and its ratios to the plan."""

    name: str
    dtype: str
    attn_implementation: str
    is_plan: bool
    is_bare: bool
    is_baseline: bool
    applied: str | None
    ok: bool
    error: str | None
    load_s: float | None
    prefill_s: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    generate_s: float | None
    end_to_end_s: float | None
    weights_bytes: int | None
    peak_memory_bytes: int | None
    finite_logits: bool | None
    runs: dict[str, list[float]]
    spread: dict[str, float | None]
    time_boxed: dict[str, str]
    plan_speedup: dict[str, float | None]
    plan_speedup_paired: dict[str, float | None]
    kwargs: dict[str, Any]

    def seconds(self, metric: str) -> float | None:
        """`metric` as a cost comparable across rows, lower is better (decode: seconds per token,
        memory: peak bytes)."""
        if metric == "decode":
            return 1 / self.decode_tokens_per_s if self.decode_tokens_per_s else None
        if metric == "memory":
            return float(self.peak_memory_bytes) if self.peak_memory_bytes else None
        value = {"load": self.load_s, "prefill": self.prefill_s, "end_to_end": self.end_to_end_s}[metric]
        return float(value) if value is not None else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def baseline_of(variants: list[Variant], attention_chain: tuple[str, ...], dtype: str) -> Variant | None:
    """The plan's variant; if it failed, what load() would fall back to (the next link of the
    chain that worked, with the plan's dtype)."""
    by_name = {v.name: v for v in variants}
    for attn in attention_chain:
        candidate = by_name.get(f"{dtype}/{attn}")
        if candidate is not None and candidate.error is None and candidate.load_s and candidate.prefill_s:
            return candidate
    return None


def rows_of(variants: list[Variant], baseline: Variant | None, prompt_tokens: int, batch: int) -> list[VariantResult]:
    base_e2e = _end_to_end(baseline) if baseline else None
    rows = []
    for v in variants:
        load_s, prefill_s, decode_tps = median(v.load_s), median(v.prefill_s), median(v.decode_tps)
        ok = v.error is None and None not in (load_s, prefill_s, decode_tps)
        paired = ok and baseline is not None
        rows.append(
            VariantResult(
                name=v.name,
                dtype=v.dtype,
                attn_implementation=v.attn_implementation,
                is_plan=v.is_plan,
                is_bare=v.is_bare,
                is_baseline=v is baseline,
                applied=v.applied,
                ok=ok,
                error=v.error,
                load_s=load_s,
                prefill_s=prefill_s,
                prefill_tokens_per_s=batch * prompt_tokens / prefill_s if prefill_s else None,
                decode_tokens_per_s=decode_tps,
                generate_s=median(v.generate_s),
                end_to_end_s=_end_to_end(v),
                weights_bytes=v.weights_bytes,
                peak_memory_bytes=v.peak_bytes,
                finite_logits=v.finite_logits,
                runs={
                    "load_s": v.load_s,
                    "prefill_s": v.prefill_s,
                    "decode_tps": v.decode_tps,
                    "generate_s": v.generate_s,
                },
                spread={"load": _spread(v.load_s), "prefill": _spread(v.prefill_s), "decode": _spread(v.decode_tps)},
                time_boxed=dict(v.boxed),
                plan_speedup={
                    "load": ratio(load_s, median(baseline.load_s)) if ok and baseline else None,
                    "prefill": ratio(prefill_s, median(baseline.prefill_s)) if ok and baseline else None,
                    "decode": ratio(median(baseline.decode_tps), decode_tps) if ok and baseline else None,
                    "end_to_end": ratio(_end_to_end(v), base_e2e) if ok else None,
                },
                plan_speedup_paired={
                    "load": _paired(v.load_s, baseline.load_s) if paired and baseline else None,
                    "prefill": _paired(v.prefill_s, baseline.prefill_s) if paired and baseline else None,
                    "decode": _paired(baseline.decode_tps, v.decode_tps) if paired and baseline else None,
                },
                kwargs=jsonable(v.kwargs),
            )
        )
    return rows


def summarise(rows: list[VariantResult]) -> tuple[dict[str, str | None], dict[str, Any]]:
    """(the best variant per metric, the plan's ratio to it and to bare from_pretrained)."""
    # An interrupted variant is not ok, but what it measured is real: after Ctrl-C "fastest: load None" hid
    # the loads that were measured. A failed variant (an error) has nothing to compare.
    done = [r for r in rows if r.ok or r.error is None]
    best: dict[str, str | None] = {}
    summary: dict[str, Any] = {}
    plan = next((r for r in rows if r.is_plan), None)
    bare = next((r for r in rows if r.is_bare and r.ok), None)
    for metric in METRICS:
        measured = [r for r in done if r.seconds(metric) is not None]
        top = min(measured, key=lambda r: r.seconds(metric) or 0.0) if measured else None
        best[metric] = top.name if top else None
        mine = plan.seconds(metric) if plan is not None and plan.ok else None
        summary[metric] = {
            "best": best[metric],
            "plan_over_best": ratio(mine, top.seconds(metric)) if top else None,
            "plan_over_bare": ratio(mine, bare.seconds(metric)) if bare else None,
        }
    return best, summary


def write_result(result: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        json.dumps({k: v for k, v in result.items() if k != "written_to"}, indent=2) + "\n", encoding="utf-8"
    )
    return target


def shape_key(path: Path) -> str:
    from ..capability.model_config import read_model_facts

    return read_model_facts(str(path)).shape_key


def save_tuning_record(
    model_key: str, machine: Any, result: dict[str, Any], rows: list[VariantResult], threads: int
) -> Path | None:
    """Store the measured grid (every variant that ran, bare excluded) as a tuning record."""
    from ..capability.tuning_records import write_tuning_record
    from ..facts.machine import TunedVariant, TuningRecord

    work = result["workload"]
    if work["batch"] != 1:
        return None  # tuning records describe single-sequence workloads
    record = TuningRecord(
        model_key=model_key,
        prompt_tokens=work["prompt_tokens"],
        new_tokens=work["new_tokens"],
        variants=tuple(
            TunedVariant(r.dtype, r.attn_implementation, r.load_s, r.prefill_s, r.decode_tokens_per_s)  # type: ignore[arg-type]
            for r in rows
            if r.ok and not r.is_bare
        ),
        fingerprint=tuple(sorted(replace(machine, threads=threads).fingerprint().items())),
        measured_at=result["date"][:10],
    )
    return write_tuning_record(record)
