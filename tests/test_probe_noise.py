"""Timing noise must not decide the CPU dtype: the probe keeps its rounds, the policy compares the
dtypes round by round, a noisy round cannot flip a clear answer, and a difference the rounds do
not agree on (or one within the tie margin) is a tie that keeps the checkpoint's dtype.

Round timings are made by hand here; nothing asserts a timing of this machine."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace

import pytest

from cudaload import DtypeProbe, Machine, Workload
from cudaload.capability.dtype_timing import FLOOR_ROUNDS, MAX_ROUNDS, measure_dtypes
from cudaload.capability.probe_confidence import rounds_disagree
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import ProbeRound
from cudaload.facts.model import any_model
from cudaload.facts.spread import TIE_MARGIN, spread
from cudaload.policy import Request, decide_plan
from model_shapes import tiny as shrunk

# A 0.6B-shaped model (hidden 1024, MLP 3072, 28 layers); its checkpoint dtype varies per test.
MODEL = replace(
    any_model(),
    parameters=596_000_000,
    hidden_size=1024,
    num_layers=28,
    vocab_size=151_936,
    linear_shapes=(("down_proj", 3072, 1024, 28), ("gate_proj", 1024, 3072, 28), ("up_proj", 1024, 3072, 28)),
)


def one_round(bf16_speedup: float) -> ProbeRound:
    """A round where bf16 ran `bf16_speedup` times as fast as fp32 at prefill and at decode (fp16 as
    slow as fp32) and casting costs next to nothing: the workload's ratio is then exactly that."""
    prefill = {"float32": 0.010, "bfloat16": 0.010 / bf16_speedup, "float16": 0.010}
    decode = {"float32": 1e-3, "bfloat16": 1e-3 / bf16_speedup, "float16": 1e-3}
    return ProbeRound(
        tuple(prefill.items()), tuple(decode.items()), tuple((a, b, 1e-12) for a in DTYPES for b in DTYPES if a != b)
    )


def probe_of(speedups: list[float]) -> DtypeProbe:
    """A probe as measure_dtypes builds it: the rounds, and per dtype the median over them."""
    rounds = tuple(one_round(s) for s in speedups)

    def median(phase: str) -> tuple[tuple[str, float], ...]:
        return tuple((d, statistics.median(dict(getattr(r, phase))[d] for r in rounds)) for d in DTYPES)

    return DtypeProbe(
        in_features=1024,
        out_features=2048,
        prefill_tokens=128,
        prefill_s=median("prefill_s"),
        decode_s=median("decode_s"),
        cast_s=rounds[0].cast_s,
        threads=2,
        measured_at="2026-12-04",
        rounds=rounds,
    )


def dtype_decision(speedups: list[float], checkpoint: str | None = "bfloat16"):
    machine = Machine.simulated(None, dtype_probe=probe_of(speedups))
    model = replace(MODEL, checkpoint_dtype=checkpoint)
    return decide_plan(machine, model, Request(workload=Workload(512, 128))).decision("dtype")


# ---- the statistic ----------------------------------------------------------------------------


def test_the_spread_is_the_median_and_the_middle_half_of_the_rounds() -> None:
    summary = spread([1.8, 1.7, 1.9, 1.8, 1 / 12.6])  # one round measured bf16 12.6x slower
    assert summary is not None
    assert (summary.median, summary.low, summary.high, summary.rounds) == (1.8, 1.7, 1.8, 5)
    assert not summary.disagrees and not summary.tie()
    # Three rounds: the ends are the extremes; one round: a point.
    assert spread([0.5, 2.0, 1.5]) == type(summary)(1.5, 0.5, 2.0, 3)
    assert spread([3.0]) == type(summary)(3.0, 3.0, 3.0, 1)


def test_rounds_on_both_sides_of_one_or_within_the_margin_are_a_tie() -> None:
    alternating = spread([1.5, 0.67, 1.5, 0.67, 1.4, 0.7])
    assert alternating is not None and alternating.disagrees and alternating.tie()
    close = spread([1.05, 1.06, 1.04, 1.05, 1.07])
    assert close is not None and not close.disagrees and close.tie()
    assert TIE_MARGIN == 0.15
    edge = spread([1.2] * 5)
    assert edge is not None and not edge.tie()  # all beyond 15%: a verdict
    assert not spread([1 / 1.2] * 5).tie()  # type: ignore[union-attr]
    reaching = spread([1.2, 1.05, 1.25, 1.12, 1.3])  # median past the margin, two rounds inside it
    assert reaching is not None and not reaching.disagrees and not reaching.within() and reaching.tie()


@pytest.mark.parametrize("bad", [[], [0.0], [-1.0], [math.nan], [math.inf], [1.0, math.nan]])
def test_no_spread_from_no_rounds_or_impossible_ratios(bad: list[float]) -> None:
    assert spread(bad) is None


# ---- the verdict in the plan ----------------------------------------------------------------


def test_a_clear_bf16_win_is_kept_through_one_outlier_round() -> None:
    decision = dtype_decision([1.8, 1.7, 1.9, 1.8, 1 / 12.6], checkpoint="float32")
    assert decision.value == "bfloat16"
    assert decision.reason.startswith("bf16 1.80x faster than fp32 (1.70-1.80x over the middle of 5 rounds): est. ")


def test_a_clear_fp32_win_is_kept_through_one_outlier_round() -> None:
    decision = dtype_decision([0.25, 0.25, 0.25, 0.25, 3.0])  # bf16 4x slower; one round said 3x faster
    assert decision.value == "float32"
    assert decision.reason.startswith("bf16 4.00x slower than fp32 (4.00-4.00x over the middle of 5 rounds)")
    rejected = {r.value: r.reason for r in decision.rejected}
    assert rejected["bfloat16"].endswith(", 4.00x slower than float32 (median of the rounds)")


