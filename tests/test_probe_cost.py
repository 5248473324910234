"""The first plan's dtype probe stops as soon as more rounds could not change its verdict (issue 50): every
round on the same side of the tie margin, clear of its edges, at prefill and at decode. Rounds are made by hand
here (the loop's own rounds are replaced at the timing boundary); nothing asserts a timing of this machine."""

from __future__ import annotations

import pytest

from cudaload.capability import dtype_timing
from cudaload.capability.dtype_timing import FLOOR_ROUNDS, MIN_ROUNDS, measure_dtypes
from cudaload.capability.probe_confidence import rounds_settled
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import ProbeRound


def one_round(prefill_speedup: float, decode_speedup: float) -> ProbeRound:
    """bf16 `prefill_speedup` / `decode_speedup` times as fast as fp32 (fp16 as slow as fp32)."""
    prefill = {"float32": 0.010, "bfloat16": 0.010 / prefill_speedup, "float16": 0.010}
    decode = {"float32": 1e-3, "bfloat16": 1e-3 / decode_speedup, "float16": 1e-3}
    return ProbeRound(
        tuple(prefill.items()), tuple(decode.items()), tuple((a, b, 1e-4) for a in DTYPES for b in DTYPES if a != b)
    )


@pytest.mark.parametrize(
    ("rounds", "settled"),
    [
        ([(2.3, 1.9), (2.5, 2.0), (2.2, 1.8)], True),  # bf16 clearly faster at both: more rounds change nothing
        ([(0.25, 0.4), (0.22, 0.45), (0.3, 0.5)], True),  # clearly slower at both
        ([(2.3, 1.0), (2.5, 1.02), (2.2, 0.97)], True),  # decode a tie in every round, far from the edges
        ([(2.3, 1.9), (2.5, 2.0), (1.05, 1.8)], False),  # one round on another side (a tie) at prefill
        ([(2.3, 1.12), (2.5, 1.13), (2.2, 1.11)], False),  # decode within 5% of the tie margin's edge (1.15x)
        ([(0.25, 1.9), (0.22, 2.0), (0.3, 1.8)], True),  # opposite phases, each settled: the workload weighs them
        ([], False),
    ],
)
def test_rounds_are_settled_when_every_round_gives_the_same_clear_verdict(
    rounds: list[tuple[float, float]], settled: bool
) -> None:
    assert rounds_settled([one_round(*r) for r in rounds]) is settled


def _scripted(monkeypatch: pytest.MonkeyPatch, speedups: list[tuple[float, float]]) -> list[int]:
    """measure_dtypes with every round's numbers replaced by the script's (in order; the last repeats): the
    loop, its stop rules and its confidence run as they are. Returns the count of rounds timed."""
    calls: list[int] = []

    def scripted(**timed: object) -> ProbeRound:
        calls.append(1)
        return one_round(*speedups[min(len(calls), len(speedups)) - 1])

    monkeypatch.setattr(dtype_timing, "ProbeRound", scripted)
    return calls


def test_a_clear_verdict_stops_the_probe_at_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, [(2.3, 1.9)])
    measured = measure_dtypes(256, 256)
    assert len(measured.rounds) == FLOOR_ROUNDS < MIN_ROUNDS  # before: MIN_ROUNDS, whatever the rounds said
    assert measured.confidence == "quiet"


def test_a_verdict_near_the_tie_margin_measures_the_full_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, [(2.3, 1.13)])
    assert len(measure_dtypes(256, 256).rounds) == MIN_ROUNDS
