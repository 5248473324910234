"""The CPU dtype probe's record in cudaload's cache: its path per machine and shape bucket, its JSON
layout (checked field by field when read), and how long it may be used."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..facts.dtypes import DTYPES
from ..facts.machine import DtypeProbe, Machine, ProbeRound
from .cache import Positive, cache_dir, cache_key, read_json

__all__ = ["DISTURBED_TTL_S", "MAX_AGE_DAYS", "expected_fingerprint", "probe_path", "probe_to_json", "read_probe"]

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
SCHEMA = 6  # 2: decode capped; 3: every round kept; 4: fastest repetitions, confidence, timestamp, expiry;
# 5: CPU time of one thread, not wall time (a record of wall times is measured again);
# 6: decode includes a layer's share of one token's attention over the cache


def _now() -> datetime:
    return datetime.now(timezone.utc)


def probe_to_json(probe: DtypeProbe) -> dict[str, Any]:
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


def expected_fingerprint(machine: Machine, bucket: tuple[int, int]) -> dict[str, str]:
    return {**machine.fingerprint(), "bucket": f"{bucket[0]}x{bucket[1]}"}


def probe_path(machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None) -> Path:
    """The record of this machine's probe for `bucket` (its lock file is beside it, `.lock`)."""
    return cache_dir(env) / "probes" / f"cpu-dtype-{cache_key(expected_fingerprint(machine, bucket))}.json"


def read_probe(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None, *, any_age: bool = False
) -> tuple[DtypeProbe | None, str]:
    """The cached probe for `bucket` on this machine, or None and why not ("" when there is none)."""
    expected = expected_fingerprint(machine, bucket)
    path = probe_path(machine, bucket, env)
    data = read_json(path, _LAYOUT)
    if data is None:
        return None, ""
    probe = _from_json(data, expected)
    if probe is None:
        return None, f"the record {path} is for another machine, shape or format"
    why = None if any_age else _stale(data, _now())
    return (None, f"the record {path} is stale: {why}") if why else (probe, "")
