"""cudaload's cache is read defensively: a record that parses but has a wrong type, a NaN, an
infinite or a negative number anywhere counts as missing (measured or read again, and replaced),
and a file that is not a small regular file (a FIFO, /dev/zero) is never read. Hostile records
are written into a test cache folder; every reader goes through `cache.read_json` with a layout."""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from cudaload.capability import detect, dtype_probe
from cudaload.capability.cache import MAX_READ_BYTES, Positive, conforms, decode, read_json, read_regular_file
from cudaload.capability.dtype_probe import cached_dtype_probe
from cudaload.capability.facts_cache import cached_facts, facts_cache_file
from cudaload.capability.model_config import read_model_facts
from cudaload.capability.tuning_records import read_tuning_records, write_tuning_record
from cudaload.facts.machine import TunedVariant, TuningRecord


@dataclass(frozen=True)
class Pair:
    name: str
    sizes: tuple[int, ...]
    scale: float | None = None


@pytest.mark.parametrize(
    ("value", "spec", "ok"),
    [
        (5, int, True),
        (-4, int, False),
        (True, int, False),  # JSON true is not a count
        (2.5, int, False),
        (3, float, True),
        (-4.5, float, False),  # the "est. -4.50 s" of issue 20
        (math.nan, float, False),
        (math.inf, float, False),
        (0.0, Positive, False),
        (1e-9, Positive, True),
        ("x", str, True),
        (5, str, False),
        (None, int | None, True),
        (5, tuple[str, ...], False),  # "linear_names": 5
        (["a", 1], tuple[str, ...], False),
        ([1, 2], tuple[int, int], True),
        ([1, 2, 3], tuple[int, int], False),
        ([1, 2], dict[str, int], False),  # a list where an object belongs
        ({"a": 1.5}, dict[str, float], True),
        ({"a": -1.5}, dict[str, float], False),
        ({"name": "q", "sizes": [1, 2], "scale": None}, Pair, True),
        ({"name": "q", "sizes": [1, 2]}, Pair, False),  # a missing field
        ({"name": "q", "sizes": [1, -2], "scale": None}, Pair, False),
        ({"k": 1, "rest": "ignored"}, {"k": int}, True),
        ({"rest": 1}, {"k": int}, False),
        ([{"k": 1}, {"k": "1"}], [{"k": int}], False),
    ],
)
def test_conforms_checks_every_field(value: Any, spec: Any, ok: bool) -> None:
    assert conforms(value, spec) is ok


def test_decode_builds_tuples_and_dataclasses() -> None:
    assert decode({"name": "q", "sizes": [1, 2], "scale": 2}, Pair) == Pair("q", (1, 2), 2.0)
    assert decode([["a", 1, 2, 3]], tuple[tuple[str, int, int, int], ...]) == (("a", 1, 2, 3),)


def test_the_layout_of_every_cached_record_has_typing_s_own_hints() -> None:
    """`_fields` evaluates annotation strings with `inspect.get_annotations` (cheaper than `typing.get_type_hints`):
    for every record a cache file holds, and every dataclass they nest, the hints are typing's, field by field."""
    import dataclasses
    import typing

    from cudaload.capability.cache import _fields
    from cudaload.facts.machine import DtypeProbe
    from cudaload.facts.model import ModelFacts

    seen: set[type] = set()

    def walk(spec: Any) -> None:
        if isinstance(spec, type) and dataclasses.is_dataclass(spec):
            if spec in seen:
                return
            seen.add(spec)
            hints = typing.get_type_hints(spec)
            assert _fields(spec) == {f.name: hints[f.name] for f in dataclasses.fields(spec)}, spec
            for hint in hints.values():
                walk(hint)
        for arg in typing.get_args(spec):
            walk(arg)

    for record in (ModelFacts, DtypeProbe, TuningRecord, Pair):
        walk(record)

    @dataclass(frozen=True)
    class Child(Pair):  # a subclass: its bases' fields first, its own annotation winning
        name: Any
        extra: int = 0

    walk(Child)
    assert list(_fields(Child)) == ["name", "sizes", "scale", "extra"] and _fields(Child)["name"] is Any
    assert len(seen) >= 8, sorted(c.__name__ for c in seen)  # the nested records were walked, not only the roots


