"""Time `F.linear` in every dtype on this CPU now, in rounds, until the rounds agree (`measure_dtypes`).

Every timing is CPU time consumed, not wall time: the GEMMs run on one torch thread (the calling
one) and `time.thread_time` counts only the time that thread ran, so waiting for a core costs
nothing and a busy machine still gets an answer. Measured on the 2-core Zen 4 box (2026-12-06):
under a load average of 7-14 the wall time of a 128x2048 @ 2048x2048 matmul was 10x inflated while
the CPU time kept the fp32/bf16 ratio. Why one thread, not the model's N: torch's other intra-op
threads are not the calling thread, and the process clock (`time.process_time`) sums them only as
the scheduler ticks them (here a 2-thread GEMM read 7.99, 11.98, 15.99 ms: multiples of the 4 ms
tick) and counts the spin-waits of idle OpenMP workers. One thread measures the per-core speed of
each dtype; the verdict is their ratio, and N threads divide the work of both dtypes alike (on the
Zen 4 box 2 threads sped fp32 prefill up 1.9x, bf16 1.55x: bf16's lead shrank from 4.4x to 3.6x,
same verdict). On a machine quiet enough that wall time can be trusted, one more round on the
model's N threads in wall time cross-checks that, and the conditions record whether it agreed.

Decode is a GEMV over weights read from memory plus the attention of one token over the cache,
which the decode timing adds in the share a decoder layer of that width has (`attention_share`):
the GEMV alone misjudged bf16. Measured on the 2-core Zen 4 box (2026-12-06, one thread, CPU
time, SmolLM2-135M, `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`): the model's 211 decode
GEMVs ran 2.5x faster in bf16 (the probe's GEMV said 2.6x), but a whole decode step only 1.28x
(fp32 45.8 ms, bf16 35.9 ms), because SDPA of one token over a 576-token cache took 0.41 ms in
bf16 against 0.05 ms in fp32 (natively as well); with prefill 3.4x slower in bf16, fp32 wins
the 512+128-token workload by 1.27x, which the GEMV-only probe called a tie and kept bf16.

The GEMV part is memory-bound: a thread stalled on memory is
still running, so its CPU time holds the stall, and neighbours that share the memory bandwidth
slow both dtypes alike to first order (bf16 reads half the bytes of fp32 in either case); the
re-run rounds, which must reach the same verdict, catch a neighbour whose bandwidth use changed.

No cache and no lock here: `dtype_probe.py` reads and writes the records around it, and
`probe_confidence.py` judges whether the numbers can be trusted.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ..facts.dtypes import DTYPES
from ..facts.machine import DtypeProbe, ProbeRound
from .probe_confidence import Watch, confidence_of, rounds_disagree, rounds_settled, wall_agreement

__all__ = ["FLOOR_ROUNDS", "MAX_ROUNDS", "MIN_ROUNDS", "PREFILL_TOKENS", "expected_cost_s", "measure_dtypes"]

PREFILL_TOKENS = 128
"""Rows of the prefill GEMM: enough to be compute-bound like a real prompt, small enough to stay
fast where a dtype is emulated (bf16 on an AVX2 CPU runs ~5x slower than fp32 there)."""
DECODE_WORKING_SET = 64 * 2**20
"""fp32 bytes of weights the decode GEMVs rotate through: more than a typical L3 slice, so they
read memory as a real decode step does, not cache."""
MAX_COPIES = 32
"""Small buckets stop here: a small model's weights sit in cache when it decodes, too."""
MIN_ROUNDS = 5
"""Measured rounds (after a dropped warm-up round) before rounds that do not disagree may end the probe: with
five, one outlier round moves neither the median nor the middle half of the rounds. Rounds that are settled
(`rounds_settled`: every round on the same side of the tie margin, at prefill and decode) end it from
FLOOR_ROUNDS on: more rounds could not change the verdict."""
MAX_ROUNDS = 15
"""Rounds measured at most while they disagree."""
FLOOR_ROUNDS = 3
"""Rounds measured even past the budget (a loaded or slow machine): fewer cannot show a spread."""
BUDGET_S = 1.0
"""CPU seconds of measured rounds (the warm-up not counted) after which no further round starts."""
WALL_CAP_S = 12.0
"""Wall seconds of measured rounds after which no further round starts even within BUDGET_S: on a
machine with 2 CPU-bound neighbours per core one thread gets about a third of a core, so BUDGET_S
of CPU takes ~3 s of wall; past this cap the machine is too crowded to wait for."""
MIN_TIMED_S = 1e-3
"""A prefill GEMM is repeated within a round (at least twice, at most 16 times) until the repeats
span about this long, and the fastest counts: on a busy CPU, noise only ever adds time."""
DECODE_CONTEXT = 576
"""Cached tokens one decode step attends over: midway through the planner's default workload (a
512-token prompt and 128 new tokens)."""
HEAD_DIM = 64
"""Attention head width of the timed attention (most small and mid-sized models; heads = in / 64)."""
DECODE_SWEEPS = 2
"""Passes over the decode weights per round; each weight's fastest pass counts."""
CAST_REPEATS = 3
"""Repetitions of each cast per round; the fastest counts."""
RERUN_ROUNDS = 2
"""Rounds of the quick re-run that must reach the same verdict as the main rounds."""
ATTEMPTS = 2
"""Tries at a quiet measurement before giving up for this process."""
RETRY_PAUSE_S = 1.0
WALL_QUIET_WAIT = 0.05
"""Share of the time the measuring thread may have waited for a core for the wall-time cross-check
on the model's threads to run: above it, wall time measures the neighbours, not this CPU."""
"""Pause before another try: processes starting beside this one (importing torch) settle, or wait
on the lock, asleep."""


