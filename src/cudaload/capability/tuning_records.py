"""Tuning records: what `cudaload bench --save` measured for one model shape on one machine.

A record holds the full measured grid (dtype x attention: load seconds, prefill seconds, decode
tokens/s) with the machine fingerprint it was measured under, in cudaload's cache folder
(`tuning/<model key hash>-<fingerprint hash>.json`). The planner reads every record for a model's
shape; the policy uses one whose fingerprint matches this machine and says why it ignored the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..facts.machine import TunedVariant, TuningRecord
from .cache import Positive, cache_dir, cache_key, decode, listing, read_json, write_json

__all__ = ["read_tuning_records", "record_path", "write_tuning_record"]

SCHEMA = 1


def record_path(model_key: str, fingerprint: Mapping[str, str], env: Mapping[str, str] | None = None) -> Path:
    return cache_dir(env) / "tuning" / f"{cache_key(model_key)}-{cache_key(fingerprint)}.json"


def _to_json(record: TuningRecord) -> dict[str, Any]:
    return {
        "kind": "cudaload-tuning-record",
        "schema": SCHEMA,
        "model_key": record.model_key,
        "fingerprint": dict(record.fingerprint),
        "measured_at": record.measured_at,
        "prompt_tokens": record.prompt_tokens,
        "new_tokens": record.new_tokens,
        "variants": [
            {
                "dtype": v.dtype,
                "attn_implementation": v.attn_implementation,
                "load_s": v.load_s,
                "prefill_s": v.prefill_s,
                "decode_tokens_per_s": v.decode_tokens_per_s,
            }
            for v in record.variants
        ],
    }


# A record's layout, checked field by field before it is used (`cache.conforms`): a wrong type, a
# NaN, a negative or a zero time anywhere (no load, prefill or decode takes no time: a zero would
# win every comparison as "est. 0.00 s") makes the file count as missing: it is skipped, and the
# next `cudaload bench --save` of this model replaces it.
_VARIANT = {
    "dtype": str,
    "attn_implementation": str,
    "load_s": Positive,
    "prefill_s": Positive,
    "decode_tokens_per_s": Positive,
}
_LAYOUT = {
    "kind": str,
    "schema": int,
    "model_key": str,
    "fingerprint": dict[str, str],
    "measured_at": str,
    "prompt_tokens": int,
    "new_tokens": int,
    "variants": [_VARIANT],
}

MAX_AGE_DAYS = 180
"""A record older than this is skipped (a driver, BIOS or kernel update changes speeds without changing
the fingerprint): `cudaload bench --save` measures it again."""


def _from_json(data: Mapping[str, Any], path: Path) -> TuningRecord | None:
    if data["kind"] != "cudaload-tuning-record" or data["schema"] != SCHEMA:
        return None
    try:
        when = datetime.fromisoformat(data["measured_at"]).replace(tzinfo=None)
    except ValueError:
        return None
    if not timedelta(days=-1) <= datetime.now(timezone.utc).replace(tzinfo=None) - when <= timedelta(days=MAX_AGE_DAYS):
        return None  # from the future, or too old to trust
    return TuningRecord(
        model_key=data["model_key"],
        prompt_tokens=data["prompt_tokens"],
        new_tokens=data["new_tokens"],
        variants=tuple(decode(v, TunedVariant) for v in data["variants"]),
        fingerprint=tuple(sorted(data["fingerprint"].items())),
        measured_at=data["measured_at"],
        path=str(path),
    )


def write_tuning_record(record: TuningRecord, env: Mapping[str, str] | None = None) -> Path | None:
    """Store `record` in the cache (replacing the one for the same model shape and machine)."""
    path = record_path(record.model_key, dict(record.fingerprint), env)
    return path if write_json(path, _to_json(record)) else None


def read_tuning_records(model_key: str, env: Mapping[str, str] | None = None) -> tuple[TuningRecord, ...]:
    """Every readable record for this model shape, newest first; unreadable or malformed files (a
    wrong type, a NaN or negative number) are skipped."""
    paths = listing(cache_dir(env) / "tuning", f"{cache_key(model_key)}-*.json")
    records = []
    for path in paths:
        data = read_json(path, _LAYOUT)
        record = _from_json(data, path) if data is not None else None
        if record is not None and record.model_key == model_key:
            records.append(record)
    return tuple(sorted(records, key=lambda r: r.measured_at, reverse=True))
