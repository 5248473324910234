"""Measurements that hold (issue 27): processes that start together measure once and agree; a probe
that other processes disturbed is recognised, not cached, and the plan says so truthfully; records
say when and how sure, expire, and are read only from a folder nobody else can write.

No test asserts a timing of this machine: measurements are made by hand, or counted."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from cudaload import CudaloadWarning, DtypeProbe, Machine, TuningRecord
from cudaload.capability import cache, detect, dtype_probe, dtype_timing, lock_file, measure_for
from cudaload.capability.dtype_probe import dtype_probe_for
from cudaload.capability.probe_confidence import Conditions, time_slice_plateau
from cudaload.capability.probe_record import DISTURBED_TTL_S, probe_path, read_probe
from cudaload.capability.tuning_records import read_tuning_records, write_tuning_record
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import ProbeRound, TunedVariant
from cudaload.facts.model import any_model
from cudaload.policy import Request, decide_plan

judge = getattr(dtype_timing.confidence_of, "__wrapped__", dtype_timing.confidence_of)  # the real one (conftest)
QUIET = Conditions(wait_share=0.01, steal_share=0.0, load_1min=0.3, cores=2, threads=2)
BF16_CKPT = replace(
    any_model(),
    checkpoint_dtype="bfloat16",
    hidden_size=1024,
    linear_shapes=(("down_proj", 3072, 1024, 28), ("gate_proj", 1024, 3072, 28), ("up_proj", 1024, 3072, 28)),
)  # a 0.6B shape: probed as F.linear 1024x2048


def one_round(bf16_speedup: float, cast: float = 1e-4) -> ProbeRound:
    prefill = {"float32": 0.010, "bfloat16": 0.010 / bf16_speedup, "float16": 0.010}
    decode = {"float32": 1e-3, "bfloat16": 1e-3 / bf16_speedup, "float16": 1e-3}
    return ProbeRound(
        tuple(prefill.items()), tuple(decode.items()), tuple((a, b, cast) for a in DTYPES for b in DTYPES if a != b)
    )


def stamp(minutes_ago: float = 0.0) -> str:
    when = datetime.now(timezone.utc) - timedelta(minutes=minutes_ago)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def probe_of(
    speedup: float, confidence: str = "quiet", conditions: str = "", bucket: tuple[int, int] = (1024, 2048)
) -> DtypeProbe:
    r = one_round(speedup)
    return DtypeProbe(
        *bucket, 128, r.prefill_s, r.decode_s, r.cast_s, 2, stamp(),
        rounds=(r,) * 5, confidence=confidence, conditions=conditions,
    )  # fmt: skip


@pytest.fixture
def fast_probe(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The probe boundary: measure_dtypes returns a quiet hand-made probe (bf16 half fp32's speed) at
    once; the buckets it was asked for are counted."""
    calls: list[tuple[int, int]] = []

    def measure(k: int, n: int) -> DtypeProbe:
        calls.append((k, n))
        return probe_of(0.5, conditions="quiet by hand", bucket=(k, n))

    monkeypatch.setattr(dtype_probe, "measure_dtypes", measure)
    return calls


# ---- how sure: the judgement ---------------------------------------------------------------------


def test_a_quiet_probe_whose_re_run_agrees_is_trusted() -> None:
    confidence, words = judge([one_round(0.25)] * 5, [one_round(0.26)] * 2, QUIET)
    assert confidence == "quiet"
    assert "waited for a core 1% of the time" in words and "a re-run agreed" in words and "load 0.30" in words
    assert words.startswith("timed in CPU time on one thread")


def test_waiting_for_a_core_is_said_but_does_not_disturb_a_cpu_time_probe() -> None:
    # Issue 37: the timings are CPU time, which waiting for a core does not add to; a busy machine
    # whose rounds and re-run agree still gets an answer.
    busy = replace(QUIET, wait_share=0.75, load_1min=5.2)
    confidence, words = judge([one_round(0.25)] * 5, [one_round(0.25)] * 2, busy)
    assert confidence == "quiet" and "waited for a core 75% of the time" in words and "load 5.20" in words


