"""What defining one record costs: `@frozen` against `dataclasses.dataclass(frozen=True)` (issue 50, item 2).

A script's first `load()` defines cudaload's records (`Plan`, `Machine`, `Decision`, ...) as it imports them;
`cudaload/frozen.py` exists because a frozen dataclass compiles six methods for each class. For each Python given
(`--python PATH`, repeatable; default: this interpreter), a fresh child defines the same 7-field class (the shape
of cudaload's records: a docstring, ints, strings, a tuple, optionals with defaults, a `default_factory`; string
annotations, as `from __future__ import annotations` makes them) `--classes` times with each way, interleaved in blocks:

- `dataclass`: `dataclasses.dataclass(frozen=True)`, what the records were;
- `frozen`: `cudaload.frozen.frozen`, what they are;
- `fields_only`: `dataclasses.dataclass(init=False, repr=False, eq=False)`, the part of `frozen` that is
  `dataclasses` reading the fields (it compiles nothing);
- `class_only`: the class statement alone, which every way pays.

Each way's figure is the median over the blocks of the mean milliseconds a class took (`time.perf_counter`),
with `time.process_time` beside it; the load average is recorded before and after. Never asserted in a test.

    python benchmarks/record_cost.py [--python /path/to/python3.12 ...] [--classes 400] [--json results]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
from __future__ import annotations

import dataclasses, json, platform, statistics, sys, time
from cudaload.frozen import frozen

CLASSES = int(sys.argv[1])
WAYS = {
    "dataclass": dataclasses.dataclass(frozen=True),
    "frozen": frozen,
    "fields_only": dataclasses.dataclass(init=False, repr=False, eq=False),
    "class_only": lambda cls: cls,
}


def define(way):
    class Record:
        '''A GPU as detect() reads it (a docstring, as every record of cudaload has: without one, dataclasses
        writes one from the signature).'''

        index: int
        name: str
        capability: tuple[int, int]
        total_memory: int
        free_memory: int | None = None
        uuid: str | None = None
        flags: frozenset[str] = dataclasses.field(default_factory=frozenset)

    return way(Record)


BLOCK = 20
blocks = max(3, CLASSES // BLOCK)
wall = {name: [] for name in WAYS}
cpu = {name: [] for name in WAYS}
for _ in range(2):  # warm-up: the first definitions import and cache what later ones reuse
    for way in WAYS.values():
        define(way)
for index in range(blocks):
    order = list(WAYS) if index % 2 == 0 else list(reversed(WAYS))
    for name in order:
        way = WAYS[name]
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(BLOCK):
            define(way)
        wall[name].append((time.perf_counter() - start) / BLOCK * 1e3)
        cpu[name].append((time.process_time() - start_cpu) / BLOCK * 1e3)
record = define(frozen)(index=0, name="a", capability=(8, 0), total_memory=1)
assert dataclasses.replace(record, index=1).index == 1  # still a dataclass: what the records rely on
print(json.dumps({
    "python": platform.python_version(),
    "blocks": blocks,
    "classes_per_block": BLOCK,
    "ms_per_class": {name: round(statistics.median(values), 4) for name, values in wall.items()},
    "cpu_ms_per_class": {name: round(statistics.median(values), 4) for name, values in cpu.items()},
}))
"""


def measure(python: str, classes: int) -> dict[str, Any]:
    """One fresh child of `python`: the median milliseconds a class takes each way."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([python, "-c", _CHILD, str(classes)], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{python} failed:\n{done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    ms = out["ms_per_class"]
    out["frozen_over_dataclass"] = round(ms["frozen"] / ms["dataclass"], 3)
    # beyond the class statement: what each decorator adds to it
    out["decorator_ms"] = {
        name: round(ms[name] - ms["class_only"], 4) for name in ("dataclass", "frozen", "fields_only")
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", action="append", help="an interpreter to measure (repeatable; default: this one)")
    parser.add_argument("--classes", type=int, default=400, help="classes defined each way, per interpreter")
    parser.add_argument("--json", default=None, help='"results" (benchmarks/results/<machine>/) or a path')
    args = parser.parse_args()
    before = os.getloadavg()
    runs = [measure(python, args.classes) for python in args.python or [sys.executable]]
    for run in runs:
        ms, added = run["ms_per_class"], run["decorator_ms"]
        print(
            f"Python {run['python']}: a class {ms['class_only']:.3f} ms, dataclass(frozen=True) "
            f"{ms['dataclass']:.3f} ms (+{added['dataclass']:.3f}), @frozen {ms['frozen']:.3f} ms "
            f"(+{added['frozen']:.3f}: reading the fields +{added['fields_only']:.3f}), "
            f"{run['frozen_over_dataclass']:.2f}x dataclass's"
        )
    fields = {
        "goal": "issue 50 item 2: what defining a record costs on the load path (no goal of its own)",
        "statistic": "median over interleaved blocks of the mean ms per class; one fresh child per interpreter",
        "load_average": {"before": [round(x, 2) for x in before], "after": [round(x, 2) for x in os.getloadavg()]},
        "runs": runs,
    }
    if args.json:
        sys.path.insert(0, str(ROOT / "src"))
        from cudaload.bench.environment import write_benchmark_record

        print("wrote", write_benchmark_record(args.json, ROOT / "benchmarks" / "results", "record-cost", fields))


if __name__ == "__main__":
    main()
