"""Measure which dtype this CPU runs a model's matmuls fastest in, and remember it.

ISA flags do not predict it: four CPUs measured for this project gave four answers for bf16
against fp32 at prefill (AMX Xeon 4.3x faster, Xeon with AMX hidden 1.44x slower, AVX2 EPYC 4.1x
slower, Zen 4 with AVX512-BF16 2.35x faster). So the planner times `F.linear` here, in each dtype:

- prefill: a [PREFILL_TOKENS x in] @ [in x out] GEMM (compute-bound, as a prompt's forward is);
- decode: a [1 x in] @ [in x out] GEMV over a rotating set of weights larger than a CPU cache
  (memory-bound, as one generated token is);
- cast: converting one weight between dtypes (what loading a checkpoint in another dtype pays).

Every number is the fastest of several repetitions: another process can only add time (a call
preempted for a scheduler time slice takes milliseconds longer, never shorter). It measures in
rounds: each round times every dtype once, back to back, in an order that reverses from one round
to the next, so a noisy moment slows every dtype of a round alike. Every round is kept
(`DtypeProbe.rounds`) and each reported number is a median over them. After MIN_ROUNDS it stops
when the rounds agree on whether bf16 is faster or slower than fp32, at prefill and at decode
(`facts.spread`); while they disagree it measures more, up to MAX_ROUNDS or BUDGET_S.

Then it judges whether the numbers can be trusted (`confidence_of`): the time its threads spent
runnable but waiting for a core (the kernel's per-thread `schedstat`), the steal time (/proc/stat),
a quick re-run (RERUN_ROUNDS) that must give the same verdict, and the plateau a time slice leaves
(`time_slice_plateau`). A probe that waited or was stolen from, or whose re-run disagrees, is
"disturbed": it is tried again after a pause (the others may have been starting up), and if it
stays disturbed its numbers are never used: the plan keeps the checkpoint's dtype, saying why, and
the record holds that verdict for DISTURBED_TTL_S only, so processes waiting on the lock agree. The load
average is recorded but does not decide: it is a minute-long decaying average that misses processes
that just started (N processes starting together) and remembers ones that ended.

It runs with the torch CPU thread count the process uses, on the CPU only (never touches CUDA).
A quiet result is cached per machine fingerprint and shape bucket (`cache.py`) for MAX_AGE_DAYS;
processes that start together take turns through a lock file beside the record (`cache.exclusive`),
so one measures and the others read its record. `CUDALOAD_PROBE=0` (or `plan(..., probe=False)`)
turns it off; `cudaload probe` measures again (`remeasure`).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..facts.dtypes import DTYPES
from ..facts.machine import DtypeProbe, Machine, ProbeRound
from ..facts.spread import TIE_MARGIN, spread
from .cache import Positive, cache_dir, cache_key, exclusive, read_json, write_json

__all__ = [
    "PREFILL_TOKENS",
    "Conditions",
    "cached_dtype_probe",
    "confidence_of",
    "dtype_probe_for",
    "measure_dtypes",
    "probe_enabled",
    "probe_path",
    "read_probe",
    "remeasure",
    "shape_bucket",
    "time_slice_plateau",
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
WAIT_SHARE_LIMIT = 0.15
"""Share of its threads' time the probe may spend runnable but waiting for a core. Measured on the
2-core AVX2 EPYC (2026-12-05): 2 threads of F.linear waited 75-82% of the time while other processes
ran, so a threshold anywhere between "almost never" and that separates the cases."""
STEAL_SHARE_LIMIT = 0.05
"""Share of the CPU time the hypervisor may steal while measuring (a neighbour VM running)."""
PLATEAU_MIN_S = 2e-3
"""Time slices the Linux scheduler hands out are milliseconds long (3-24 ms with CFS/EEVDF defaults)."""
MAX_AGE_DAYS = 30
"""A quiet record is measured again after this long (a BIOS, kernel or microcode update changes
speeds without changing the fingerprint)."""
DISTURBED_TTL_S = 120.0
"""A disturbed result is recorded as such for this long, never as an answer: processes that waited
for the lock (the ranks of a launch, workers started together) then make the same unmeasured
choice at once, instead of each measuring the same load in turn (4 processes at load 15 on the
2-core EPYC: 115-172 s each, one past the lock's timeout) and possibly disagreeing. After it, the
next plan measures again."""
MAX_SANE_S = 10.0
"""No single probed call takes this long (the largest bucket's GEMM is ~0.5 GFLOP): a record that
says so is not believed."""
SCHEMA = 4  # 2: decode capped; 3: every round kept; 4: fastest repetitions, confidence, timestamp, expiry


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


# ---- how sure: the conditions while measuring ------------------------------------------------------------


@dataclass(frozen=True)
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
            with open(f"/proc/self/task/{task}/schedstat") as handle:
                total += int(handle.read().split()[1])
                seen = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total if seen else None


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(x) for x in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields)) if len(fields) == 8 else None


class _Watch:
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


def confidence_of(rounds: Sequence[ProbeRound], rerun: Sequence[ProbeRound], conditions: Conditions) -> tuple[str, str]:
    """("quiet" or "disturbed", what the probe saw in words) for a measurement.

    Disturbed: its threads waited for a core more than WAIT_SHARE_LIMIT of the time, the hypervisor
    stole more than STEAL_SHARE_LIMIT, the main rounds still disagree, the quick re-run reaches
    another verdict (bf16 faster / tie / slower, at prefill or decode), or the timings sit on a
    time-slice plateau while the threads did wait.
    """
    c = conditions
    seen = []
    problems = []
    if c.wait_share is not None:
        seen.append(f"its threads waited for a core {c.wait_share:.0%} of the time")
        if c.wait_share > WAIT_SHARE_LIMIT:
            problems.append(f"other processes held the cores (waited {c.wait_share:.0%} of the time)")
    if c.steal_share is not None:
        seen.append(f"steal {c.steal_share:.0%}")
        if c.steal_share > STEAL_SHARE_LIMIT:
            problems.append(f"the hypervisor stole {c.steal_share:.0%} of the CPU time")
    seen.append(f"load {c.load_1min:.2f} on {c.cores} usable cores, {c.threads} threads")
    main, again = _verdicts(rounds), _verdicts(rerun) if rerun else None
    if main is None or _disagree(list(rounds)):
        problems.append("its rounds disagree on bf16 against fp32")
    elif again is not None:
        moved = [p for p in main if _side(main[p]) != _side(again[p])]
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
    if problems:
        return "disturbed", "; ".join(problems) + f" ({', '.join(seen)})"
    return "quiet", ", ".join(seen)


# ---- measuring --------------------------------------------------------------------------------------------


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
            watch = _Watch(threads)
            measuring = time.perf_counter()
            rounds: list[ProbeRound] = []
            while len(rounds) < MAX_ROUNDS:
                if len(rounds) >= MIN_ROUNDS and not _disagree(rounds):
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
        measured_at=_now().isoformat(timespec="seconds").replace("+00:00", "Z"),
        cost_s=time.perf_counter() - started,
        rounds=tuple(rounds),
        confidence=confidence,
        conditions=conditions,
    )


def _now() -> datetime:
    return datetime.now(timezone.utc)


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
        "confidence": probe.confidence,
        "conditions": probe.conditions,
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
_CASTS = tuple[tuple[str, str, Positive], ...]
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
    "confidence": str,
    "conditions": str,
    "rounds": [{"prefill_s": _TIMES, "decode_s": _TIMES, "cast_s": _CASTS}],
}


def _measured_at(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def _stale(data: Mapping[str, Any], now: datetime) -> str | None:
    """Why a well-formed record must not be used any more (None: it may): an impossible time, a
    measurement from the future or older than its confidence allows."""
    when = _measured_at(data["measured_at"])
    if when is None:
        return f"its time {data['measured_at']!r} is not an ISO timestamp"
    if when > now + timedelta(minutes=5):
        return f"it claims to be measured at {data['measured_at']}, in the future"
    life = timedelta(days=MAX_AGE_DAYS) if data["confidence"] == "quiet" else timedelta(seconds=DISTURBED_TTL_S)
    if now - when > life:
        return f"it was measured at {data['measured_at']}, more than {_life(life)} ago"
    return None


def _life(span: timedelta) -> str:
    return f"{span.days} days" if span.days else f"{span.seconds // 60} minutes"


def _from_json(data: Mapping[str, Any], expected: Mapping[str, str]) -> DtypeProbe | None:
    """The cached probe, or None if the file is from another schema, machine or shape, or holds a
    number no probe could measure (`MAX_SANE_S`, the shape of another bucket, no rounds)."""
    if data["kind"] != "cpu-dtype-probe" or data["schema"] != SCHEMA or data["fingerprint"] != dict(expected):
        return None
    if not all(isinstance(data[key], int) for key in ("in_features", "out_features", "prefill_tokens", "threads")):
        return None
    if data["confidence"] not in ("quiet", "disturbed") or not data["rounds"]:
        return None
    bucket = f"{data['in_features']}x{data['out_features']}"
    if bucket != expected.get("bucket", bucket):
        return None
    numbers = [*data["prefill_s"].values(), *data["decode_s"].values(), *(row[2] for row in data["cast_s"])]
    for r in data["rounds"]:
        numbers += [*r["prefill_s"].values(), *r["decode_s"].values(), *(row[2] for row in r["cast_s"])]
    if max(numbers) > MAX_SANE_S:
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
        confidence=data["confidence"],
        conditions=data["conditions"],
    )


def _expected(machine: Machine, bucket: tuple[int, int]) -> dict[str, str]:
    return {**machine.fingerprint(), "bucket": f"{bucket[0]}x{bucket[1]}"}


def probe_path(machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None) -> Path:
    """The record of this machine's probe for `bucket` (its lock file is beside it, `.lock`)."""
    return cache_dir(env) / "probes" / f"cpu-dtype-{cache_key(_expected(machine, bucket))}.json"


def read_probe(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None, *, any_age: bool = False
) -> tuple[DtypeProbe | None, str]:
    """The cached probe for `bucket` on this machine, or None and why not ("" when there is none)."""
    expected = _expected(machine, bucket)
    path = probe_path(machine, bucket, env)
    data = read_json(path, _LAYOUT)
    if data is None:
        return None, ""
    probe = _from_json(data, expected)
    if probe is None:
        return None, f"the record {path} is for another machine, shape or format"
    why = None if any_age else _stale(data, _now())
    return (None, f"the record {path} is stale: {why}") if why else (probe, "")


_measured_here: dict[Path, DtypeProbe] = {}
"""Probes this process measured but did not write, by record path (an unwritable cache, a disturbed
measurement): the next plan() of the same process uses them instead of measuring again."""


def dtype_probe_for(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None, *, measure: bool = True
) -> tuple[DtypeProbe | None, str]:
    """This machine's probe for `bucket`, and why there is none (or "").

    Read from the cache when a record is there (a disturbed one for DISTURBED_TTL_S: the policy
    does not use its numbers, but every process then makes the same choice); else, holding the
    record's lock so that processes starting together measure once, read again (another process may
    have just written it) and measure, and write the result back (the policy judges it by its
    confidence). When the lock cannot be had in time, nothing is measured and the reason says why.
    """
    path = probe_path(machine, bucket, env)

    def usable() -> DtypeProbe | None:
        cached, _ = read_probe(machine, bucket, env)
        return cached if cached is not None else _measured_here.get(path)

    found = usable()
    if found is not None or not measure:
        return found, ""
    with exclusive(path.with_suffix(".lock")) as refused:
        if refused is not None and "no lock file" not in refused:
            return None, f"not measured: {refused} (measuring beside it would time its load, not this CPU)"
        found = usable()
        if found is not None:
            return found, ""
        measured = replace(measure_dtypes(*bucket), fingerprint=tuple(sorted(_expected(machine, bucket).items())))
        written = write_json(path, _to_json(measured))
    if not written:
        _measured_here[path] = measured
    return measured, ""


def cached_dtype_probe(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None, *, measure: bool = True
) -> DtypeProbe | None:
    """`dtype_probe_for` without the reason: the probe, or None."""
    return dtype_probe_for(machine, bucket, env, measure=measure)[0]


def remeasure(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None
) -> tuple[DtypeProbe | None, DtypeProbe]:
    """Measure `bucket` again now, whatever is cached: (the record it replaces, if any, of any age;
    the new measurement). Holds the lock; a quiet result replaces the record, a disturbed one does
    not (the old record stays, and the caller says so)."""  # a disturbed hold it replaces, though
    path = probe_path(machine, bucket, env)
    with exclusive(path.with_suffix(".lock")):
        before, _ = read_probe(machine, bucket, env, any_age=True)
        after = replace(measure_dtypes(*bucket), fingerprint=tuple(sorted(_expected(machine, bucket).items())))
        replace_it = after.confidence == "quiet" or before is None or before.confidence != "quiet"
        written = replace_it and write_json(path, _to_json(after))
    if written:
        _measured_here.pop(path, None)
    else:
        _measured_here[path] = after
    return before, after