def test_the_disturbed_reason_gives_each_figure_once_in_one_sentence() -> None:
    # Issue 37: the reason read "other processes held the cores (waited 38% of the time) (its threads
    # waited for a core 38% of the time, ...".
    busy = replace(QUIET, wait_share=0.38, steal_share=0.0, load_1min=7.2)
    confidence, words = judge([one_round(s) for s in (1.5, 0.6, 1.4, 0.7, 1.5)], [], busy)
    assert confidence == "disturbed"
    assert words.count("38%") == 1 and words.count("waited") == 1 and words.count("(") == 0
    machine = Machine.simulated(dtype_probe=probe_of(0.5, "disturbed", words))
    reason = decide_plan(machine, BF16_CKPT, Request()).decision("dtype").reason
    assert reason.count("38%") == 1 and reason.count("not measured") == 1
    assert reason.startswith("not measured reliably: the CPU dtype probe was disturbed: its rounds disagree")


def test_the_probe_times_cpu_time_on_one_thread_and_gives_torch_its_threads_back() -> None:
    # Issue 37: one thread's CPU time (waiting for a core is not counted); the record is for the
    # model's thread count, which torch has again afterwards.
    import torch

    before = torch.get_num_threads()
    probe = dtype_timing.measure_dtypes(256, 256)
    assert torch.get_num_threads() == before and probe.threads == before
    assert "timed in CPU time on one thread, it " in probe.conditions  # after what disturbed it, if anything
    assert " s of CPU in " in probe.conditions  # what it cost, both clocks
    assert len(probe.rounds) >= dtype_timing.FLOOR_ROUNDS


def test_steal_makes_a_probe_disturbed() -> None:
    confidence, words = judge([one_round(0.25)] * 5, [], replace(QUIET, steal_share=0.2))
    assert confidence == "disturbed" and "hypervisor stole 20%" in words


def test_a_re_run_that_reaches_another_verdict_makes_a_probe_disturbed() -> None:
    confidence, words = judge([one_round(0.25)] * 5, [one_round(2.5)] * 2, QUIET)
    assert confidence == "disturbed" and "a re-run disagreed" in words


def test_a_re_run_that_only_crosses_the_tie_margins_edge_by_noise_agrees() -> None:
    # Issue 37, a busy native run: decode bf16 1.12x then 1.20x fp32's speed (a tie, then faster)
    # made the probe disturbed; a move that small is noise, a move past the margin is not.
    confidence, words = judge([one_round(1.12)] * 5, [one_round(1.20)] * 2, QUIET)
    assert confidence == "quiet" and "a re-run agreed" in words
    confidence, words = judge([one_round(1.12)] * 5, [one_round(1.40)] * 2, QUIET)
    assert confidence == "disturbed" and "decode bf16 1.12x then 1.40x" in words
    confidence, _ = judge([one_round(1.05)] * 5, [one_round(0.95)] * 2, QUIET)
    assert confidence == "quiet"  # a tie either way, 10% apart
    confidence, _ = judge([one_round(1.20)] * 5, [one_round(0.85)] * 2, QUIET)
    assert confidence == "disturbed"  # faster, then slower


def test_the_time_slice_plateau_of_the_issue_is_recognised() -> None:
    # The record of issue 27: bf16 decode 11.99 ms against fp32 0.42 ms, every cast 11.96-12.03 ms.
    casts = [11.96e-3, 11.98e-3, 12.0e-3, 12.01e-3, 12.02e-3, 12.03e-3]
    values = {"decode bfloat16": [11.99e-3] * 5, "decode float32": [0.42e-3] * 5}
    values.update({f"cast {i}": [c] * 5 for i, c in enumerate(casts)})
    plateau = time_slice_plateau(values)
    assert plateau is not None and abs(plateau - 12e-3) < 0.1e-3
    rounds = [
        ProbeRound(
            (("float32", 5e-3), ("bfloat16", 2e-3), ("float16", 9e-3)),
            (("float32", 0.42e-3), ("bfloat16", 11.99e-3), ("float16", 0.5e-3)),
            tuple((a, b, casts[i]) for i, (a, b) in enumerate((a, b) for a in DTYPES for b in DTYPES if a != b)),
        )
    ] * 5
    confidence, words = judge(rounds, rounds[:2], replace(QUIET, wait_share=0.1))
    assert confidence == "disturbed" and "a scheduler time slice" in words


