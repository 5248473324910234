"""Measure which dtype this CPU runs a model's matmuls fastest in, and remember it.

ISA flags do not predict it: four CPUs measured for this project gave four answers for bf16
against fp32 at prefill (AMX Xeon 4.3x faster, Xeon with AMX hidden 1.44x slower, AVX2 EPYC 4.1x
slower, Zen 4 with AVX512-BF16 2.35x faster). So the planner times `F.linear` here, in each dtype:

- prefill: a [PREFILL_TOKENS x in] @ [in x out] GEMM (compute-bound, as a prompt's forward is);
- decode: a [1 x in] @ [in x out] GEMV over a rotating set of weights larger than a CPU cache
  (memory-bound, as one generated token is);
- cast: converting one weight between dtypes (what loading a checkpoint in another dtype pays).

It measures in rounds: each round times every dtype once, back to back, in an order that reverses
from one round to the next, so a noisy moment slows every dtype of a round alike. Every round is
kept (`DtypeProbe.rounds`) and each reported number is a median over them. After MIN_ROUNDS it
stops when the rounds agree on whether bf16 is faster or slower than fp32, at prefill and at
decode (the middle half of the per-round ratios on one side of 1, `facts.spread`); while they
disagree it measures more, up to MAX_ROUNDS or BUDGET_S. The policy then compares the dtypes
round by round for the user's workload and calls a disagreement or a small difference a tie
rather than trusting one noisy number.

It runs with the torch CPU thread count the process uses, on the CPU only (never touches CUDA),
and takes a fraction of a second; the result is cached per machine fingerprint and shape bucket
(see `cache.py`), so a process pays it once per machine. `CUDALOAD_PROBE=0` (or
`plan(..., probe=False)`) turns it off.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from ..facts.dtypes import DTYPES
from ..facts.machine import DtypeProbe, Machine, ProbeRound
from ..facts.spread import spread
from .cache import Positive, cache_dir, cache_key, read_json, write_json

__all__ = [
    "PREFILL_TOKENS",
    "cached_dtype_probe",
    "measure_dtypes",
    "probe_enabled",
    "shape_bucket",
    "torch_threads",
]

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
SCHEMA = 3  # 2: decode working set capped at MAX_COPIES weights; 3: every round kept


def _pow2(value: int) -> int:
    return 1 << max(0, round(math.log2(max(1, value))))


def shape_bucket(hidden_size: int | None, intermediate_size: int | None) -> tuple[int, int]:
    """(in, out) features of the probed weight: the model's hidden and MLP sizes rounded to powers
    of two and capped at 1024 x 2048, so every model of 1B parameters and up shares one bucket (and
    one probe) and the probe stays bounded in time."""
    k = min(1024, max(256, _pow2(hidden_size or 1024)))
    n = min(2048, max(k, _pow2(intermediate_size or 4 * k)))
    return k, n


_ON, _OFF = ("1", "true", "yes", "on", ""), ("0", "false", "no", "off")


def probe_enabled(env: Mapping[str, str] | None = None) -> bool:
    """CUDALOAD_PROBE: unset or 1/true/yes/on measures, 0/false/no/off does not.

    Raises:
        SettingError: any other value (a typo must not silently keep measuring).
    """
    env = os.environ if env is None else env
    value = env.get("CUDALOAD_PROBE", "1").strip().lower()
    if value not in _ON + _OFF:
        from ..errors import SettingError

        raise SettingError(
            f"CUDALOAD_PROBE={env['CUDALOAD_PROBE']!r}: use 1 (measure this CPU's dtype speeds, the default) or 0 "
            "(plan from the static table); also true/false, yes/no, on/off."
        )
    return value in _ON


def torch_threads(env: Mapping[str, str] | None = None, cores: int | None = None) -> int | None:
    """The CPU threads torch uses in this process, without importing torch when it is not loaded:
    torch's own answer once imported, else OMP_NUM_THREADS, else the usable cores (torch's default)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return int(torch.get_num_threads())
    env = os.environ if env is None else env
    value = env.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return cores


