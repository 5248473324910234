"""Where a default `cudaload bench` spends its time: wall and CPU seconds per phase and per variant.

Issue 50 item 3 (the default bench within 180 s beside 4 CPU-bound neighbours on 2 cores): before cutting,
measure. This runs `cudaload.bench.run_bench()` (the default, as `cudaload bench` with no options runs it) in
this process, beside `--neighbours` CPU-bound processes (`python -c "while True: pass"`, started 2 s before,
killed after), with the bench's own steps wrapped to add up their wall seconds (`time.perf_counter`) and the
process's CPU seconds (`time.process_time`: the bench measures on one torch thread when the cores are busy):

- `load <variant>`: each from_pretrained of the load rounds (and of the resident copies for phase 2);
- `run <variant>`: each prefill + generate() round of phase 2;
- `phase ...`: phase 1 (load rounds), the resident loads, phase 2 (prefill/decode rounds);
- `gen ...`: the generation comparison's model load, each variant's warm-up and measured rounds, and all of it
  (the unpadded reference continuations are the total less the rounds);
- `run_bench total`; and the load average before and after, the threads, the progress lines (each with the
  process's wall and CPU seconds so far) and the verdict (`cudaload.bench.verdict`).

    python benchmarks/bench_phases.py [--neighbours 4] [--json results]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _timed(totals: dict[str, list[float]], key: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding its wall and CPU seconds (and one call) to `totals[key(*its arguments)]`."""

    def inner(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = totals[key(*args, **kwargs)]
            entry[0] += time.perf_counter() - wall
            entry[1] += time.process_time() - cpu
            entry[2] += 1

    return inner


def _instrument(totals: dict[str, list[float]]) -> None:
    from cudaload.bench import generate_bench, harness, inference

    measured: list[list[Any]] = []
    measure = harness.measure

    def keep(path: Any, variants: list[Any], *args: Any, **kwargs: Any) -> Any:
        measured.append(variants)
        return measure(path, variants, *args, **kwargs)

    def run_key(model: Any, *args: Any, **kwargs: Any) -> str:
        return next((f"run {v.name}" for v in measured[-1] if v.model is model), "run ?")

    inference.measure = keep  # type: ignore[assignment]
    harness._Loader.load = _timed(totals, lambda self, v: f"load {v.name}", harness._Loader.load)  # type: ignore[method-assign]
    harness._run = _timed(totals, run_key, harness._run)
    harness._time_loads = _timed(totals, lambda *a, **k: "phase load rounds", harness._time_loads)
    harness._load_resident = _timed(totals, lambda *a, **k: "phase resident loads", harness._load_resident)
    harness._time_runs = _timed(totals, lambda *a, **k: "phase prefill/decode rounds", harness._time_runs)

    def round_key(torch: Any, planned: Any, v: Any, r: int, *args: Any, **kwargs: Any) -> str:
        return f"gen {'warm-up' if r == 0 else 'measured'} {v.name} ({v.cache} cache, {v.padding_side} padding)"

    generate_bench._time_round = _timed(totals, round_key, generate_bench._time_round)
    generate_bench._compare_rounds = _timed(
        totals, lambda *a, **k: "gen total (reference continuations + rounds)", generate_bench._compare_rounds
    )
    generate_bench._PlannedModel.__init__ = _timed(  # type: ignore[method-assign]
        totals, lambda *a, **k: "gen model load", generate_bench._PlannedModel.__init__
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbours", type=int, default=4, help="CPU-bound processes beside the run")
    parser.add_argument("--json", help='write the record here ("results": benchmarks/results/<machine>/)')
    parser.add_argument("--note", default="", help="said in the record")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    _instrument(totals)
    from cudaload.bench import inference
    from cudaload.bench.verdict import verdict

    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.neighbours)]
    lines: list[str] = []
    try:
        if neighbours:
            time.sleep(2.0)  # the neighbours are computing before the bench looks at the cores
        before, wall, cpu = os.getloadavg(), time.perf_counter(), time.process_time()

        def log(line: str) -> None:
            lines.append(f"{time.perf_counter() - wall:6.1f}s wall {time.process_time() - cpu:5.1f}s cpu  {line}")
            print(lines[-1], file=sys.stderr, flush=True)

        result = inference.run_bench(log=log)
        totals["run_bench total"] = [time.perf_counter() - wall, time.process_time() - cpu, 1]
        after = os.getloadavg()
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
    fields = {
        "goal": "where a default cudaload bench spends its wall and CPU time beside CPU-bound neighbours (issue 50)",
        "neighbours": args.neighbours,
        "load_average_before": [round(x, 2) for x in before],
        "load_average_after": [round(x, 2) for x in after],
        "threads": result["workload"]["threads"],
        "threads_why": result["workload"].get("threads_why"),
        "seconds": {k: {"wall_s": round(w, 1), "cpu_s": round(c, 1), "calls": n} for k, (w, c, n) in totals.items()},
        "verdict": verdict(result),
        "progress": lines,
        "note": args.note,
        "result": result,
    }
    print(json.dumps({k: fields[k] for k in ("load_average_before", "load_average_after", "seconds", "verdict")}))
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        print("wrote", write_benchmark_record(args.json, ROOT / "benchmarks" / "results", "bench-phases", fields))


if __name__ == "__main__":
    main()
