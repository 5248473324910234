"""Whether a CPU dtype measurement can be trusted: what the machine did while it ran, and the verdict.

The probe counts CPU time (`dtype_timing.py`), so time spent runnable but waiting for a core (the
kernel's per-thread `schedstat`) costs it nothing: it is recorded, not judged. What can still make
a measurement "disturbed" (`confidence_of`): rounds that disagree, a quick re-run that reaches
another verdict (a neighbour that changed what it does to the caches and the memory bandwidth),
steal time (/proc/stat: a hypervisor's vCPU accounting), or a plateau a time slice leaves
(`time_slice_plateau`). `dtype_probe.py` says what is done with each.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence

from ..facts.machine import ProbeRound
from ..facts.spread import TIE_MARGIN, spread
from ..frozen import frozen

__all__ = [
    "Conditions",
    "Watch",
    "confidence_of",
    "rounds_disagree",
    "rounds_settled",
    "time_slice_plateau",
    "wall_agreement",
]

STEAL_SHARE_LIMIT = 0.05
"""Share of the CPU time the hypervisor may steal while measuring (a neighbour VM running)."""
PLATEAU_MIN_S = 2e-3
"""Time slices the Linux scheduler hands out are milliseconds long (3-24 ms with CFS/EEVDF defaults)."""


def rounds_disagree(rounds: list[ProbeRound]) -> bool:
    """Whether the rounds disagree on bf16 against fp32, at prefill or at decode."""
    for phase in ("prefill_s", "decode_s"):
        ratios = [dict(getattr(r, phase))["float32"] / dict(getattr(r, phase))["bfloat16"] for r in rounds]
        summary = spread(ratios)
        if summary is None or summary.disagrees:
            return True
    return False


SETTLED_GUARD = 0.05
"""How far (5%) every round's ratio must sit from the tie margin's edges for `rounds_settled`: closer, one more
round's noise could carry the median across an edge (a busy native run moved decode from 1.12x to 1.20x)."""


def rounds_settled(rounds: list[ProbeRound]) -> bool:
    """Whether more rounds cannot change the verdict: at prefill and at decode every round is on the same side
    (bf16 faster, a tie, or slower: `_side`, the re-run's test), each at least SETTLED_GUARD from the tie
    margin's edges. The rounds then agree in the policy's own terms, so the probe may stop before MIN_ROUNDS
    (issue 50: a first plan pays ~0.1 s of CPU a round on a 2-core Zen 4)."""
    edge = math.log1p(TIE_MARGIN)
    for phase in ("prefill_s", "decode_s"):
        ratios = [dict(getattr(r, phase))["float32"] / dict(getattr(r, phase))["bfloat16"] for r in rounds]
        if not ratios or not all(math.isfinite(x) and x > 0 for x in ratios):
            return False
        if len({_side(x) for x in ratios}) != 1:
            return False
        if any(abs(abs(math.log(x)) - edge) < math.log1p(SETTLED_GUARD) for x in ratios):
            return False
    return True


@frozen
class Conditions:
    """What the machine did while the probe measured.

    wait_share: share of the probe threads' time spent runnable but not running (waiting for a
        core), from /proc/self/task/*/schedstat; None where the kernel does not keep it.
    steal_share: share of all CPU time stolen by the hypervisor (/proc/stat); None when unknown.
    load_1min: the 1-minute load average at the end (recorded, not judged: it lags).
    cores: usable cores (sched_getaffinity).
    threads: torch threads the probe ran with.
    """

    wait_share: float | None
    steal_share: float | None
    load_1min: float
    cores: int
    threads: int


def _schedstat_wait_ns() -> int | None:
    total, seen = 0, False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", encoding="utf-8") as handle:
                total += int(handle.read().split()[1])
                seen = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total if seen else None


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    try:
        with open("/proc/stat", encoding="utf-8") as handle:
            fields = [int(x) for x in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields)) if len(fields) == 8 else None


class Watch:
    """Samples the wait and steal counters around a measurement."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self.wait0, self.ticks0, self.start = _schedstat_wait_ns(), _cpu_ticks(), time.perf_counter()

    def conditions(self) -> Conditions:
        wall = time.perf_counter() - self.start
        wait1, ticks1 = _schedstat_wait_ns(), _cpu_ticks()
        wait = None
        if self.wait0 is not None and wait1 is not None and wall > 0:
            wait = min(1.0, max(0.0, (wait1 - self.wait0) / 1e9 / (wall * self.threads)))
        steal = None
        if self.ticks0 is not None and ticks1 is not None and ticks1[1] > self.ticks0[1]:
            steal = (ticks1[0] - self.ticks0[0]) / (ticks1[1] - self.ticks0[1])
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return Conditions(wait, steal, os.getloadavg()[0], cores, self.threads)


def time_slice_plateau(values: Mapping[str, Sequence[float]], min_s: float = PLATEAU_MIN_S) -> float | None:
    """The length of a scheduler time slice that several different timings sit on, if they do.

    `values` maps a quantity ("decode bfloat16", "cast float32->bfloat16", ...) to its timings.
    Kernels of different kinds (a GEMV, a cast) do not take the same milliseconds by chance, but a
    process that loses its core waits a whole time slice, whatever it was doing: four or more
    quantities of at least two kinds (the word before the space) within 3% of one value of at least
    `min_s` are a plateau (one record showed bf16 decode and all six casts at 11.96-12.03 ms, fp32
    decode at 0.42 ms).
    """
    points = sorted((v, name) for name, seq in values.items() for v in seq if math.isfinite(v) and v >= min_s)
    for low, _ in points:
        inside = {name for v, name in points if low <= v <= low * 1.06}
        if len(inside) >= 4 and len({name.split(" ")[0] for name in inside}) >= 2:
            return statistics.median(v for v, name in points if low <= v <= low * 1.06)
    return None


def _verdicts(rounds: Sequence[ProbeRound]) -> dict[str, float] | None:
    """bf16's median speed against fp32 (> 1 faster) at prefill and decode over `rounds`."""
    out = {}
    for phase in ("prefill_s", "decode_s"):
        summary = spread([dict(getattr(r, phase))["float32"] / dict(getattr(r, phase))["bfloat16"] for r in rounds])
        if summary is None:
            return None
        out[phase.removesuffix("_s")] = summary.median
    return out


