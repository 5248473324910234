"""`cudaload bench` measures an adaptive number of rounds within a time budget and says something at
least every few seconds (issue 37: a default run took over 15 minutes, silent between rounds)."""

from __future__ import annotations

import time
from dataclasses import replace

from cudaload.bench.harness import BUDGET_S, BenchRun, workload_for
from cudaload.bench.inference import OVERHEAD_MIN_S, RUN_BUDGET_S, overhead_fits
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


class _Clock:
    """A fake clock the test moves by hand: the budget logic, never the machine's speed."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rounds_stop_at_the_least_once_settled_or_out_of_time_and_run_all_when_fixed() -> None:
    work = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, warmup=1, min_repeats=2, budget_s=1e9)
    budget = RoundBudget(work, 0.5)
    assert [budget.another(done, lambda: False) for done in range(7)] == [True] * 6 + [False]  # 1 + 5 at most
    assert [budget.another(done, lambda: True) for done in range(4)] == [True, True, True, False]  # 1 + 2
    fixed = RoundBudget(replace(work, budget_s=None), 0.5)
    assert [fixed.another(done, lambda: True) for done in range(7)] == [True] * 6 + [False]
    assert "until the ratios settle" in budget.label(3) and fixed.label(2) == "round 3/6"


def test_a_slow_machine_gets_the_warm_up_and_one_round_and_no_round_past_the_phase_share() -> None:
    clock = _Clock()
    work = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, warmup=1, min_repeats=2, budget_s=100.0)
    budget = RoundBudget(work, 0.5, clock=clock)  # a 50 s share
    assert budget.another(0, lambda: False)  # the warm-up
    clock.now += 40.0  # a warm-up of 40 s: the next round (at the 40 s mean) would end at 80 s
    assert budget.another(1, lambda: False)  # yet one measured round always runs
    clock.now += 40.0
    assert not budget.another(2, lambda: False)  # the second (min_repeats) would end past the share
    quick = RoundBudget(work, 0.5, clock=clock)
    for done in range(3):  # 10 s rounds: the minimum fits
        assert quick.another(done, lambda: True)
        clock.now += 10.0
    assert not quick.another(3, lambda: True)  # settled after the minimum: stop
    unsettled = RoundBudget(work, 0.5, clock=clock)
    steps = []
    for done in range(7):
        steps.append(unsettled.another(done, lambda: False))
        clock.now += 10.0
    assert steps == [True] * 5 + [False] * 2  # 5 x 10 s fill the 50 s share; a 6th would pass it


def test_the_overhead_phase_runs_by_default_only_when_the_run_has_time_left() -> None:
    said: list[str] = []
    full = workload_for(quick=False)
    assert overhead_fits(None, False, full, 10.0, said.append) and not said
    assert not overhead_fits(None, False, full, RUN_BUDGET_S - OVERHEAD_MIN_S + 1, said.append)
    assert len(said) == 1 and "--overhead" in said[0] and "skipped" in said[0]
    assert overhead_fits(True, False, full, 1e6, said.append)  # asked for: runs, whatever the time
    assert not overhead_fits(None, True, workload_for(quick=True), 0.0, said.append)  # quick: off
    assert overhead_fits(None, False, workload_for(quick=False, repeats=3), 1e6, said.append)  # fixed: all of it


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


def _phase(budget: RoundBudget, cpu: _Clock, wall: _Clock, costs: list[float], slower: float) -> int:
    """The rounds a phase runs when round i costs `costs[i]` seconds of CPU and `slower` times that of wall."""
    done = 0
    while budget.another(done, lambda: False):  # the ratios never settle: only the budget stops the rounds
        cpu.now += costs[done]
        wall.now += slower * costs[done]
        done += 1
    return done


def test_on_cpu_seconds_a_phase_counts_them_and_its_wall_seconds_only_bound_it() -> None:
    from cudaload.bench.harness import LOAD_SHARE
    from cudaload.bench.rounds import WALL_BOUND

    busy = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, budget_s=BUDGET_S, cpu_clock=True)
    assert RoundBudget(busy, LOAD_SHARE).clock is time.process_time  # the clock the rounds are timed with
    assert RoundBudget(replace(busy, cpu_clock=False), LOAD_SHARE).clock is time.perf_counter
    # The load phase beside CPU-bound neighbours: a warm-up of 4 s of CPU, measured rounds of 2 s, each taking
    # 6x that of wall while it waits for a core. On its CPU share (15 s) it gets more than the minimum.
    costs = [4.0] + [2.0] * 5
    cpu, wall = _Clock(), _Clock()
    budget = RoundBudget(busy, LOAD_SHARE, clock=cpu, wall=wall)
    assert _phase(budget, cpu, wall, costs, slower=6.0) - busy.warmup >= 3 and budget.walled is None
    # the same rounds on a wall budget (what counted before): one measured round, the warm-up having spent it
    cpu, wall = _Clock(), _Clock()
    on_wall = RoundBudget(replace(busy, cpu_clock=False), LOAD_SHARE, clock=wall, wall=wall)
    assert _phase(on_wall, cpu, wall, costs, slower=6.0) - busy.warmup == 1
    # A process starved of the cores (50x the CPU seconds in wall): the wall bound stops it after the first
    # measured round, which always runs, and says why.
    cpu, wall = _Clock(), _Clock()
    said: list[str] = []
    starved = RoundBudget(busy, LOAD_SHARE, clock=cpu, wall=wall, phase="load", say=said.append)
    assert _phase(starved, cpu, wall, costs, slower=50.0) - busy.warmup == 1
    bound = WALL_BOUND * BUDGET_S * LOAD_SHARE
    assert starved.walled is not None and f"{WALL_BOUND:.0f}x the phase's share in wall seconds ({bound:.0f} s" in (
        starved.walled
    )
    assert said == [f"load: {starved.walled}"]  # said once, by the budget that stopped, with its phase
    # a CPU share spent stops the phase, whatever the wall
    cpu, wall = _Clock(), _Clock()
    costly = RoundBudget(busy, LOAD_SHARE, clock=cpu, wall=wall)
    assert _phase(costly, cpu, wall, [8.0] * 6, slower=1.0) - busy.warmup == 1 and costly.walled is None