def test_different_kernels_at_different_times_are_no_plateau() -> None:
    values = {"prefill float32": [4e-3], "prefill bfloat16": [17e-3], "decode float32": [0.4e-3], "cast a": [2.5e-3]}
    assert time_slice_plateau(values) is None
    # Two casts of the same size that genuinely take the same time are one kind, not a plateau.
    assert time_slice_plateau({"cast a": [3e-3], "cast b": [3.01e-3], "cast c": [3e-3], "cast d": [3e-3]}) is None


# ---- the policy: a disturbed or missing measurement is said as it is -------------------------------


def test_a_disturbed_probe_keeps_the_checkpoint_dtype_and_says_why() -> None:
    words = "a re-run disagreed (prefill bf16 1.20x then 0.50x fp32's speed)"
    machine = Machine.simulated(dtype_probe=probe_of(0.1, "disturbed", words))
    decision = decide_plan(machine, BF16_CKPT, Request()).decision("dtype")
    assert decision.value == "bfloat16"  # the probe's numbers (bf16 10x slower) are not believed
    assert decision.reason.startswith("not measured reliably: the CPU dtype probe was disturbed: " + words)
    assert "kept the checkpoint's bfloat16 until a quiet measurement" in decision.reason
    assert "cudaload probe" in decision.reason
    fp16_ckpt = replace(BF16_CKPT, checkpoint_dtype="float16")
    assert decide_plan(machine, fp16_ckpt, Request()).kwargs["dtype"] == "float32"  # never fp16 for you on CPU


def test_the_unmeasured_reason_is_the_true_one() -> None:
    simulated = decide_plan(Machine.simulated(), BF16_CKPT, Request()).decision("dtype").reason
    assert simulated.startswith("not measured here (a simulated machine, never measured)")
    off = replace(Machine.simulated(), source="none")
    assert (
        "(the probe is off (CUDALOAD_PROBE=0 or probe=False))"
        in decide_plan(off, BF16_CKPT, Request()).decision("dtype").reason
    )
    locked = replace(off, unmeasured="not measured: another process (pid 7) has held /x.lock for more than 60 s")
    reason = decide_plan(locked, BF16_CKPT, Request()).decision("dtype").reason
    assert reason.startswith("not measured: another process (pid 7)") and "kept the checkpoint's bfloat16" in reason
    for text in (simulated, reason):
        assert "probe off or a simulated machine" not in text


# ---- coordination: one measurement, however many processes ask ---------------------------------

_RACE = """
import json, sys, time
from dataclasses import replace
from cudaload.capability import detect, dtype_probe
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import DtypeProbe, ProbeRound

count = sys.argv[1]
def measure(k, n):  # the probe boundary: counts its calls and takes as long as a real probe
    with open(count, "a") as handle:
        handle.write("x")
    time.sleep(0.5)
    r = ProbeRound(tuple((d, 1e-3) for d in DTYPES), tuple((d, 1e-4) for d in DTYPES),
                   tuple((a, b, 1e-4) for a in DTYPES for b in DTYPES if a != b))
    return DtypeProbe(k, n, 128, r.prefill_s, r.decode_s, r.cast_s, 2,
                                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rounds=(r,) * 5)
dtype_probe.measure_dtypes = measure
machine = replace(detect(), threads=2)
sys.stdin.readline()  # start together
probe, why = dtype_probe.dtype_probe_for(machine, (256, 256))
print(json.dumps({"from_cache": probe.from_cache, "measured_at": probe.measured_at, "why": why}))
"""


def test_processes_that_start_together_measure_once_and_agree(tmp_path: Path) -> None:
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(sys.path)}
    count = tmp_path / "count"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(count)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [json.loads(p.communicate("go\n", timeout=120)[0]) for p in procs]
    assert count.read_text() == "x"  # one process measured
    assert sorted(o["from_cache"] for o in outs) == [False, True, True, True]
    assert len({o["measured_at"] for o in outs}) == 1 and all(o["why"] == "" for o in outs)