def expected_cost_s(in_features: int, out_features: int) -> float:
    """About how many CPU seconds a quiet measurement of this bucket takes (the announcement's ~N s):
    warm-ups, the rounds' budget and the re-run, from the 2-core Zen 4 box (2026-12-06: 1024x2048
    took 1.6-2.4 s of CPU, smaller buckets less)."""
    return 0.6 + BUDGET_S * (1 + RERUN_ROUNDS / MIN_ROUNDS) * min(1.0, in_features * out_features / (1024 * 2048))


def attention_share(in_features: int, out_features: int) -> float:
    """The timed weight's share of a decoder layer of that width (q, k, v, o projections of
    in x in, an MLP of three in x out): how much of a layer's per-token attention the decode timing
    carries, so that the policy's scaling by weights read scales the attention with it."""
    k, n = in_features, out_features
    return k * n / (4 * k * k + 3 * k * n)


def measure_dtypes(in_features: int, out_features: int, threads: int | None = None) -> DtypeProbe:
    """Time F.linear in every dtype on this CPU now (no cache), up to ATTEMPTS times until the
    measurement is quiet; the last try's numbers and confidence. `threads`: the torch threads the
    model will use (default: torch's count now), for the wall-time cross-check and the record; the
    timed rounds run on one. Imports torch."""
    import torch

    model_threads = threads or torch.get_num_threads()
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # see the module docstring: CPU time of the one thread doing the work
    try:
        return _measure(torch, in_features, out_features, model_threads)
    finally:
        torch.set_num_threads(before)


