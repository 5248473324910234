"""How many rounds a benchmark measures, and a progress line at least every few seconds.

`cudaload bench` with no `--repeats` measures an adaptive number of rounds within a time budget
(`RoundBudget`): the warm-up and one measured round, then up to `BenchRun.min_repeats` while
another round fits in the phase's share of `BenchRun.budget_s`, then more only while the
variants' ratios to each other are not settled and another round fits. A fixed 1 + 3 rounds of
SmolLM2 with every variant took over 15 minutes on 2 busy cores (issue 37); a settled ratio needs
no more rounds, an unsettled one gets what the budget allows and its spread says how sure it is.
`--repeats N` measures exactly N. The budget counts the seconds the rounds are timed in (`meters.round_clock`:
on busy cores the process's CPU seconds), bounded in wall seconds by WALL_BOUND.

`ticking` wraps a phase logger so that a line is said at least every TICK_S seconds, even inside
a long round (a blank terminal for minutes looks hung); `terminal_bar` is the tqdm bar a terminal
shows, and `quiet_threads` keeps transformers' own bars off and torch's threads pinned meanwhile.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from ..facts.spread import TIE_MARGIN
from .meters import round_clock

__all__ = [
    "SETTLED_SPREAD",
    "SIDE_ROUNDS",
    "TICK_S",
    "WALL_BOUND",
    "RoundBudget",
    "decided",
    "quiet_threads",
    "ratios_settled",
    "terminal_bar",
    "ticking",
]

SETTLED_SPREAD = 0.10
"""A variant's per-round ratio to the first variant is settled when its rounds span at most 10% of
their median: interleaved rounds share the machine's slow moments, so the ratio settles before
the raw times do."""
SIDE_ROUNDS = 3
"""Rounds that decide a side (the plan faster, or slower) just past `TIE_MARGIN`; two decide one only past twice
the margin. Two loads of the same bfloat16 bytes (bfloat16/eager against the plan's bfloat16/sdpa, 60-80 ms) came
0.83-0.86x apart in both rounds of one default bench (2-core Zen 4, load 3, CPU seconds) and 1.06-1.18x over three
in the full grid: a verdict the noise of two rounds made."""
WALL_BOUND = 6.0
"""A phase whose rounds are timed in CPU seconds (busy cores: `meters.round_clock`) counts its share of the
budget in those seconds, so CPU-cheap rounds are not cut short by the waits for a core; it also stops once the
next round would end past WALL_BOUND x its share in wall seconds, so a process starved of the cores cannot run
unbounded: the CPU seconds decide while the bench gets at least a sixth of a core. Beside 4 CPU-bound neighbours
on the 2-core Zen 4 (with other sessions' load on top) a default bench got 13-21% of a core, and the load
phase's rounds (60-120 ms loads of SmolLM2, ~2 s of CPU a round, 10-14 s of wall) got one measured round on a
wall budget: "load vs bare" then differed from the full grid's in one run of two (issue 50)."""
TICK_S = 5.0
"""The longest a benchmark stays silent (issue 37: at least every 5 s)."""
TICK_MARGIN = 0.8
"""`ticking` speaks after TICK_MARGIN x `every` of silence: on a busy machine its thread wakes up
late (its output came 5.4 to 6.4 s apart at load 10 on 2 cores with no margin), and the goal is a bound."""


class _Work(Protocol):
    @property
    def warmup(self) -> int: ...
    @property
    def repeats(self) -> int: ...
    @property
    def min_repeats(self) -> int: ...
    @property
    def budget_s(self) -> float | None: ...
    @property
    def cpu_clock(self) -> bool: ...


def ratios_settled(series: Sequence[Sequence[float]]) -> bool:
    """Whether every variant's per-round ratio to the first variant's value of the same round is
    settled (`SETTLED_SPREAD`). `series[i]`: variant i's measured values, one per round; variants
    without a value in every round (a failed one) are left out."""
    rounds = max((len(s) for s in series), default=0)
    full = [list(s) for s in series if len(s) == rounds and all(v > 0 for v in s)]
    if rounds < 2 or len(full) < 2:
        return rounds >= 2
    for other in full[1:]:
        ratios = [o / r for o, r in zip(other, full[0], strict=True)]
        if (max(ratios) - min(ratios)) / statistics.median(ratios) > SETTLED_SPREAD:
            return False
    return True


def decided(plan: Sequence[float], other: Sequence[float], *, rate: bool = False) -> str | None:
    """How a variant compares with the plan once more rounds cannot change it (None: they still can), from the
    per-round ratios (variant seconds / the plan's seconds of the same round; `rate`: plan / variant, for tokens/s):
    after at least two paired rounds, every round beyond `TIE_MARGIN` on the same side (the plan clearly faster, or
    clearly slower; on two rounds only, beyond twice the margin: SIDE_ROUNDS), or every round within it and settled
    (`SETTLED_SPREAD`): a tie. Rounds on both sides of the margin are undecided; a variant stops being measured only
    once decided (issue 50: the verdict, not the decimals, is what the default bench owes)."""
    pairs = list(zip(plan, other, strict=False))
    if len(pairs) < 2 or not all(p > 0 and o > 0 for p, o in pairs):
        return None
    ratios = [p / o if rate else o / p for p, o in pairs]
    low, high, shown = min(ratios), max(ratios), f"{min(ratios):.2f}-{max(ratios):.2f}x"
    margin = TIE_MARGIN if len(pairs) >= SIDE_ROUNDS else 2 * TIE_MARGIN
    if low > 1 + margin:
        return f"the plan faster in every round ({shown})"
    if high < 1 / (1 + margin):
        return f"the plan slower in every round ({shown})"
    inside = low > 1 / (1 + TIE_MARGIN) and high < 1 + TIE_MARGIN
    if inside and (high - low) / statistics.median(ratios) <= SETTLED_SPREAD:
        return f"a tie with the plan in every round ({shown})"
    return None


class RoundBudget:
    """When a phase stops measuring rounds (see the module docstring). `share`: this phase's part
    of `work.budget_s`, counted from when the phase starts on the clock its rounds are timed with
    (`meters.round_clock(work.cpu_clock)`), and, on CPU seconds, within WALL_BOUND x that share of wall
    seconds; `clock`/`wall`: tests pass fakes.

    The warm-up and one measured round always run (fewer measure nothing); the rounds up to
    `min_repeats` run while the next one fits the phase's share, so a slow or busy machine gets
    fewer rounds (and a spread that says so) rather than an unbounded run; past them, a round
    starts only while the ratios are unsettled and it fits."""

    def __init__(
        self,
        work: _Work,
        share: float,
        clock: Callable[[], float] | None = None,
        wall: Callable[[], float] | None = None,
        *,
        phase: str = "",
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.clock = clock or round_clock(work.cpu_clock)[0]
        self.cpu_clock = work.cpu_clock
        self.phase, self.say = phase, say
        self.wall = wall or round_clock(False)[0]
        self.fixed, self.warmup = work.budget_s is None, work.warmup
        self.most = work.warmup + work.repeats
        self.first = work.warmup + min(1, work.repeats)
        self.least = work.warmup + min(work.min_repeats, work.repeats)
        self.started, self.wall_started = self.clock(), self.wall()
        self.share_s = (work.budget_s or 0.0) * share
        self.walled: str | None = None
        """Why the wall bound stopped the phase before its share did (None: it did not)."""

    def another(self, done: int, settled: Callable[[], bool]) -> bool:
        """Whether round `done + 1` starts, after `done` rounds; `settled()`: whether the values so
        far are (`ratios_settled` of each measured quantity)."""
        if done >= self.most:
            return False
        if self.fixed or done < self.first:
            return True
        if done >= self.least and settled():
            return False
        # the next round, at the mean so far, ends within the share (its own clock) and the wall bound
        if not _fits(self.clock(), self.started, self.share_s, done):
            return False
        bound = WALL_BOUND * self.share_s
        if not _fits(self.wall(), self.wall_started, bound, done):
            spent, waited = self.clock() - self.started, self.wall() - self.wall_started
            self.walled = (
                f"stopped after {done - self.warmup} measured rounds: the next would end past {WALL_BOUND:.0f}x "
                f"the phase's share in wall seconds ({bound:.0f} s; {waited:.0f} s so far for {spent:.1f} s of CPU)"
            )
            if self.say is not None:
                self.say(f"{self.phase}: {self.walled}")
            return False
        return True

    def label(self, done: int) -> str:
        """ "round 3/4" (fixed) or "round 3 (2-6, until the ratios settle)" (adaptive)."""
        if self.fixed:
            return f"round {done + 1}/{self.most}"
        return f"round {done + 1} ({self.first}-{self.most}, until the ratios settle or the time budget is spent)"


def _fits(now: float, started: float, share_s: float, done: int) -> bool:
    """Whether a round taking the mean of the `done` rounds since `started` ends within `share_s` of it."""
    return now + (now - started) / done <= started + share_s


@contextmanager
def ticking(say: Callable[[str], None], every: float = TICK_S) -> Iterator[Callable[[str], None]]:
    """A `say` that also repeats the last line ("still: ...", with its age) whenever nothing was
    said for TICK_MARGIN x `every` seconds, from a daemon thread, until the block ends."""
    started = time.perf_counter()
    last: list[tuple[str, float]] = [("starting", started)]  # (line, when it was said)
    out = [started]  # when anything was last written
    lock = threading.Lock()
    done = threading.Event()

    def said(line: str) -> None:
        with lock:
            last[0] = (line, time.perf_counter())
            out[0] = last[0][1]
        say(line)

    def tick() -> None:
        while not done.wait(every / 10):
            with lock:
                (line, when), now = last[0], time.perf_counter()
                due = now - out[0] >= every * TICK_MARGIN
                if due:
                    out[0] = now
            if due:
                say(f"still: {line.strip()} ({now - when:.0f} s so far)")

    thread = threading.Thread(target=tick, name="cudaload-bench-ticker", daemon=True)
    thread.start()
    try:
        yield said
    finally:
        done.set()
        thread.join()


def terminal_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr (off unless `enabled`: a terminal)."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, file=sys.stderr, unit="step", dynamic_ncols=True, leave=False)


@contextmanager
def quiet_threads(torch: Any, threads: int | None) -> Iterator[None]:
    """Silence transformers' progress bars and pin torch's CPU threads for the run, restoring both."""
    from transformers.utils import logging as hf_logging

    progress_bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        if progress_bars_were_on:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
