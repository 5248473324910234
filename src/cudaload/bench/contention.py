"""How much CPU this process gets right now, and the torch threads a default bench runs on because of it.

torch's CPU threads wait for each other at the end of every parallel op; when other processes hold the
cores, each op waits until every thread has been scheduled again. Measured on a 2-core AMD EPYC (Zen 4,
load average 10-11): SmolLM2-135M decoding 16 tokens in bfloat16 took 96 s wall (23 s CPU) on torch's
default 2 threads and 5.9 s wall (1.5 s CPU) on one. A default `cudaload bench` (no `--threads`) on a
machine whose cores are taken therefore measures on one thread and times its rounds in CPU seconds
(`meters.round_clock`), and its phases' time budgets count them too (`rounds.RoundBudget`); it says so and
records why. The plan's dtype probe times one thread in CPU time too (`capability`), so the comparison is the
one the plan was made on. A machine with its cores free keeps
torch's default. On taken cores the generation comparison generates fewer new tokens (`busy_generation`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .rounds import WALL_BOUND

__all__ = ["BUSY_OTHERS", "BUSY_SHARE", "bench_threads", "busy_generation", "core_share", "others_load"]

BUSY_SHARE = 0.75
"""Below this share of one core for a thread that only computes, the machine's cores are taken: another
runnable process (or more) per core beside this one."""
BUSY_OTHERS = 0.5
"""Above this many other runnable processes per core (1-minute load average), torch's threads would share
their cores with others for much of the run, whatever one look at the start found."""
SPIN_S = 0.2
"""Seconds of each look (two are taken, the larger share kept: one look can land in another process's burst)."""


def core_share(
    spin_s: float = SPIN_S,
    clock: Callable[[], float] = time.perf_counter,
    cpu: Callable[[], float] = time.thread_time,
) -> float:
    """The share of one core a computing thread of this process gets now: CPU seconds over wall seconds of a
    busy loop of `spin_s` (the larger of two looks). `clock`/`cpu`: wall and this thread's CPU seconds (tests
    pass fakes)."""
    shares = []
    for _ in range(2):
        wall, used = clock(), cpu()
        while clock() - wall < spin_s:
            pass
        shares.append((cpu() - used) / max(clock() - wall, 1e-9))
    return min(1.0, max(shares))


def others_load(cores: int, loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg) -> float:
    """Runnable processes besides this one per core, over the last minute (the 1-minute load average, less
    this process's own one): what a single look (`core_share`) misses when the others pause for a moment."""
    try:
        one_minute = loadavg()[0]
    except OSError:
        return 0.0
    return max(0.0, one_minute - 1.0) / max(1, cores)


def bench_threads(asked: int | None, default: int, share: float, others: float = 0.0) -> tuple[int | None, str | None]:
    """(the torch threads a bench runs on, None: torch's `default`; why, when that is not what torch would
    use). What the user asked for (`--threads`) is kept; otherwise one thread when the cores are taken and
    torch would use several: a computing thread got under `BUSY_SHARE` of a core now (`share`), or other
    processes kept more than `BUSY_OTHERS` of each core busy over the last minute (`others`, `others_load`).
    Measured on the 2-core Zen 4: a look at load 4 found a core free, and the full grid then ran on 2 threads
    for over 11 minutes as the load came back (one thread took 4.4 minutes at load 12)."""
    if asked is not None or default <= 1 or (share >= BUSY_SHARE and others <= BUSY_OTHERS):
        return asked, None
    seen = f"a computing thread got {share:.0%} of a core" + (
        f", other processes kept {others:.1f} per core busy over the last minute" if others > BUSY_OTHERS else ""
    )
    return 1, (
        f"the cores are busy ({seen}): measuring on 1 torch thread, not torch's {default}, which wait on each "
        f"other here, in CPU seconds, the rounds' time budget too (each phase within {WALL_BOUND:.0f}x its share in "
        f"wall seconds; `--threads {default}` measures on {default}, in wall seconds)"
    )


def busy_generation(new_tokens: int, busy: str | None, asked: bool) -> tuple[int, str | None]:
    """(the new tokens the generation comparison generates, why that is fewer than the run's `new_tokens`):
    half of them, at least 2 (a decode rate needs two stamps), when the cores are taken (`busy`: why the run
    measures on one thread, `bench_threads`) and `--new-tokens` was not given (`asked`). Measured on the 2-core
    Zen 4 beside 4 CPU-bound neighbours (load 1 -> 6.7): the comparison was 22 s of a default bench's 48 s of
    CPU (87 s of its 188 s wall), nearly all of it decode steps (the 4 prompts generated alone, as the padded
    batch's reference, then each variant's batch); the load/prefill/decode grid, which the verdict is made of,
    keeps its workload."""
    fewer = max(2, new_tokens // 2)
    if busy is None or asked or fewer >= new_tokens:
        return new_tokens, None
    return fewer, (
        f"generation: {fewer} new tokens, not {new_tokens}: the cores are busy (as the run measures on one "
        f"thread; `--new-tokens {new_tokens}` generates {new_tokens})"
    )