def _measure(torch: Any, k: int, n: int, model_threads: int) -> DtypeProbe:
    import torch.nn.functional as F

    started, started_cpu = time.perf_counter(), time.thread_time()
    dtypes = {name: getattr(torch, name) for name in DTYPES}
    copies = min(MAX_COPIES, max(1, math.ceil(DECODE_WORKING_SET / (4 * k * n))))
    pairs = [(a, b) for a in dtypes for b in dtypes if a != b]
    with torch.inference_mode():
        generator = torch.Generator().manual_seed(0)
        base = torch.randn(n, k, generator=generator).mul_(0.02)
        # Distinct copies (not views) so the decode GEMVs stream from memory, not cache.
        weights = {name: [(base + 1e-3 * i).to(dtype) for i in range(copies)] for name, dtype in dtypes.items()}
        prompt = torch.randn(PREFILL_TOKENS, k, generator=generator)
        inputs = {name: (prompt.to(dtype), prompt[:1].to(dtype)) for name, dtype in dtypes.items()}
        heads = max(1, k // HEAD_DIM)
        query = torch.randn(1, heads, 1, HEAD_DIM, generator=generator)
        cached = torch.randn(1, heads, DECODE_CONTEXT, HEAD_DIM, generator=generator)
        attention = {name: (query.to(d), cached.to(d), (cached * 0.5).to(d)) for name, d in dtypes.items()}
        share = attention_share(k, n)
        clock: Callable[[], float] = time.thread_time

        def fastest(call: Callable[[], object], repeats: int) -> float:
            best = math.inf
            for _ in range(repeats):
                start = clock()
                call()
                best = min(best, clock() - start)
            return max(best, 1e-9)  # noise only ever adds time; a zero would divide the ratios

        def one_round(index: int, repeats: int) -> ProbeRound:
            prefill: dict[str, float] = {}
            decode: dict[str, float] = {}
            order = list(dtypes) if index % 2 == 0 else list(reversed(dtypes))
            for name in order:
                x, token = inputs[name]
                w = weights[name][0]
                # fp16 is never planned on a CPU (its number only says what it would gain): one call a round,
                # the median over rounds against noise; it is the slowest GEMM on most CPUs (3.5x fp32 on Zen 4).
                prefill[name] = fastest(functools.partial(F.linear, x, w), 1 if name == "float16" else repeats)
                per_weight = [math.inf] * copies
                for _ in range(DECODE_SWEEPS):
                    for i, weight in enumerate(weights[name]):
                        start = clock()
                        F.linear(token, weight)
                        per_weight[i] = min(per_weight[i], clock() - start)
                # The median weight, not the fastest: the last weights read may still sit in cache.
                attend = fastest(functools.partial(F.scaled_dot_product_attention, *attention[name]), repeats)
                decode[name] = max(statistics.median(per_weight) + share * attend, 1e-9)
            casts: dict[tuple[str, str], float] = {}
            for source, target in pairs if index % 2 == 0 else reversed(pairs):
                weight = weights[source][index % copies]
                casts[(source, target)] = fastest(functools.partial(weight.to, dtypes[target]), CAST_REPEATS)
            return ProbeRound(
                prefill_s=tuple((d, prefill[d]) for d in dtypes),
                decode_s=tuple((d, decode[d]) for d in dtypes),
                cast_s=tuple((a, b, casts[(a, b)]) for a, b in pairs),
            )

        # A warm-up round, dropped (it warms up oneDNN/BLAS), then three fp32 prefill GEMMs size the repeats.
        one_round(1, 1)
        fp32 = fastest(functools.partial(F.linear, inputs["float32"][0], weights["float32"][0]), 3)
        repeats = max(2, min(16, math.ceil(MIN_TIMED_S / max(fp32, 1e-9))))

        def wall_check(watch: Watch) -> str:
            """The model's threads timed in wall time, one round, where the machine lets wall time
            be trusted: whether it reaches the CPU-time verdict (recorded, not judged)."""
            nonlocal clock
            waited = watch.conditions().wait_share
            if model_threads == 1 or waited is None or waited > WALL_QUIET_WAIT:
                return ""
            torch.set_num_threads(model_threads)
            clock = time.perf_counter
            try:
                return wall_agreement(rounds_so_far, [one_round(0, repeats)], model_threads)
            finally:
                clock = time.thread_time
                torch.set_num_threads(1)

        rounds_so_far: list[ProbeRound] = []

        def attempt() -> tuple[list[ProbeRound], str, str]:
            nonlocal rounds_so_far
            watch = Watch(1)
            measuring, measuring_cpu = time.perf_counter(), time.thread_time()
            rounds: list[ProbeRound] = []
            rounds_so_far = rounds
            while len(rounds) < MAX_ROUNDS:
                if len(rounds) >= MIN_ROUNDS and not rounds_disagree(rounds):
                    break
                if len(rounds) >= FLOOR_ROUNDS and rounds_settled(rounds):
                    break  # every round already gives the same verdict, clear of the tie margin's edges
                if len(rounds) >= FLOOR_ROUNDS and (
                    time.thread_time() - measuring_cpu > BUDGET_S or time.perf_counter() - measuring > WALL_CAP_S
                ):
                    break  # a slow machine (or one too crowded to wait for): fewer rounds, not a long stall
                rounds.append(one_round(len(rounds), repeats))
            rerun = [one_round(len(rounds) + i, repeats) for i in range(RERUN_ROUNDS)]
            conditions = watch.conditions()
            confidence, said = confidence_of(rounds, rerun, conditions)
            checked = wall_check(watch) if confidence == "quiet" else ""
            return rounds, confidence, f"{said}; {checked}" if checked else said

        for tries in range(1, ATTEMPTS + 1):
            rounds, confidence, conditions = attempt()
            if confidence == "quiet" or tries == ATTEMPTS:
                break
            time.sleep(RETRY_PAUSE_S)
    if tries > 1:
        conditions += f"; try {tries} of {ATTEMPTS}"
    cpu_s = time.thread_time() - started_cpu
    wall_s = time.perf_counter() - started
    conditions += f"; took {cpu_s:.1f} s of CPU in {wall_s:.1f} s"

    median = statistics.median
    return DtypeProbe(
        in_features=k,
        out_features=n,
        prefill_tokens=PREFILL_TOKENS,
        prefill_s=tuple((d, median(dict(r.prefill_s)[d] for r in rounds)) for d in dtypes),
        decode_s=tuple((d, median(dict(r.decode_s)[d] for r in rounds)) for d in dtypes),
        cast_s=tuple((a, b, median(r.cast_s[i][2] for r in rounds)) for i, (a, b) in enumerate(pairs)),
        threads=model_threads,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        cost_s=wall_s,
        rounds=tuple(rounds),
        confidence=confidence,
        conditions=conditions,
    )