@pytest.mark.parametrize(
    ("checkpoint", "kept", "whose"),
    [
        ("bfloat16", "bfloat16", "the checkpoint's"),
        ("float32", "float32", "the checkpoint's"),
        ("float16", "float32", "the default"),
    ],
)
def test_rounds_that_disagree_are_a_tie_that_keeps_the_checkpoint_dtype(checkpoint, kept, whose) -> None:
    decision = dtype_decision([1.5, 0.67, 1.5, 0.67, 1.4, 0.7], checkpoint=checkpoint)
    assert decision.value == kept
    assert decision.reason.startswith("tie: bf16 at ")
    assert f"over the middle of 6 rounds; the rounds disagree), kept {whose} {kept}: est. " in decision.reason
    other = "float32" if kept == "bfloat16" else "bfloat16"
    assert "a tie within the measurement noise" in {r.value: r.reason for r in decision.rejected}[other]


def test_a_small_difference_the_rounds_agree_on_is_still_a_tie() -> None:
    decision = dtype_decision([1.05, 1.06, 1.04, 1.05, 1.07], checkpoint="float32")
    assert decision.value == "float32"  # bf16 measured 5% faster: not worth swapping the checkpoint's dtype
    assert "tie: bf16 at 1.05x fp32's speed (1.05-1.06x over the middle of 5 rounds; within the 15% tie margin)" in (
        decision.reason
    )


def test_a_median_past_the_margin_with_rounds_inside_it_is_a_tie() -> None:
    decision = dtype_decision([1.2, 1.05, 1.25, 1.12, 1.3], checkpoint="float32")
    assert decision.value == "float32"
    assert "(1.12-1.25x over the middle of 5 rounds; some rounds within the 15% tie margin)" in decision.reason


def test_a_probe_without_rounds_is_judged_as_one_measurement() -> None:
    decision = dtype_decision([2.0])  # a single round
    assert decision.value == "bfloat16" and "(one measurement)" in decision.reason
    hand_made = replace(probe_of([2.0]), rounds=())
    machine = Machine.simulated(None, dtype_probe=hand_made)
    assert "(one measurement)" in decide_plan(machine, MODEL, Request()).decision("dtype").reason


def test_the_verdict_is_the_same_whatever_order_the_rounds_came_in() -> None:
    rounds = [1.8, 1.7, 1.9, 1.8, 1 / 12.6, 1.75, 1.85]
    first = dtype_decision(rounds)
    assert all(dtype_decision(rounds[i:] + rounds[:i]) == first for i in range(len(rounds)))


# ---- the probe measures until its rounds agree (bounded) --------------------------------------


def test_the_probe_re_measures_only_while_its_rounds_disagree() -> None:
    agree = [one_round(2.0), one_round(1.9), one_round(2.1), one_round(0.2), one_round(2.0)]
    assert not rounds_disagree(agree)  # one outlier round is outvoted
    assert rounds_disagree([one_round(s) for s in (1.5, 0.6, 1.4, 0.7, 1.5)])
    measured = measure_dtypes(256, 256)
    assert FLOOR_ROUNDS <= len(measured.rounds) <= MAX_ROUNDS
    for dtype in DTYPES:  # the reported numbers are the medians of the rounds kept
        assert measured.prefill(dtype) == statistics.median(dict(r.prefill_s)[dtype] for r in measured.rounds)
        assert measured.decode(dtype) == statistics.median(dict(r.decode_s)[dtype] for r in measured.rounds)


def test_a_clear_ratio_on_a_gap_nobody_notices_is_a_tie() -> None:
    from cudaload.facts.spread import spread
    from cudaload.policy.precision import _verdict

    rounds = spread([1.5, 1.52, 1.49, 1.51, 1.5])  # bf16 clearly 1.5x faster in every round
    assert rounds is not None
    dtype, headline, tie = _verdict(rounds, "float32", gap_s=0.004)  # 0.012 s vs 0.008 s: 4 ms apart
    assert (dtype, tie) == ("float32", True)
    assert "4 ms apart" in headline and "kept the checkpoint's float32" in headline
    # Literal gaps on each side of the 50 ms line (NOTICEABLE_S), never derived from the constant itself.
    assert _verdict(rounds, "float32", gap_s=0.049)[::2] == ("float32", True)
    dtype, headline, tie = _verdict(rounds, "float32", gap_s=0.050)
    assert (dtype, tie) == ("bfloat16", False)
    assert headline.startswith("bf16 1.50x faster")


def test_a_tie_by_milliseconds_says_so_not_noise() -> None:
    # docs/finetune.md printed "float32 ... 7.67x faster than bfloat16, a tie within the measurement noise" for a
    # tiny model (issue 38): a 7.67x gap is no noise; it is a tie because it is a few milliseconds.
    tiny = shrunk(MODEL)
    machine = Machine.simulated(None, dtype_probe=probe_of([1 / 7.67] * 5))
    decision = decide_plan(machine, tiny, Request(workload=Workload(512, 128))).decision("dtype")
    assert decision.value == "bfloat16" and decision.reason.startswith("tie: bf16 at 0.13x fp32's speed")
    fp32 = {r.value: r.reason for r in decision.rejected}["float32"]
    assert "7.67x faster than bfloat16" in fp32 and "measurement noise" not in fp32
    assert re.search(r", a tie: \d+ ms apart, under the 50 ms worth choosing for$", fp32), fp32