def _disagree(rounds: list[ProbeRound]) -> bool:
    """Whether the rounds disagree on bf16 against fp32, at prefill or at decode."""
    for phase in ("prefill_s", "decode_s"):
        ratios = [dict(getattr(r, phase))["float32"] / dict(getattr(r, phase))["bfloat16"] for r in rounds]
        summary = spread(ratios)
        if summary is None or summary.disagrees:
            return True
    return False


def measure_dtypes(in_features: int, out_features: int) -> DtypeProbe:
    """Time F.linear in every dtype on this CPU now (no cache). Imports torch."""
    import torch
    import torch.nn.functional as F

    started = time.perf_counter()
    dtypes = {name: getattr(torch, name) for name in DTYPES}
    k, n = in_features, out_features
    copies = min(MAX_COPIES, max(1, math.ceil(DECODE_WORKING_SET / (4 * k * n))))
    pairs = [(a, b) for a in dtypes for b in dtypes if a != b]
    with torch.inference_mode():
        generator = torch.Generator().manual_seed(0)
        base = torch.randn(n, k, generator=generator).mul_(0.02)
        # Distinct copies (not views) so the decode GEMVs stream from memory, not cache.
        weights = {name: [(base + 1e-3 * i).to(dtype) for i in range(copies)] for name, dtype in dtypes.items()}
        prompt = torch.randn(PREFILL_TOKENS, k, generator=generator)
        inputs = {name: (prompt.to(dtype), prompt[:1].to(dtype)) for name, dtype in dtypes.items()}

        def one_round(index: int, repeats: int) -> ProbeRound:
            prefill: dict[str, float] = {}
            decode: dict[str, float] = {}
            order = list(dtypes) if index % 2 == 0 else list(reversed(dtypes))
            for name in order:
                x, token = inputs[name]
                w = weights[name][0]
                calls = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    F.linear(x, w)
                    calls.append(time.perf_counter() - start)
                prefill[name] = min(calls)  # noise only ever adds time
                calls = []
                for weight in weights[name]:
                    start = time.perf_counter()
                    F.linear(token, weight)
                    calls.append(time.perf_counter() - start)
                decode[name] = statistics.median(calls)  # not the min: the last weights read may sit in cache
            casts: dict[tuple[str, str], float] = {}
            for source, target in pairs if index % 2 == 0 else reversed(pairs):
                start = time.perf_counter()
                weights[source][index % copies].to(dtypes[target])
                casts[(source, target)] = time.perf_counter() - start
            return ProbeRound(
                prefill_s=tuple((d, prefill[d]) for d in dtypes),
                decode_s=tuple((d, decode[d]) for d in dtypes),
                cast_s=tuple((a, b, casts[(a, b)]) for a, b in pairs),
            )

        # Two warm-up rounds, dropped: the first warms up oneDNN/BLAS, the second sizes the repeats.
        one_round(1, 1)
        fp32 = dict(one_round(0, 1).prefill_s)["float32"]
        repeats = max(2, min(16, math.ceil(MIN_TIMED_S / max(fp32, 1e-9))))
        measuring = time.perf_counter()
        rounds: list[ProbeRound] = []
        while len(rounds) < MAX_ROUNDS:
            if len(rounds) >= MIN_ROUNDS and not _disagree(rounds):
                break
            if len(rounds) >= FLOOR_ROUNDS and time.perf_counter() - measuring > BUDGET_S:
                break  # a loaded or slow machine: fewer rounds rather than a long stall
            rounds.append(one_round(len(rounds), repeats))
        threads = torch.get_num_threads()

    median = statistics.median
    return DtypeProbe(
        in_features=k,
        out_features=n,
        prefill_tokens=PREFILL_TOKENS,
        prefill_s=tuple((d, median(dict(r.prefill_s)[d] for r in rounds)) for d in dtypes),
        decode_s=tuple((d, median(dict(r.decode_s)[d] for r in rounds)) for d in dtypes),
        cast_s=tuple((a, b, median(r.cast_s[i][2] for r in rounds)) for i, (a, b) in enumerate(pairs)),
        threads=threads,
        measured_at=datetime.now(timezone.utc).date().isoformat(),
        cost_s=time.perf_counter() - started,
        rounds=tuple(rounds),
    )