def test_read_json_treats_non_json_numbers_and_wrong_layouts_as_missing(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    path.write_text('{"seconds": NaN}')  # Python's json reads it; a cache record may not hold it
    assert read_json(path) is None
    path.write_text('{"seconds": 1.5}')
    assert read_json(path, {"seconds": float}) == {"seconds": 1.5}
    assert read_json(path, {"seconds": str}) is None
    path.write_text('{"seconds": 1.5')  # truncated
    assert read_json(path) is None


# ---- the dtype probe cache --------------------------------------------------------------------


def _hostile_probe_records(good: dict[str, Any]) -> dict[str, Any]:
    rounds = good["rounds"]
    return {
        "nan time": {**good, "prefill_s": {**good["prefill_s"], "bfloat16": math.nan}},
        "negative time": {**good, "decode_s": {**good["decode_s"], "float32": -4.5}},
        "zero time": {**good, "prefill_s": {**good["prefill_s"], "float32": 0.0}},
        "infinite cast": {**good, "cast_s": [[a, b, math.inf] for a, b, _ in good["cast_s"]]},
        "string threads": {**good, "threads": "2"},
        "zero width": {**good, "in_features": 0},  # would divide by zero in the estimates
        "list for a dict": {**good, "prefill_s": list(good["prefill_s"].values())},
        "dict for a list": {**good, "rounds": {"0": rounds[0]}},
        "a number for rounds": {**good, "rounds": 5},
        "a bad round": {**good, "rounds": [*rounds[:-1], {**rounds[-1], "decode_s": {"float32": 1.0}}]},
        "a dtype missing": {**good, "decode_s": {"float32": 1e-3}},
    }


def test_a_hostile_probe_record_is_measured_again_and_replaced(tmp_path: Path, monkeypatch) -> None:
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    machine = replace(detect(), threads=2)
    measured = cached_dtype_probe(machine, (256, 256), env)
    assert measured is not None
    # Measured once for real; each re-measurement below returns that probe again (the probe boundary).
    monkeypatch.setattr(dtype_probe, "measure_dtypes", lambda *bucket: replace(measured, fingerprint=()))
    (path,) = (tmp_path / "cache" / "probes").glob("*.json")
    good = json.loads(path.read_text())
    assert cached_dtype_probe(machine, (256, 256), env).from_cache  # type: ignore[union-attr]
    hostile = {name: json.dumps(record) for name, record in _hostile_probe_records(good).items()}
    hostile["truncated"] = path.read_text()[: len(path.read_text()) // 2]
    for name, text in hostile.items():
        path.write_text(text)
        again = cached_dtype_probe(machine, (256, 256), env)
        assert again is not None and not again.from_cache, name
        assert all(s > 0 and math.isfinite(s) for _, s in again.prefill_s + again.decode_s), name
        reread = cached_dtype_probe(machine, (256, 256), env)  # the file was replaced by a good one
        assert reread is not None and reread.from_cache, name


def test_a_plan_with_a_hostile_probe_record_in_the_cache_comes_out_measured(
    tiny_models, tmp_path: Path, monkeypatch
) -> None:
    import cudaload

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    first = cudaload.plan(str(tiny_models["qwen3"]))
    (path,) = (tmp_path / "cache" / "probes").glob("*.json")
    good = json.loads(path.read_text())
    path.write_text(json.dumps({**good, "decode_s": {"float32": -4.5, "bfloat16": 1e-6, "float16": 1e-6}}))
    plan = cudaload.plan(str(tiny_models["qwen3"]))
    reason = plan.decision("dtype").reason
    assert "probed on this CPU" in reason and "(cached)" not in reason and "-4.5" not in reason
    assert plan.timings["probe"] > 0
    assert json.loads(path.read_text())["decode_s"]["float32"] > 0  # replaced
    assert "(cached)" not in first.decision("dtype").reason and first.timings["probe"] > 0  # measured too

    # A well-formed record is used as it is: one saying bf16 is 100x slower than fp32 here decides the
    # dtype. By hand (tiny Qwen3 = 73,728 projection weights + a 256 x 64 lm_head = 1.125 + 0.25 of the
    # 256 x 256 probed weight; load + 512-token prompt + 128 new tokens, checkpoint bf16, casts 1e-5 s):
    #   bf16: prefill 1e-2 x 512/128 x 1.125 + 1e-3 x 0.25 = 0.04525 + decode 127 x 1e-3 x 1.375 = 0.174625
    #         -> 0.219875 s
    #   fp32: 1e-4 x 4 x 1.125 + 1e-5 x 0.25 = 0.0004525 + 127 x 1e-5 x 1.375 = 0.00174625 + the cast of
    #         106,880 parameters (1.6309 weights) 1e-5 x 1.6309 -> 0.0022151 s
    # bf16 at 0.219875 / 0.0022151 = 99.26x fp32's time in every round, 0.22 s apart: fp32, although the
    # checkpoint is bf16.
    prefill = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}
    decode = {"float32": 1e-5, "bfloat16": 1e-3, "float16": 1e-3}
    casts = [[a, b, 1e-5] for a, b, _ in good["cast_s"]]
    rounds = [{"prefill_s": prefill, "decode_s": decode, "cast_s": casts}] * 5
    path.write_text(json.dumps({**good, "prefill_s": prefill, "decode_s": decode, "cast_s": casts, "rounds": rounds}))
    forced = cudaload.plan(str(tiny_models["qwen3"])).decision("dtype")
    assert forced.value == "float32" and "(cached)" in forced.reason
    assert forced.reason.startswith("bf16 99.26x slower than fp32 (99.26-99.26x over the middle of 5 rounds)")
    assert "est. 0.00 s" in forced.reason and "est. 0.22 s" in {r.value: r.reason for r in forced.rejected}["bfloat16"]


# ---- tuning records ---------------------------------------------------------------------------


def test_a_hostile_tuning_record_is_skipped(tmp_path: Path) -> None:
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    machine = replace(detect(), threads=2)
    record = TuningRecord(
        "shape",
        256,
        64,
        (TunedVariant("float32", "sdpa", 0.3, 0.45, 21.0),),
        tuple(sorted(machine.fingerprint().items())),
        "2026-12-04",
    )
    path = write_tuning_record(record, env)
    assert path is not None and len(read_tuning_records("shape", env)) == 1
    good = json.loads(path.read_text())
    variant = good["variants"][0]
    for bad in (
        {**good, "variants": [{**variant, "load_s": -4.5}]},
        {**good, "variants": [{**variant, "decode_tokens_per_s": math.nan}]},
        {**good, "variants": [{**variant, "dtype": 16}]},
        {**good, "variants": {"0": variant}},
        {**good, "prompt_tokens": "256"},
        {**good, "fingerprint": [["torch", "2.13.0"]]},
    ):
        path.write_text(json.dumps(bad))
        assert read_tuning_records("shape", env) == (), bad


# ---- the model-facts cache --------------------------------------------------------------------


def test_a_hostile_model_facts_record_is_read_again_and_replaced(tiny_models, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    folder = str(tiny_models["qwen3"])
    fresh = read_model_facts(folder)
    (path,) = (tmp_path / "cache" / "model-facts").glob("*.json")
    good = json.loads(path.read_text())
    assert cached_facts(path, folder) == fresh
    facts = good["facts"]
    for name, bad in {
        "linear_names is a number": {**good, "facts": {**facts, "linear_names": 5}},
        "negative parameters": {**good, "facts": {**facts, "parameters": -3}},
        "NaN softcap": {**good, "facts": {**facts, "softcap": math.nan}},
        "a string head_dim": {**good, "facts": {**facts, "head_dim": "16"}},
        "short linear shape": {**good, "facts": {**facts, "linear_shapes": [["q_proj", 64, 64]]}},
        "a list for the facts": {**good, "facts": list(facts.values())},
        "a number for quantization": {**good, "facts": {**facts, "quantization": 5}},
        "a field missing": {**good, "facts": {k: v for k, v in facts.items() if k != "vocab_size"}},
        "dtype_from_weights a string": {**good, "dtype_from_weights": "yes"},
    }.items():
        path.write_text(json.dumps(bad))
        assert cached_facts(path, folder) is None, name
        assert read_model_facts(folder) == fresh, name
        assert json.loads(path.read_text()) == json.loads(json.dumps({**good, "facts": asdict(fresh)})), name
    path.write_text(json.dumps(good)[:100])  # truncated
    assert read_model_facts(folder) == fresh and cached_facts(path, folder) == fresh


# ---- files that are not small regular files ---------------------------------------------------

_BOUNDED = 60  # seconds: a regression fails here instead of hanging the suite


def _in_a_subprocess(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=_BOUNDED
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_a_fifo_or_device_config_is_not_hashed_and_does_not_hang(tmp_path: Path) -> None:
    fifo, device, huge, fine = (tmp_path / name for name in ("fifo", "device", "huge", "fine"))
    for folder in (fifo, device, huge, fine):
        folder.mkdir()
    os.mkfifo(fifo / "config.json")  # no writer: a blocking open or read would wait forever
    (device / "config.json").symlink_to("/dev/zero")  # hashing would never end
    with open(huge / "config.json", "wb") as handle:
        handle.truncate(MAX_READ_BYTES + 1)
    (fine / "config.json").write_text('{"model_type": "qwen3"}')
    out = _in_a_subprocess(
        f"""
        from cudaload.capability.facts_cache import facts_cache_file
        for name in ("fifo", "device", "huge", "fine"):
            print(name, facts_cache_file({str(tmp_path)!r} + "/" + name, "AutoModelForCausalLM") is not None)
        """
    )
    assert out.splitlines() == ["fifo False", "device False", "huge False", "fine True"]
    assert facts_cache_file(str(fine), "AutoModelForCausalLM") is not None


def test_read_regular_file_reads_only_small_regular_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "small").write_bytes(b"12345")
    (tmp_path / "record.json").symlink_to(tmp_path / "fifo")  # a cache record that is a FIFO
    out = _in_a_subprocess(
        f"""
        from pathlib import Path
        from cudaload.capability.cache import read_json, read_regular_file
        root = Path({str(tmp_path)!r})
        print(read_regular_file(root / "fifo"), read_regular_file(root / "zero"), read_regular_file(root))
        print(read_regular_file(root / "small"), read_regular_file(root / "small", limit=4))
        print(read_json(root / "record.json"), read_regular_file(root / "missing"))
        """
    )
    assert out.splitlines() == ["None None None", "b'12345' None", "None None"]
    assert read_regular_file(tmp_path / "small") == b"12345"


def test_read_regular_says_why_it_refuses_and_can_refuse_a_link(tmp_path: Path) -> None:
    from cudaload.regular_file import read_regular, read_regular_or_none

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "small").write_bytes(b"12345")
    (tmp_path / "link").symlink_to(tmp_path / "small")
    reasons = {}
    for name, limit in (("fifo", 10), ("small", 4), ("missing", 10)):
        with pytest.raises(OSError) as refused:
            read_regular(tmp_path / name, limit)
        reasons[name] = refused.value.errno
    assert reasons == {"fifo": errno.EINVAL, "small": errno.EFBIG, "missing": errno.ENOENT}
    assert read_regular(tmp_path / "link", 5) == b"12345"
    assert read_regular_or_none(tmp_path / "link", 5, follow_symlinks=False) is None  # O_NOFOLLOW: ELOOP
