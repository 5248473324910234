"""Values as JSON that reads back exactly: a stored Plan (planner/plan_store.py) and the key it is stored under.

`Plan.to_json()` is the plan's view for people and tools: a tuple is written as a list, `max_memory`'s GPU indices
as strings, and the sections that are not part of the plan's value (its generation fallbacks, its tokenizer) are left
out. A plan read back from it is another plan. Here every value keeps its type: a tuple, a frozenset, a dict (its keys
of any JSON type, in order), a read-only dict and a record are each a one-key object naming what it is; a JSON object
is never a plain mapping. What has no exact JSON form (an object of yours passed through to from_pretrained, a NaN)
raises `NotExact`, and the caller does without.

Reading back builds only the records it is given by name (`decode`'s `records`), never an import: a file naming any
other is refused (`ValueError`), as is a layout that is not one `encode` writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from .decision import ReadOnlyDict

__all__ = ["NotExact", "decode", "encode"]


class NotExact(TypeError):
    """A value with no exact JSON form here (an object, a NaN, a mutable set): not stored, not keyed."""


_TUPLE, _FROZENSET, _DICT, _READ_ONLY, _RECORD = "tuple", "frozenset", "dict", "read-only dict", "record"


def encode(value: Any) -> Any:
    """`value` as JSON-ready data `decode` rebuilds exactly: None, bools, ints, strings, finite floats and lists as
    themselves; a tuple, a frozenset (its items in the order of their JSON text, whatever the hash seed), a dict and a
    `ReadOnlyDict` (key-value pairs in order) and a frozen record (by class name, its fields) each as a one-key object.
    NotExact for anything else."""
    if value is None or type(value) in (bool, int, str):  # exact types: an enum of either is not its value
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise NotExact(f"{value!r} has no JSON form")
        return value
    if type(value) is list:
        return [encode(item) for item in value]
    if type(value) is tuple:
        return {_TUPLE: [encode(item) for item in value]}
    if type(value) is frozenset:
        return {_FROZENSET: sorted((encode(item) for item in value), key=_text)}
    if type(value) in (dict, ReadOnlyDict):
        pairs = [[encode(key), encode(item)] for key, item in value.items()]
        return {_READ_ONLY if type(value) is ReadOnlyDict else _DICT: pairs}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {_RECORD: [type(value).__qualname__, fields]}
    raise NotExact(f"{type(value).__module__}.{type(value).__qualname__} has no exact JSON form")


def _text(encoded: Any) -> str:
    return json.dumps(encoded, sort_keys=True)


def decode(data: Any, records: Mapping[str, type]) -> Any:
    """The value `encode` wrote as `data`, its records built from `records` (class name -> class) only.
    ValueError for a layout `encode` does not write or a record not in `records`; what a record's own
    constructor raises (TypeError, ValueError) for fields it refuses."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(item, records) for item in data]
    if not isinstance(data, dict) or len(data) != 1:
        raise ValueError(f"not a value encode() writes: {_text(data)[:80]}")
    ((kind, body),) = data.items()
    if kind == _TUPLE and isinstance(body, list):
        return tuple(decode(item, records) for item in body)
    if kind == _FROZENSET and isinstance(body, list):
        return frozenset(decode(item, records) for item in body)
    if kind in (_DICT, _READ_ONLY) and isinstance(body, list) and all(_pair(p) for p in body):
        pairs = {decode(key, records): decode(item, records) for key, item in body}
        return ReadOnlyDict(pairs) if kind == _READ_ONLY else pairs
    if kind == _RECORD and isinstance(body, list) and len(body) == 2 and isinstance(body[1], dict):
        name, fields = body
        cls = records.get(name) if isinstance(name, str) else None
        if cls is None:
            raise ValueError(f"a record {name!r} is not one of {sorted(records)}")
        return cls(**{field: decode(item, records) for field, item in fields.items()})
    raise ValueError(f"not a value encode() writes: {_text(data)[:80]}")


def _pair(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2
