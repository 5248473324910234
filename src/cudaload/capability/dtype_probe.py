"""This CPU's dtype probe for a model's shape: read from its record, else measured once (under a lock) and kept.

The probe measures which dtype this CPU runs a model's matmuls fastest in.

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
(`DtypeProbe.rounds`) and each reported number is a median over them. From FLOOR_ROUNDS it stops when
every round gives the same verdict clear of the tie margin (`rounds_settled`: more rounds could not change
it), after MIN_ROUNDS when the rounds agree on whether bf16 is faster or slower than fp32, at prefill and at
decode (`facts.spread`); while they disagree it measures more, up to MAX_ROUNDS or BUDGET_S.

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
processes that start together take turns through a lock file beside the record (`lock_file.exclusive`),
so one measures and the others read its record. `CUDALOAD_PROBE=0` (or `plan(..., probe=False)`)
turns it off; `cudaload probe` measures again (`remeasure`).

Its parts: `dtype_timing.py` measures, `probe_confidence.py` judges the conditions, `probe_record.py`
is the record in the cache; this module decides when to read, measure and write.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from ..errors import CudaloadWarning
from ..facts.machine import DtypeProbe, Machine
from .cache import write_json
from .probe_record import expected_fingerprint, probe_path, probe_to_json, read_probe

__all__ = [
    "cached_dtype_probe",
    "dtype_probe_for",
    "kept_in_memory_only",
    "probe_enabled",
    "remeasure",
    "shape_bucket",
    "torch_threads",
]


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


def torch_threads(
    env: Mapping[str, str] | None = None, cores: int | None = None, physical_cores: int | None = None
) -> int | None:
    """The CPU threads torch uses in this process, without importing torch when it is not loaded: torch's own
    answer once imported, else MKL_NUM_THREADS or OMP_NUM_THREADS (MKL's order), else the usable physical cores
    (torch's default, capability/cpu.py `physical_cores`: a hyperthreaded laptop's 8 CPUs are 4 threads), else
    the usable cores. The same number with torch imported or not, so the probe record one process writes is
    the one every later process reads (its fingerprint holds the threads the probe ran with)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return int(torch.get_num_threads())
    env = os.environ if env is None else env
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return physical_cores or cores


_measured_here: dict[Path, DtypeProbe] = {}


def kept_in_memory_only(path: Path) -> bool:
    """Whether the measurement for `path` lives in this process only: its record could not be written (an
    unwritable or untrusted cache), so what is said must not be "recorded in <path>"."""
    return path in _measured_here


"""Probes this process measured but did not write, by record path (an unwritable cache, a disturbed
measurement): the next plan() of the same process uses them instead of measuring again."""


def measure_dtypes(in_features: int, out_features: int) -> DtypeProbe:
    """Time each dtype's F.linear in_features x out_features now (dtype_timing.py `measure_dtypes`; the probe's
    boundary, which tests replace). The timing code is imported here, when measuring: reading a record needs none."""
    from .dtype_timing import measure_dtypes as measure

    return measure(in_features, out_features)


def _announce(bucket: tuple[int, int], model: str) -> None:
    """Say that the probe starts (it takes seconds; a blank terminal that long looks hung)."""
    from ..announce import announce
    from .dtype_timing import expected_cost_s  # the timing code: imported when measuring, not to read a record

    cost = expected_cost_s(*bucket)
    announce(
        "cudaload.probe",
        f"measuring this CPU's dtypes for {model or 'this model'}, ~{max(1, round(cost))} s of CPU "
        f"(F.linear {bucket[0]}x{bucket[1]}; once per machine and shape, then cached; CUDALOAD_PROBE=0 skips it)",
    )


def dtype_probe_for(
    machine: Machine,
    bucket: tuple[int, int],
    env: Mapping[str, str] | None = None,
    *,
    measure: bool = True,
    model: str = "",
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
    from .lock_file import exclusive  # measuring only: a process that reads the record takes no lock

    with exclusive(path.with_suffix(".lock")) as refused:
        if refused is not None and refused.kind == "held":
            return None, f"not measured: {refused} (measuring beside it would time its load, not this CPU)"
        if refused is not None and refused.kind == "not-a-lock":
            _warn_once(refused)  # measured without the lock: two processes may then both measure
        found = usable()
        if found is not None:
            return found, ""
        _announce(bucket, model)
        measured = replace(
            measure_dtypes(*bucket), fingerprint=tuple(sorted(expected_fingerprint(machine, bucket).items()))
        )
        written = write_json(path, probe_to_json(measured))
    if not written:
        _measured_here[path] = measured
    return measured, ""


def cached_dtype_probe(
    machine: Machine, bucket: tuple[int, int], env: Mapping[str, str] | None = None, *, measure: bool = True
) -> DtypeProbe | None:
    """`dtype_probe_for` without the reason: the probe, or None."""
    return dtype_probe_for(machine, bucket, env, measure=measure)[0]


def _warn_once(refused: str) -> None:
    if refused not in _warned:
        _warned.add(refused)
        warnings.warn(f"cudaload measured this CPU without its lock: {refused}.", CudaloadWarning, stacklevel=3)


_warned: set[str] = set()


def remeasure(
    machine: Machine,
    bucket: tuple[int, int],
    env: Mapping[str, str] | None = None,
    waiting: Callable[[str], None] | None = None,
    *,
    model: str = "",
) -> tuple[DtypeProbe | None, DtypeProbe]:
    """Measure `bucket` again now, whatever is cached: (the record it replaces, if any, of any age;
    the new measurement). Holds the lock (`waiting` is told when another process holds it); a quiet
    result replaces the record, a disturbed one does not (the old record stays, and the caller says
    so).

    Raises:
        SettingError: the lock path is not a lock file (a symbolic link, a FIFO: delete it), or
            another process held the lock past its timeout (measuring beside it would time its load).
    """  # a disturbed hold it replaces, though
    from .lock_file import exclusive

    path = probe_path(machine, bucket, env)
    with exclusive(path.with_suffix(".lock"), waiting=waiting) as refused:
        if refused is not None and refused.kind in ("held", "not-a-lock"):
            from ..errors import SettingError

            then = (
                "measuring beside it would time its load, not this CPU: run it again when that process is done"
                if refused.kind == "held"
                else "then run it again"
            )
            raise SettingError(f"cudaload probe did not measure: {refused}; {then}.")
        before, _ = read_probe(machine, bucket, env, any_age=True)
        _announce(bucket, model)
        after = replace(
            measure_dtypes(*bucket), fingerprint=tuple(sorted(expected_fingerprint(machine, bucket).items()))
        )
        replace_it = after.confidence == "quiet" or before is None or before.confidence != "quiet"
        written = replace_it and write_json(path, probe_to_json(after))
    if written:
        _measured_here.pop(path, None)
    else:
        _measured_here[path] = after
    return before, after