def test_a_lock_held_too_long_gives_a_true_reason_and_no_measurement(tmp_path: Path, monkeypatch) -> None:
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    machine = detect()
    threaded = replace(machine, threads=dtype_probe.torch_threads(env, machine.cpu.cores))
    lock = probe_path(threaded, (1024, 2048), env).with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    monkeypatch.setattr(lock_file, "LOCK_TIMEOUT_S", 0.2)
    monkeypatch.setattr(dtype_probe, "measure_dtypes", lambda *b: pytest.fail("measured beside the lock holder"))
    with open(lock, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        holder.write("4242")
        holder.flush()
        probe, why = dtype_probe_for(threaded, (1024, 2048), env)
        planned = measure_for(machine, BF16_CKPT, env=env)
    assert probe is None
    assert why.startswith(f"not measured: another process (pid 4242) has held {lock} for more than 0 s")
    assert planned.dtype_probe is None and planned.unmeasured == why
    decision = decide_plan(planned, BF16_CKPT, Request()).decision("dtype")
    assert decision.value == "bfloat16" and decision.reason.startswith(why)


def test_a_disturbed_probe_is_held_briefly_so_waiting_processes_agree_then_measured_again(
    tmp_path: Path, monkeypatch
) -> None:
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    machine = replace(detect(), threads=3)
    calls = []

    def disturbed(k: int, n: int) -> DtypeProbe:
        calls.append((k, n))
        return probe_of(0.5, "disturbed", "waited", bucket=(k, n))

    monkeypatch.setattr(dtype_probe, "measure_dtypes", disturbed)
    first, _ = dtype_probe_for(machine, (256, 512), env)
    again, _ = dtype_probe_for(machine, (256, 512), env)  # another process, after the lock: reads the hold
    assert first is not None and again is not None and len(calls) == 1
    assert again.from_cache and again.confidence == "disturbed" and again.prefill_s == first.prefill_s
    path = probe_path(machine, (256, 512), env)
    held = json.loads(path.read_text())
    path.write_text(json.dumps({**held, "measured_at": stamp(DISTURBED_TTL_S / 60 + 1)}))
    dtype_probe_for(machine, (256, 512), env)  # the hold expired: measured again
    assert len(calls) == 2
    # Whatever the record says, a disturbed probe's numbers never choose the dtype.
    planned = decide_plan(replace(Machine.simulated(), dtype_probe=again), BF16_CKPT, Request())
    assert planned.decision("dtype").reason.startswith("not measured reliably")


def test_an_unwritable_cache_measures_once_per_process(tmp_path: Path, fast_probe) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    calls = fast_probe
    env = {**os.environ, "CUDALOAD_CACHE": str(blocker)}
    machine = replace(detect(), threads=5)
    with pytest.warns(CudaloadWarning):
        dtype_probe_for(machine, (256, 256), env)
    dtype_probe_for(machine, (256, 256), env)
    assert len(calls) == 1


# ---- records: when, how sure, expiry, sanity --------------------------------------------------------


def _record(tmp_path: Path, **changes) -> tuple[dict, Path, Machine]:
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    machine = replace(detect(), threads=2)
    dtype_probe_for(machine, (256, 256), env)
    path = probe_path(machine, (256, 256), env)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}))
    return data, path, machine


def test_a_record_says_when_and_how_sure(tmp_path: Path) -> None:
    data, path, _ = _record(tmp_path)
    when = datetime.fromisoformat(data["measured_at"].replace("Z", "+00:00"))
    assert abs(datetime.now(timezone.utc) - when) < timedelta(minutes=10)
    assert data["confidence"] == "quiet" and "load" in data["conditions"] and data["threads"] == 2
    assert data["fingerprint"]["torch"] and data["fingerprint"]["cpu"]
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o077 == 0 and path.parent.parent.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "changes",
    [
        {"measured_at": (datetime.now(timezone.utc) - timedelta(days=40)).isoformat()},
        {"measured_at": (datetime.now(timezone.utc) + timedelta(days=2)).isoformat()},
        {"measured_at": "yesterday"},
        {"prefill_s": {"float32": 1e-3, "bfloat16": 99.0, "float16": 1e-3}},
        {"in_features": 512},
        {"rounds": []},
        {"confidence": "sure"},
        {"schema": 3},
    ],
)
def test_an_old_impossible_or_foreign_record_is_measured_again(tmp_path: Path, changes, fast_probe) -> None:
    _, path, machine = _record(tmp_path, **changes)
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    again, _ = dtype_probe_for(machine, (256, 256), env)
    assert again is not None and not again.from_cache
    assert json.loads(path.read_text())["measured_at"] == again.measured_at  # replaced


