"""Measure which dtype this CPU runs a model's matmuls fastest in, and remember it.

ISA flags do not predict it: four CPUs measured for this project gave four answers for bf16
against fp32 at prefill (AMX Xeon 4.3x faster, Xeon with AMX hidden 1.44x slower, AVX2 EPYC 4.1x
slower, Zen 4 with AVX512-BF16 2.35x faster). So the planner times `F.linear` here, in each dtype:

- prefill: a [PREFILL_TOKENS x in] @ [in x out] GEMM (compute-bound, as a prompt's forward is);
- decode: a [1 x in] @ [in x out] GEMV over a rotating set of weights larger than a CPU cache
  (memory-bound, as one generated token is);
- cast: converting one weight between dtypes (what loading a checkpoint in another dtype pays).

Repetitions are interleaved across dtypes and each number is a median, so a noisy moment slows
every dtype alike and one outlier cannot flip the answer. It runs with the torch CPU thread count
the process uses, on the CPU only (never touches CUDA), and takes a fraction of a second; the
result is cached per machine fingerprint and shape bucket (see `cache.py`), so a process pays it
once per machine. `CUDALOAD_PROBE=0` (or `plan(..., probe=False)`) turns it off.
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
from ..facts.machine import DtypeProbe, Machine
from .cache import cache_dir, cache_key, read_json, write_json

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
REPEATS = 3
BUDGET_S = 1.0
"""After the warm-up and one measured round, no further round starts past this many seconds."""
SCHEMA = 2  # 2: decode working set capped at MAX_COPIES weights


def _pow2(value: int) -> int:
    return 1 << max(0, round(math.log2(max(1, value))))


def shape_bucket(hidden_size: int | None, intermediate_size: int | None) -> tuple[int, int]:
    """(in, out) features of the probed weight: the model's hidden and MLP sizes rounded to powers
    of two and capped at 1024 x 2048, so every model of 1B parameters and up shares one bucket (and
    one probe) and the probe stays bounded in time."""
    k = min(1024, max(256, _pow2(hidden_size or 1024)))
    n = min(2048, max(k, _pow2(intermediate_size or 4 * k)))
    return k, n


def probe_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("CUDALOAD_PROBE", "1").strip().lower() not in ("0", "false", "no", "off")


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


def measure_dtypes(in_features: int, out_features: int) -> DtypeProbe:
    """Time F.linear in every dtype on this CPU now (no cache). Imports torch."""
    import torch
    import torch.nn.functional as F

    started = time.perf_counter()
    dtypes = {name: getattr(torch, name) for name in DTYPES}
    k, n = in_features, out_features
    copies = min(MAX_COPIES, max(1, math.ceil(DECODE_WORKING_SET / (4 * k * n))))
    with torch.inference_mode():
        generator = torch.Generator().manual_seed(0)
        base = torch.randn(n, k, generator=generator).mul_(0.02)
        # Distinct copies (not views) so the decode GEMVs stream from memory, not cache.
        weights = {name: [(base + 1e-3 * i).to(dtype) for i in range(copies)] for name, dtype in dtypes.items()}
        prompt = torch.randn(PREFILL_TOKENS, k, generator=generator)
        inputs = {name: (prompt.to(dtype), prompt[:1].to(dtype)) for name, dtype in dtypes.items()}
        prefill: dict[str, list[float]] = {name: [] for name in dtypes}
        decode: dict[str, list[float]] = {name: [] for name in dtypes}
        casts: dict[tuple[str, str], list[float]] = {(a, b): [] for a in dtypes for b in dtypes if a != b}
        for rep in range(REPEATS + 1):  # the first round warms up oneDNN/BLAS and is dropped
            if rep >= 2 and time.perf_counter() - started > BUDGET_S:
                break  # a loaded or slow machine: fewer rounds rather than a long stall
            for name in dtypes:
                x, token = inputs[name]
                w = weights[name][0]
                start = time.perf_counter()
                F.linear(x, w)
                prefill[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                for weight in weights[name]:
                    F.linear(token, weight)
                decode[name].append((time.perf_counter() - start) / copies)
            for source, target in casts:
                start = time.perf_counter()
                weights[source][rep % copies].to(dtypes[target])
                casts[(source, target)].append(time.perf_counter() - start)
        threads = torch.get_num_threads()

    def median(values: list[float]) -> float:
        return statistics.median(values[1:])  # every list has the warm-up and >= 1 measured round

    return DtypeProbe(
        in_features=k,
        out_features=n,
        prefill_tokens=PREFILL_TOKENS,
        prefill_s=tuple((name, median(v)) for name, v in prefill.items()),
        decode_s=tuple((name, median(v)) for name, v in decode.items()),
        cast_s=tuple((a, b, median(v)) for (a, b), v in casts.items()),
        threads=threads,
        measured_at=datetime.now(timezone.utc).date().isoformat(),
        cost_s=time.perf_counter() - started,
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
    }


def _from_json(data: Mapping[str, Any], expected: Mapping[str, str]) -> DtypeProbe | None:
    """The cached probe, or None if the file is from another schema, machine or shape, or malformed."""
    try:
        if data["kind"] != "cpu-dtype-probe" or data["schema"] != SCHEMA or data["fingerprint"] != dict(expected):
            return None
        return DtypeProbe(
            in_features=int(data["in_features"]),
            out_features=int(data["out_features"]),
            prefill_tokens=int(data["prefill_tokens"]),
            prefill_s=tuple((str(d), float(data["prefill_s"][d])) for d in DTYPES),
            decode_s=tuple((str(d), float(data["decode_s"][d])) for d in DTYPES),
            cast_s=tuple((str(a), str(b), float(s)) for a, b, s in data["cast_s"]),
            threads=int(data["threads"]),
            measured_at=str(data["measured_at"]),
            fingerprint=tuple(sorted(expected.items())),
            cost_s=0.0,
            from_cache=True,
        )
    except (KeyError, TypeError, ValueError):
        return None


def cached_dtype_probe(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None, *, measure: bool = True
) -> DtypeProbe | None:
    """This machine's probe for `bucket`: read from the cache when its fingerprint matches, else
    measured now and written back (a corrupt or foreign file is replaced); None when it is not
    cached and `measure` is False."""
    expected = {**machine.fingerprint(), "bucket": f"{bucket[0]}x{bucket[1]}"}
    path = cache_dir(env) / "probes" / f"cpu-dtype-{cache_key(expected)}.json"
    data = read_json(path)
    cached = _from_json(data, expected) if data is not None else None
    if cached is not None or not measure:
        return cached
    measured = replace(measure_dtypes(*bucket), fingerprint=tuple(sorted(expected.items())))
    write_json(path, _to_json(measured))
    return measured