def _to_json(probe: DtypeProbe) -> dict[str, Any]:
    return {
        "kind": "cpu-dtype-probe",
        "schema": SCHEMA,
        "fingerprint": dict(probe.fingerprint),
        "in_features": probe.in_features,
        "out_features": probe.out_features,
        "prefill_tokens": probe.prefill_tokens,
        "prefill_s": dict(probe.prefill_s),
        "decode_s": dict(probe.decode_s),
        "cast_s": [[a, b, s] for a, b, s in probe.cast_s],
        "threads": probe.threads,
        "measured_at": probe.measured_at,
        "cost_s": probe.cost_s,
        "rounds": [
            {
                "prefill_s": dict(r.prefill_s),
                "decode_s": dict(r.decode_s),
                "cast_s": [[a, b, s] for a, b, s in r.cast_s],
            }
            for r in probe.rounds
        ],
    }


# The cache file's layout, checked field by field before it is used (`cache.conforms`): a wrong
# type, a NaN or a negative time anywhere makes the file count as missing, so the probe runs again.
_TIMES = {"float32": Positive, "bfloat16": Positive, "float16": Positive}
_CASTS = tuple[tuple[str, str, float], ...]
_LAYOUT = {
    "kind": str,
    "schema": int,
    "fingerprint": dict[str, str],
    "in_features": Positive,
    "out_features": Positive,
    "prefill_tokens": Positive,
    "prefill_s": _TIMES,
    "decode_s": _TIMES,
    "cast_s": _CASTS,
    "threads": Positive,
    "measured_at": str,
    "rounds": [{"prefill_s": _TIMES, "decode_s": _TIMES, "cast_s": _CASTS}],
}


def _from_json(data: Mapping[str, Any], expected: Mapping[str, str]) -> DtypeProbe | None:
    """The cached probe, or None if the file is from another schema, machine or shape."""
    if data["kind"] != "cpu-dtype-probe" or data["schema"] != SCHEMA or data["fingerprint"] != dict(expected):
        return None
    if not all(isinstance(data[key], int) for key in ("in_features", "out_features", "prefill_tokens", "threads")):
        return None

    def times(mapping: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
        return tuple((d, float(mapping[d])) for d in DTYPES)

    def casts(rows: list[list[Any]]) -> tuple[tuple[str, str, float], ...]:
        return tuple((str(a), str(b), float(s)) for a, b, s in rows)

    return DtypeProbe(
        in_features=data["in_features"],
        out_features=data["out_features"],
        prefill_tokens=data["prefill_tokens"],
        prefill_s=times(data["prefill_s"]),
        decode_s=times(data["decode_s"]),
        cast_s=casts(data["cast_s"]),
        threads=data["threads"],
        measured_at=data["measured_at"],
        fingerprint=tuple(sorted(expected.items())),
        cost_s=0.0,
        from_cache=True,
        rounds=tuple(
            ProbeRound(prefill_s=times(r["prefill_s"]), decode_s=times(r["decode_s"]), cast_s=casts(r["cast_s"]))
            for r in data["rounds"]
        ),
    )


def cached_dtype_probe(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None, *, measure: bool = True
) -> DtypeProbe | None:
    """This machine's probe for `bucket`: read from the cache when its fingerprint matches, else
    measured now and written back (a corrupt, malformed or foreign file is replaced); None when it
    is not cached and `measure` is False."""
    expected = {**machine.fingerprint(), "bucket": f"{bucket[0]}x{bucket[1]}"}
    path = cache_dir(env) / "probes" / f"cpu-dtype-{cache_key(expected)}.json"
    data = read_json(path, _LAYOUT)
    cached = _from_json(data, expected) if data is not None else None
    if cached is not None or not measure:
        return cached
    measured = replace(measure_dtypes(*bucket), fingerprint=tuple(sorted(expected.items())))
    write_json(path, _to_json(measured))
    return measured