def test_a_tuning_record_with_zero_timings_is_skipped_and_equal_times_read_as_fast_as(tmp_path: Path) -> None:
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    zero = TunedVariant("float32", "sdpa", 0.0, 0.0, 0.0)
    today = datetime.now(timezone.utc).date().isoformat()
    fp = tuple(sorted(replace(detect(), threads=2).fingerprint().items()))
    write_tuning_record(TuningRecord("k", 512, 128, (zero,), fp, today), env)
    assert read_tuning_records("k", env) == ()
    old = TunedVariant("float32", "sdpa", 1.0, 1.0, 10.0)
    write_tuning_record(TuningRecord("k", 512, 128, (old,), fp, "2020-01-01"), env)
    assert read_tuning_records("k", env) == ()  # too old to trust
    from cudaload.policy.precision import _speed

    assert _speed(1.0, 1.0, "float32") == "as fast as float32" and _speed(1.0, 1.004) == "as fast"
    assert _speed(1.0, 2.0, "float32") == "2.0x faster than float32"


# ---- the cache folder ---------------------------------------------------------------------------


def test_a_tilde_in_the_cache_variable_is_the_home_folder(tmp_path: Path) -> None:
    assert cache.cache_dir({"CUDALOAD_CACHE": "~/x", "HOME": str(tmp_path)}) == tmp_path / "x"
    assert cache.cache_dir({"XDG_CACHE_HOME": "~/c", "HOME": str(tmp_path)}) == tmp_path / "c" / "cudaload"


def test_a_cache_folder_others_can_write_is_not_read(tmp_path: Path, monkeypatch, fast_probe) -> None:
    _, path, machine = _record(tmp_path)
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    assert read_probe(machine, (256, 256), env)[0] is not None
    root = tmp_path / "cache"
    root.chmod(0o777)
    monkeypatch.setattr(cache, "_refused", set())
    with pytest.warns(CudaloadWarning, match=f"does not read its cache in {root}: it is writable by group and others"):
        assert read_probe(machine, (256, 256), env)[0] is None
    assert read_probe(machine, (256, 256), env)[0] is None  # one warning per folder
    root.chmod(0o700)
    path.parent.chmod(0o720)
    with pytest.warns(CudaloadWarning, match="writable by group"):
        assert read_probe(machine, (256, 256), env)[0] is None


# ---- re-measuring -----------------------------------------------------------------------------


def test_cudaload_probe_measures_again_and_says_what_changed(tmp_path: Path, monkeypatch, capsys) -> None:
    from cudaload.cli import main

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    earlier, later = stamp(60), stamp(1)

    def measured(speedup: float, when: str, confidence: str = "quiet") -> None:
        made = replace(probe_of(speedup, confidence, "by hand"), measured_at=when)
        monkeypatch.setattr(dtype_probe, "measure_dtypes", lambda k, n: replace(made, in_features=k, out_features=n))

    measured(0.2, earlier)
    assert main(["probe"]) == 0
    first = capsys.readouterr().out
    assert "before: nothing recorded" in first and f"now:    {earlier}, quiet: bf16 at 0.20x at prefill" in first
    assert "dtype now planned: float32" in first
    measured(2.5, later)
    assert main(["probe"]) == 0
    second = capsys.readouterr().out
    assert f"before: {earlier}, quiet: bf16 at 0.20x" in second
    assert f"now:    {later}, quiet: bf16 at 2.50x" in second and "recorded in" in second
    assert "dtype now planned: bfloat16" in second
    measured(0.1, stamp(0), "disturbed")
    assert main(["doctor", "--remeasure"]) == 0
    third = capsys.readouterr().out
    assert f"before: {later}, quiet: bf16 at 2.50x" in third
    assert "not recorded: disturbed numbers do not replace the quiet record above" in third
    assert "cudaload doctor" in third


# ---- the docs (issue 31, item 7) ----------------------------------------------------------------

_SHOWS_A_CPU_DTYPE = re.compile(r"probed on this CPU|not measured here|not measured reliably|tie: bf16|measured here")


def test_every_page_that_shows_a_cpu_dtype_says_it_is_measured_and_how_to_measure_again() -> None:
    root = Path(__file__).resolve().parent.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    showing = [p for p in pages if _SHOWS_A_CPU_DTYPE.search(p.read_text())]
    assert len(showing) >= 5  # the check itself finds the pages
    missing = [p.name for p in showing if "cudaload probe" not in p.read_text() or "cpu-dtype.md" not in p.read_text()]
    assert not [m for m in missing if m != "cpu-dtype.md"], missing
    assert "## Measure again" in (root / "docs" / "cpu-dtype.md").read_text()
