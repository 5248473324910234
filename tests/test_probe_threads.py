"""A probe record is read by every later process on the same machine, hyperthreaded ones included: its
fingerprint holds the threads the probe ran with, and a process tells torch's thread count the same way
whether it has imported torch or not (torch defaults to the physical cores, not `os.cpu_count()`)."""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from cudaload.capability import detect, measure_for
from cudaload.capability import dtype_probe as dtype_probe_module
from cudaload.capability.cpu import physical_cores
from cudaload.capability.dtype_probe import torch_threads
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import DtypeProbe, Machine
from cudaload.facts.measurements import ProbeRound
from cudaload.facts.model import reference_model


def _sysfs(root: Path, cores_of: list[tuple[int, int]]) -> Path:
    """A /sys/devices/system/cpu with one (package, core) per logical CPU."""
    for cpu, (package, core) in enumerate(cores_of):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    return root


def test_physical_cores_count_a_cores_hyperthreads_once(tmp_path: Path) -> None:
    # A 4-core laptop with 2 threads a core: CPUs 0-3 are one thread of each core, 4-7 the sibling threads.
    laptop = _sysfs(tmp_path / "laptop", [(0, c) for c in (0, 1, 2, 3, 0, 1, 2, 3)])
    assert physical_cores(range(8), laptop) == 4
    assert physical_cores([0, 4], laptop) == 1  # affinity on one core's two threads
    # Two sockets whose core ids repeat are still distinct cores.
    assert physical_cores(range(4), _sysfs(tmp_path / "two", [(0, 0), (0, 1), (1, 0), (1, 1)])) == 4
    assert physical_cores(range(9), laptop) is None  # a CPU without a topology: unknown, not guessed


def test_torch_threads_without_torch_is_what_torch_would_say(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert torch_threads({}, 8, 4) == 4  # torch's default: the physical cores
    assert torch_threads({}, 8, None) == 8  # topology unknown: the usable CPUs
    assert torch_threads({"OMP_NUM_THREADS": "3"}, 8, 4) == 3
    assert torch_threads({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "2"}, 8, 4) == 2  # MKL's own variable first
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(get_num_threads=lambda: 5))
    assert torch_threads({}, 8, 4) == 5  # imported: torch's own answer


def _hyperthreaded() -> Machine:
    """This machine as a 4-CPU, 2-core hyperthreaded one (torch's default: 2 threads)."""
    machine = detect()
    return replace(machine, cpu=replace(machine.cpu, cores=4, physical_cores=2))


def test_a_record_one_process_writes_is_read_by_the_next_on_a_hyperthreaded_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[int] = []

    def fake_measure(in_features: int, out_features: int) -> DtypeProbe:
        torch = sys.modules.get("torch")  # as measure_dtypes: it imports torch (default: 2 threads), then asks it
        threads = torch.get_num_threads() if torch is not None else 2
        measured.append(threads)
        timed = ProbeRound(
            prefill_s=tuple((d, 0.001 * (i + 1)) for i, d in enumerate(DTYPES)),
            decode_s=tuple((d, 1e-4 * (i + 1)) for i, d in enumerate(DTYPES)),
            cast_s=tuple((a, b, 1e-4) for a in DTYPES for b in DTYPES if a != b),
        )
        return DtypeProbe(
            in_features=in_features,
            out_features=out_features,
            prefill_tokens=128,
            prefill_s=timed.prefill_s,
            decode_s=timed.decode_s,
            cast_s=timed.cast_s,
            threads=threads,
            measured_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            rounds=(timed,),
        )

    monkeypatch.setattr(dtype_probe_module, "measure_dtypes", fake_measure)
    env = {"CUDALOAD_CACHE": str(tmp_path / "cache")}
    machine, facts = _hyperthreaded(), reference_model()
    # The first process has imported torch (it resolved the model class): torch says 2 threads.
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(get_num_threads=lambda: 2))
    first = measure_for(machine, facts, env=env).dtype_probe
    assert first is not None and not first.from_cache and measured == [2]
    assert dict(first.fingerprint)["threads"] == "2" and first.threads == 2  # the threads it ran with
    # Every later process, torch imported or not (a cached plan never imports it), reads that record.
    monkeypatch.delitem(sys.modules, "torch")
    later = measure_for(machine, facts, env=env).dtype_probe
    assert later is not None and later.from_cache and measured == [2]  # before: measured again, with 4
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(get_num_threads=lambda: 2))
    again = measure_for(machine, facts, env=env).dtype_probe
    assert again is not None and again.from_cache and measured == [2]
    assert len(list((tmp_path / "cache" / "probes").glob("*.json"))) == 1
