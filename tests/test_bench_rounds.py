"""`cudaload bench` measures an adaptive number of rounds within a time budget and says something at
least every few seconds (issue 37: a default run took over 15 minutes, silent between rounds)."""

from __future__ import annotations

import time
from dataclasses import replace

from cudaload.bench.harness import BUDGET_S, BenchRun, workload_for
from cudaload.bench.rounds import RoundBudget, ratios_settled, ticking


def test_a_full_run_without_repeats_has_a_budget_and_a_given_repeats_is_exact() -> None:
    full = workload_for(quick=False)
    assert full.budget_s == BUDGET_S and full.min_repeats < full.repeats  # adaptive: between the two
    assert workload_for(quick=False, repeats=4).budget_s is None  # --repeats 4: exactly 4
    assert workload_for(quick=True).budget_s is None and workload_for(quick=True).repeats == 1


def test_ratios_are_settled_when_each_variants_ratio_to_the_first_holds_across_rounds() -> None:
    # The machine slows every variant of round 2 alike (interleaved rounds): the ratio holds.
    assert ratios_settled([[1.0, 3.0, 1.1], [2.0, 6.0, 2.2]])
    assert not ratios_settled([[1.0, 1.0, 1.0], [2.0, 3.0, 2.0]])  # variant 2 moved 50% on its own
    assert not ratios_settled([[1.0], [2.0]])  # one round shows no spread
    assert ratios_settled([[1.0, 1.0], [2.0, 2.1], []])  # a failed variant (no values) is left out


def test_rounds_stop_at_the_least_once_settled_or_out_of_time_and_run_all_when_fixed() -> None:
    work = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, warmup=1, min_repeats=2, budget_s=1e9)
    budget = RoundBudget(work, 0.5)
    assert [budget.another(done, lambda: False) for done in range(7)] == [True] * 6 + [False]  # 1 + 5 at most
    assert [budget.another(done, lambda: True) for done in range(4)] == [True, True, True, False]  # 1 + 2
    spent = RoundBudget(replace(work, budget_s=0.0), 0.5)
    time.sleep(0.01)
    assert [spent.another(done, lambda: False) for done in range(4)] == [True, True, True, False]
    fixed = RoundBudget(replace(work, budget_s=None), 0.5)
    assert [fixed.another(done, lambda: True) for done in range(7)] == [True] * 6 + [False]
    assert "until the ratios settle" in budget.label(3) and fixed.label(2) == "round 3/6"


def test_a_silent_phase_still_says_what_it_is_doing() -> None:
    lines: list[str] = []
    with ticking(lines.append, every=0.05) as say:
        say("prefill/decode round 1")
        time.sleep(0.3)  # a long round: nothing said by the phase itself
    assert lines[0] == "prefill/decode round 1"
    ticks = lines[1:]
    assert ticks and all(t.startswith("still: prefill/decode round 1 (") for t in ticks)
    count = len(lines)
    time.sleep(0.15)
    assert len(lines) == count  # the ticker ends with the block
