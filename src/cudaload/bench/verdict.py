"""What a bench run concludes, and when a variant's rounds can stop because more cannot change it.

The verdict is what the default `cudaload bench` owes its user (issue 50): per metric, whether the plan
is the best variant or within the tie margin of it, and whether it is faster than, as fast as, or slower
than bare `from_pretrained`; the decimals of each ratio are not part of it. A variant whose every
measured round already says the same of it against the plan (`rounds.decided`) is measured no further in
that phase (`stop_settled`), so the rounds go to the variants still too close to call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..facts.spread import TIE_MARGIN, Spread, spread
from .rounds import SIDE_ROUNDS, decided

__all__ = ["VERDICT_METRICS", "never_planned", "share_plan_rounds", "still_measured", "stop_settled", "verdict"]

VERDICT_METRICS = ("load", "prefill", "decode", "end_to_end")
"""The timed metrics a verdict states (memory is bytes, the same in every run of a checkpoint)."""


class _Timed(Protocol):
    """A load/prefill/decode variant as `harness.Variant` holds it."""

    is_plan: bool
    error: str | None
    boxed: dict[str, str]
    load_s: list[float]
    prefill_s: list[float]
    decode_tps: list[float]
    generate_s: list[float]
    is_bare: bool
    applied: str | None
    device: str | None
    kwargs: dict[str, Any]
    finite_logits: bool | None
    peak_bytes: int | None

    @property
    def name(self) -> str: ...


class _Work(Protocol):
    @property
    def budget_s(self) -> float | None: ...


def _why_settled(v: _Timed, plan: _Timed, phase: str) -> str | None:
    if phase == "load":
        why = decided(plan.load_s, v.load_s)
        rounds = len(v.load_s)
    else:
        prefill = decided(plan.prefill_s, v.prefill_s)
        decode = decided(plan.decode_tps, v.decode_tps, rate=True)
        why = f"prefill {prefill}, decode {decode}" if prefill and decode else None
        rounds = len(v.prefill_s)
    return None if why is None else f"stopped after {rounds} measured rounds, more cannot change the verdict: {why}"


def stop_settled(variants: Sequence[_Timed], phase: str, work: _Work) -> list[str]:
    """After a round of `phase` ("load" or "run") in an adaptive run: each variant but the plan whose rounds
    have decided how it compares with the plan's (`rounds.decided`; in "run" prefill and decode both) is
    measured no further there (its `boxed[phase]` says why); returns a line for each. A fixed `--repeats N`
    measures N rounds of every variant."""
    plan = next((v for v in variants if v.is_plan and v.error is None), None)
    if work.budget_s is None or plan is None:
        return []
    lines = []
    for v in variants:
        if v.is_plan or v.error is not None or phase in v.boxed:
            continue
        why = _why_settled(v, plan, phase)
        if why is not None:
            v.boxed[phase] = why
            lines.append(f"{v.name}: {'load' if phase == 'load' else 'prefill/decode'} {why}")
    return lines


_SAME_RUN_KWARGS = {"dtype", "attn_implementation", "device_map"}
"""The plan's from_pretrained kwargs that only choose what `applied`/`device` read back; any other (kernels,
quantization) can change the run, and then bare is measured on its own."""


def share_plan_rounds(variants: Sequence[_Timed], *, before: bool) -> list[str]:
    """Bare `from_pretrained(path)` that loaded as the plan's variant (the same dtype/attention read back, on
    the same device, and the plan sets nothing else that runs differently) runs the same model: its prefill
    and decode are not measured again, they are the plan's rounds (its load is its own). `before` the run
    phase: mark it (`boxed["run"]`, so it is not kept resident nor run) and say so; after: copy the plan's
    rounds into it. Twice the same computation measured apart differs only by the machine's noise, which on a
    busy machine read as "bare 6.7x faster than the plan" with both in bfloat16/sdpa (issue 50)."""
    plan = next((v for v in variants if v.is_plan and v.error is None), None)
    lines = []
    for v in variants:
        if plan is None or not v.is_bare or v.error is not None or plan.applied is None:
            continue
        same = (v.applied, v.device) == (plan.applied, plan.device) and not any(
            value not in (None, False) for key, value in plan.kwargs.items() if key not in _SAME_RUN_KWARGS
        )
        if not same:
            continue
        if before:
            as_plan = f"{plan.applied} on {plan.device}"
            v.boxed["run"] = f"not measured again: it loads as the plan ({as_plan}), its rounds are the plan's"
            lines.append(f"{v.name}: prefill/decode {v.boxed['run']}")
        elif plan.prefill_s:
            v.prefill_s, v.decode_tps, v.generate_s = list(plan.prefill_s), list(plan.decode_tps), list(plan.generate_s)
            v.finite_logits, v.peak_bytes = plan.finite_logits, plan.peak_bytes
    return lines


def still_measured(variants: Sequence[_Timed], phase: str) -> bool:
    """Whether a variant besides the plan is still measured in `phase`: without one, a round compares nothing."""
    return any(not v.is_plan and v.error is None and phase not in v.boxed for v in variants)


def _side(ratios: Spread) -> str:
    """The plan against another variant, from the plan-over-other time ratio of each round: "slower" or
    "faster" when the middle half of the rounds lies beyond `facts.spread.TIE_MARGIN` on that side, else "tie"
    (the rule the policy decides by, `Spread.tie`: one slow round moves neither end); on fewer than
    `rounds.SIDE_ROUNDS` rounds, beyond twice the margin, as `rounds.decided` stops a variant."""
    margin = TIE_MARGIN if ratios.rounds >= SIDE_ROUNDS else 2 * TIE_MARGIN
    if ratios.tie(margin):
        return "tie"
    return "slower" if ratios.low > 1 else "faster"


def never_planned(dtype: str, on_cuda: bool) -> str | None:
    """Why no plan on this machine can choose `dtype` (None: one can). fp16 on a CPU: the policy never picks
    it there (policy/precision.py `_CPU_CANDIDATES`: real weights overflow it in some models), so timing it
    cannot change which variant the plan should have been; the probe still says what it would gain."""
    if dtype == "float16" and not on_cuda:
        return "fp16 is never planned on a CPU (policy/precision.py: overflow risk); `--all-variants` times it"
    return None


_SECONDS = {"load": "load_s", "prefill": "prefill_s", "decode": "decode_tokens_per_s", "end_to_end": "end_to_end_s"}
_ROUNDS = {"load": "load_s", "prefill": "prefill_s", "decode": "decode_tps"}


def _seconds(row: dict[str, Any], metric: str) -> float | None:
    value = row.get(_SECONDS[metric])
    if not isinstance(value, (int, float)) or value <= 0:
        return None
    return 1.0 / value if metric == "decode" else float(value)  # decode: seconds per token


def _paired(plan: dict[str, Any], row: dict[str, Any], key: str) -> list[tuple[float, float]]:
    """(the plan's, the row's) `key` value per round, over the rounds both measured: a variant stopped early
    (`stop_settled`, a time box) is compared with the plan's first rounds, as it ran beside them."""
    mine, theirs = (plan.get("runs") or {}).get(key) or [], (row.get("runs") or {}).get(key) or []
    pairs = list(zip(mine, theirs, strict=False))
    return pairs if pairs and all(a > 0 and b > 0 for a, b in pairs) else []


