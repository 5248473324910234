"""Does the CPU dtype survive a fresh cache? Plan the tiny demo model N times, each in a new
process with an empty cudaload cache (so the dtype probe runs every time), and count the dtypes.

On a quiet machine every run should give the same dtype: a clear difference the same winner, a
small or noisy one a tie that keeps the checkpoint's dtype. On a loaded machine the answer can
move with the load (it is a measurement of that moment): the load average is printed beside it.
Not a test: tests never assert timings.

    python benchmarks/probe_stability.py [--runs 10] [--model PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

_PLAN = """
import json, sys, cudaload
plan = cudaload.plan(sys.argv[1])
print(json.dumps({"dtype": plan.dtype, "reason": plan.decision("dtype").reason,
                  "probe_s": plan.timings.get("probe")}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--model", help="a local model folder (default: the tiny demo model, built in a temp dir)")
    parser.add_argument(
        "--json",
        type=Path,
        help="write every run's dtype and reason here, with the machine and versions (default: print only); "
        "'results' files it as benchmarks/results/<machine>/<date>-probe-stability.json",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cudaload-probe-stability-"))
    model = args.model
    if model is None:
        from cudaload.demo import build_tiny_model

        model = str(build_tiny_model(work / "tiny"))
    runs = []
    for index in range(args.runs):
        env = {**os.environ, "CUDALOAD_CACHE": str(work / f"cache-{index}"), "HF_HUB_OFFLINE": "1"}
        load = os.getloadavg()[0]
        done = subprocess.run(
            [sys.executable, "-c", _PLAN, model], env=env, capture_output=True, text=True, check=True, timeout=600
        )
        run = {**json.loads(done.stdout.strip().splitlines()[-1]), "load_average_1min": round(load, 2)}
        runs.append(run)
        print(f"{index + 1:2d}. {run['dtype']:9s} (load {load:.2f}) {run['reason']}", flush=True)
    counts = Counter(run["dtype"] for run in runs)
    print("counts:", dict(counts), f"on {os.cpu_count()} cores")
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        fields = {"counts": counts, "runs": runs}
        out = write_benchmark_record(args.json, Path(__file__).parent / "results", "probe-stability", fields)
        print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
