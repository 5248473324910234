"""Time `F.linear` in every dtype on this CPU now, in rounds, until the rounds agree (`measure_dtypes`).

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

from ..facts.dtypes import DTYPES
from ..facts.machine import DtypeProbe, ProbeRound
from .probe_confidence import Watch, confidence_of, rounds_disagree

__all__ = ["FLOOR_ROUNDS", "MAX_ROUNDS", "MIN_ROUNDS", "PREFILL_TOKENS", "measure_dtypes"]

PREFILL_TOKENS = 128
"""Rows of the prefill GEMM: enough to be compute-bound like a real prompt, small enough to stay
fast where a dtype is emulated (bf16 on an AVX2 CPU runs ~5x slower than fp32 there)."""
DECODE_WORKING_SET = 64 * 2**20
"""fp32 bytes of weights the decode GEMVs rotate through: more than a typical L3 slice, so they
read memory as a real decode step does, not cache."""
MAX_COPIES = 32
"""Small buckets stop here: a small model's weights sit in cache when it decodes, too."""
MIN_ROUNDS = 5
"""Measured rounds (after a dropped warm-up round) before the rounds may be judged: with five, one
outlier round moves neither the median nor the middle half of the rounds."""
MAX_ROUNDS = 15
"""Rounds measured at most while they disagree."""
FLOOR_ROUNDS = 3
"""Rounds measured even past the budget (a loaded or slow machine): fewer cannot show a spread."""
BUDGET_S = 1.0
"""Seconds of measured rounds (the warm-up not counted) after which no further round starts."""
MIN_TIMED_S = 1e-3
"""A prefill GEMM is repeated within a round (at least twice, at most 16 times) until the repeats
span about this long, and the fastest counts: on a busy CPU, noise only ever adds time."""
DECODE_SWEEPS = 2
"""Passes over the decode weights per round; each weight's fastest pass counts."""
CAST_REPEATS = 3
"""Repetitions of each cast per round; the fastest counts."""
RERUN_ROUNDS = 2
"""Rounds of the quick re-run that must reach the same verdict as the main rounds."""
ATTEMPTS = 2
"""Tries at a quiet measurement before giving up for this process."""
RETRY_PAUSE_S = 1.0
"""Pause before another try: processes starting beside this one (importing torch) settle, or wait
on the lock, asleep."""


def measure_dtypes(in_features: int, out_features: int) -> DtypeProbe:
    """Time F.linear in every dtype on this CPU now (no cache), up to ATTEMPTS times until the
    measurement is quiet; the last try's numbers and confidence. Imports torch."""
    import torch
    import torch.nn.functional as F

    started = time.perf_counter()
    dtypes = {name: getattr(torch, name) for name in DTYPES}
    k, n = in_features, out_features
    copies = min(MAX_COPIES, max(1, math.ceil(DECODE_WORKING_SET / (4 * k * n))))
    pairs = [(a, b) for a in dtypes for b in dtypes if a != b]
    threads = torch.get_num_threads()
    with torch.inference_mode():
        generator = torch.Generator().manual_seed(0)
        base = torch.randn(n, k, generator=generator).mul_(0.02)
        # Distinct copies (not views) so the decode GEMVs stream from memory, not cache.
        weights = {name: [(base + 1e-3 * i).to(dtype) for i in range(copies)] for name, dtype in dtypes.items()}
        prompt = torch.randn(PREFILL_TOKENS, k, generator=generator)
        inputs = {name: (prompt.to(dtype), prompt[:1].to(dtype)) for name, dtype in dtypes.items()}

        def fastest(call: Callable[[], object], repeats: int) -> float:
            best = math.inf
            for _ in range(repeats):
                start = time.perf_counter()
                call()
                best = min(best, time.perf_counter() - start)
            return best  # noise only ever adds time

        def one_round(index: int, repeats: int) -> ProbeRound:
            prefill: dict[str, float] = {}
            decode: dict[str, float] = {}
            order = list(dtypes) if index % 2 == 0 else list(reversed(dtypes))
            for name in order:
                x, token = inputs[name]
                w = weights[name][0]
                prefill[name] = fastest(functools.partial(F.linear, x, w), repeats)
                per_weight = [math.inf] * copies
                for _ in range(DECODE_SWEEPS):
                    for i, weight in enumerate(weights[name]):
                        start = time.perf_counter()
                        F.linear(token, weight)
                        per_weight[i] = min(per_weight[i], time.perf_counter() - start)
                # The median weight, not the fastest: the last weights read may still sit in cache.
                decode[name] = statistics.median(per_weight)
            casts: dict[tuple[str, str], float] = {}
            for source, target in pairs if index % 2 == 0 else reversed(pairs):
                weight = weights[source][index % copies]
                casts[(source, target)] = fastest(functools.partial(weight.to, dtypes[target]), CAST_REPEATS)
            return ProbeRound(
                prefill_s=tuple((d, prefill[d]) for d in dtypes),
                decode_s=tuple((d, decode[d]) for d in dtypes),
                cast_s=tuple((a, b, casts[(a, b)]) for a, b in pairs),
            )

        # Two warm-up rounds, dropped: the first warms up oneDNN/BLAS, the second sizes the repeats.
        one_round(1, 1)
        fp32 = dict(one_round(0, 1).prefill_s)["float32"]
        repeats = max(2, min(16, math.ceil(MIN_TIMED_S / max(fp32, 1e-9))))

        def attempt() -> tuple[list[ProbeRound], str, str]:
            watch = Watch(threads)
            measuring = time.perf_counter()
            rounds: list[ProbeRound] = []
            while len(rounds) < MAX_ROUNDS:
                if len(rounds) >= MIN_ROUNDS and not rounds_disagree(rounds):
                    break
                if len(rounds) >= FLOOR_ROUNDS and time.perf_counter() - measuring > BUDGET_S:
                    break  # a loaded or slow machine: fewer rounds rather than a long stall
                rounds.append(one_round(len(rounds), repeats))
            # Already disturbed by the waits alone: no re-run can make it quiet, so none is spent.
            early = confidence_of(rounds, [], watch.conditions())
            if early[0] == "disturbed":
                return rounds, *early
            rerun = [one_round(len(rounds) + i, repeats) for i in range(RERUN_ROUNDS)]
            confidence, conditions = confidence_of(rounds, rerun, watch.conditions())
            return rounds, confidence, conditions

        for tries in range(1, ATTEMPTS + 1):
            rounds, confidence, conditions = attempt()
            if confidence == "quiet" or tries == ATTEMPTS:
                break
            time.sleep(RETRY_PAUSE_S)
    if tries > 1:
        conditions += f"; try {tries} of {ATTEMPTS}"

    median = statistics.median
    return DtypeProbe(
        in_features=k,
        out_features=n,
        prefill_tokens=PREFILL_TOKENS,
        prefill_s=tuple((d, median(dict(r.prefill_s)[d] for r in rounds)) for d in dtypes),
        decode_s=tuple((d, median(dict(r.decode_s)[d] for r in rounds)) for d in dtypes),
        cast_s=tuple((a, b, median(r.cast_s[i][2] for r in rounds)) for i, (a, b) in enumerate(pairs)),
        threads=threads,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        cost_s=time.perf_counter() - started,
        rounds=tuple(rounds),
        confidence=confidence,
        conditions=conditions,
    )