def _compared(plan: dict[str, Any], row: dict[str, Any], metric: str) -> Spread | None:
    """The plan's seconds over the row's for `metric`, round by round (> 1: the row was faster in that round),
    summarised (`facts.spread`); a result without per-round numbers (an older record) gives one ratio, of the
    rows' medians. End to end, a round is its load plus its generate()."""
    if metric == "end_to_end":
        load, generate = _paired(plan, row, "load_s"), _paired(plan, row, "generate_s")
        pairs = [(a + c, b + d) for (a, b), (c, d) in zip(load, generate, strict=False)]
    else:
        pairs = _paired(plan, row, _ROUNDS[metric])
        if metric == "decode":
            pairs = [(1.0 / a, 1.0 / b) for a, b in pairs]  # tokens/s -> seconds per token
    if not pairs:
        mine, theirs = _seconds(plan, metric), _seconds(row, metric)
        pairs = [] if mine is None or theirs is None else [(mine, theirs)]
    return spread([a / b for a, b in pairs])


def verdict(result: dict[str, Any]) -> dict[str, dict[str, str | None]]:
    """A bench result's conclusions (`cudaload.bench.run_bench`'s JSON), per timed metric: `plan` is "best"
    when no variant a plan on this machine can choose (`never_planned`: not fp16 on a CPU, which
    `--all-variants` times) beats it beyond the tie margin, else the variant that beats it by the most (the
    highest median ratio); `vs_bare` is the plan against bare from_pretrained ("faster", "tie" or "slower").

    Each variant is compared with the plan round by round, over the rounds both measured (`_compared`), and
    the middle half of those ratios decides (`_side`), not the ratio of two medians: the plan and bare load the
    same bytes, yet five rounds of each beside 4 CPU-bound neighbours read 59-115 and 61-106 ms of CPU, and their
    medians (94 vs 70 ms) said "bare faster" where the full grid says a tie (issue 50). A variant stopped once
    decided (`stop_settled`) keeps the side its rounds decided, which the plan's later rounds cannot move. Two
    runs agree when their verdicts are equal, so a default run (fp16 left out, early stops) and a full grid
    compare like with like."""
    on_cuda = (result.get("workload") or {}).get("device") == "cuda"
    rows = [r for r in result.get("variants") or [] if r.get("ok") and never_planned(r["dtype"], on_cuda) is None]
    plan = next((r for r in rows if r.get("is_plan")), None)
    bare = next((r for r in rows if r.get("is_bare")), None)
    out: dict[str, dict[str, str | None]] = {}
    for metric in VERDICT_METRICS:
        ratios = {r["name"]: c for r in rows if plan is not None and (c := _compared(plan, r, metric)) is not None}
        beaten_by = sorted((c.median, name) for name, c in ratios.items() if _side(c) == "slower")
        against_bare = ratios.get(bare["name"]) if bare is not None else None
        out[metric] = {
            "plan": None if not ratios else beaten_by[-1][1] if beaten_by else "best",
            "vs_bare": None if against_bare is None else _side(against_bare),
        }
    return out