def _side(ratio: float) -> int:
    """-1 bf16 slower, 0 within the tie margin, 1 faster."""
    return 0 if abs(math.log(ratio)) < math.log1p(TIE_MARGIN) else (1 if ratio > 1 else -1)


def _moved(main: float, again: float) -> bool:
    """Whether a re-run's ratio reaches another verdict than the main rounds': the opposite side
    (bf16 faster, then slower), or a move of more than the tie margin. A ratio near the margin's
    edge may cross it in a re-run by noise alone (a busy native run: decode bf16 1.12x then 1.20x
    fp32's speed), and the policy judges the whole workload, not each phase's side."""
    sides = {_side(main), _side(again)}
    return sides == {-1, 1} or abs(math.log(again / main)) > math.log1p(TIE_MARGIN)


def confidence_of(rounds: Sequence[ProbeRound], rerun: Sequence[ProbeRound], conditions: Conditions) -> tuple[str, str]:
    """("quiet" or "disturbed", what the probe saw, in one sentence with its figures).

    Disturbed: the hypervisor stole more than STEAL_SHARE_LIMIT, the main rounds still disagree,
    the quick re-run reaches another verdict (`_moved`: bf16 faster then slower, or a ratio that moved
    by more than the tie margin, at prefill or decode), or
    the timings sit on a time-slice plateau while the thread did wait. Waiting for a core is said
    but not judged: the timings are CPU time, which waiting does not add to.
    """
    c = conditions
    seen = []
    problems = []
    if c.wait_share is not None:
        seen.append(f"waited for a core {c.wait_share:.0%} of the time")
    if c.steal_share is not None:
        if c.steal_share > STEAL_SHARE_LIMIT:
            problems.append(f"the hypervisor stole {c.steal_share:.0%} of the CPU time")
        else:
            seen.append(f"steal {c.steal_share:.0%}")
    seen.append(f"load {c.load_1min:.2f} on {c.cores} usable cores")
    main, again = _verdicts(rounds), _verdicts(rerun) if rerun else None
    if main is None or rounds_disagree(list(rounds)):
        problems.append("its rounds disagree on bf16 against fp32")
    elif again is not None:
        moved = [p for p in main if _moved(main[p], again[p])]
        if moved:
            problems.append(
                "a re-run disagreed ("
                + ", ".join(f"{p} bf16 {main[p]:.2f}x then {again[p]:.2f}x fp32's speed" for p in moved)
                + ")"
            )
        else:
            seen.append("a re-run agreed")
    timings: dict[str, list[float]] = {}
    for r in (*rounds, *rerun):
        for d, v in r.prefill_s:
            timings.setdefault(f"prefill {d}", []).append(v)
        for d, v in r.decode_s:
            timings.setdefault(f"decode {d}", []).append(v)
        for a, b, v in r.cast_s:
            timings.setdefault(f"cast {a}->{b}", []).append(v)
    plateau = time_slice_plateau(timings)
    if plateau is not None and (c.wait_share is None or c.wait_share > 0.02):
        problems.append(f"several timings sit at {plateau * 1e3:.1f} ms, a scheduler time slice")
    timed = f"timed in CPU time on one thread, it {', '.join(seen)}"
    return ("disturbed", f"{' and '.join(problems)}; {timed}") if problems else ("quiet", timed)


def wall_agreement(rounds: Sequence[ProbeRound], wall: Sequence[ProbeRound], threads: int) -> str:
    """Whether a wall-time round on the model's `threads` reaches the CPU-time rounds' verdict, in
    words for the record (a difference is recorded, not judged: the CPU-time verdict stands)."""
    main, check = _verdicts(rounds), _verdicts(wall)
    if main is None or check is None:
        return ""
    agree = all(_side(main[p]) == _side(check[p]) for p in main)
    figures = ", ".join(f"{p} bf16 {check[p]:.2f}x" for p in check)
    return f"wall time on {threads} threads {'agreed' if agree else 'DIFFERED'} ({figures} fp32's speed)"
