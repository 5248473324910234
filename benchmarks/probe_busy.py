"""Does the CPU dtype probe give the quiet answer on a busy machine, and how long is a first plan there?

Issue 37's goals, measured rather than tested (tests never assert timings). For each CPU kind (this
CPU as it is, and held to AVX2 kernels by `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`, which
makes an avx512_bf16 CPU compute bf16 as an AVX2-only CPU does):

1. quiet: `--quiet-runs` processes, one after another, each on an empty cache, plan a
   SmolLM2-135M-shaped config (no weights; its probe bucket is F.linear 512x2048) with no
   neighbours of ours: the quiet verdict is their most common dtype;
2. busy: 2 CPU-bound neighbour processes per usable core are started (plain Python loops), and
   `--busy-runs` fresh-cache plans run one after another; each one's dtype is compared with the
   quiet verdict, and its whole process is timed (import, probe, plan: wall and CPU seconds);
3. waiters: still busy, 1 + `--waiters` processes plan at once on one empty cache: one measures,
   the others wait on its lock and read its record; each one's plan() wall seconds, and the
   seconds from the record being written (its mtime) to the waiter's answer (`after_record_s`:
   the part a waiter adds; the rest is the measurer's own time);
4. bench (`--bench`): still busy, `cudaload bench` with no arguments, its wall seconds and the
   longest silence between two lines of its progress on stderr.

Every run's reason is kept. `process_cpu_s` is the whole process (wait4), interpreter teardown
included (torch + transformers take ~1 s of CPU to tear down here, upstream's); `cpu_s_at_answer`
is the process's CPU when plan() returned. Goals (issue 37): busy verdict = quiet verdict in >= 9 of 10 on both
kinds; first plan <= 5 s CPU and <= 20 s wall busy; each waiter <= 3 s; a lone quiet plan <= 3 s;
`cudaload bench` <= 3 minutes on 2 busy cores, progress at least every 5 s.

    python benchmarks/probe_busy.py [--busy-runs 10] [--quiet-runs 3] [--waiters 8] [--json results]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PLAN = """
import glob, json, os, resource, sys, time
if len(sys.argv) > 2:  # a waiter: imported as an application would be, then every process plans at once
    import torch, transformers, cudaload
    sys.stdin.readline()
started = time.perf_counter()
import cudaload
plan = cudaload.plan(sys.argv[1])
took = time.perf_counter() - started
probe_s = plan.timings.get("probe") or 0.0
usage = resource.getrusage(resource.RUSAGE_SELF)
ratios, after_record_s = {}, None
for path in glob.glob(os.path.join(os.environ["CUDALOAD_CACHE"], "probes", "*.json")):
    after_record_s = round(time.time() - os.stat(path).st_mtime, 3)  # since the measurer wrote it
    record = json.load(open(path))
    ratios = {p: round(record[p]["float32"] / record[p]["bfloat16"], 3) for p in ("prefill_s", "decode_s")}
    ratios["confidence"] = record["confidence"]
print(json.dumps({"dtype": plan.dtype, "plan_s": round(took, 3), "read_the_record": probe_s == 0,
                  "after_record_s": after_record_s,
                  "cpu_s_at_answer": round(usage.ru_utime + usage.ru_stime, 3), "bf16_speed_vs_fp32": ratios,
                  "reason": plan.decision("dtype").reason}))
"""
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
KINDS = {"native": {}, "avx2-mode": AVX2}


def _model(work: Path) -> str:
    """SmolLM2-135M's shape (hidden 576, MLP 1536, 30 layers), bf16, config only."""
    from transformers import LlamaConfig

    path = work / "smollm2-135m-shape"
    LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49_152, tie_word_embeddings=True, dtype="bfloat16",
    ).save_pretrained(path)  # fmt: skip
    return str(path)


def _env(kind: dict[str, str], cache: Path) -> dict[str, str]:
    return {**os.environ, **kind, "CUDALOAD_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "CUDALOAD_QUIET": "1"}


def _one(model: str, kind: dict[str, str], cache: Path) -> dict[str, object]:
    """One process planning on an empty cache: its answer, wall and CPU seconds (the whole process)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _PLAN, model], env=_env(kind, cache), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"a planning process failed with status {status}")
    run = json.loads(out.decode().strip().splitlines()[-1])
    run.update(process_wall_s=round(wall, 3), process_cpu_s=round(usage.ru_utime + usage.ru_stime, 3))
    return dict(run)


def _waiters(model: str, kind: dict[str, str], cache: Path, count: int) -> list[dict[str, object]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PLAN, model, "wait"],
            env=_env(kind, cache),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    time.sleep(30)  # every process imports torch and transformers before they plan together
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    runs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return runs


def _bench(kind: dict[str, str], cache: Path) -> dict[str, object]:
    """`cudaload bench` with no arguments on `cache` (the user's, where SmolLM2 is converted already:
    the conversion is not what is timed): wall seconds and the longest silence on its stderr."""
    env = {**_env(kind, cache)}
    env.pop("CUDALOAD_QUIET", None)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cudaload", "bench"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None and proc.stdout is not None
    last, gaps = start, []
    for _ in proc.stderr:
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    table = proc.stdout.read()
    status = proc.wait()
    return {
        "wall_s": round(time.perf_counter() - start, 1),
        "longest_silence_s": round(max(gaps), 1) if gaps else None,
        "status": status,
        "table": table.splitlines()[:40],
    }


def _neighbours(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _summary(runs: list[dict[str, object]], quiet: str) -> dict[str, object]:
    return {
        "agree_with_quiet": sum(r["dtype"] == quiet for r in runs),
        "runs": len(runs),
        "process_wall_s_max": max(float(str(r["process_wall_s"])) for r in runs),
        "process_cpu_s_max": max(float(str(r["process_cpu_s"])) for r in runs),
        "cpu_s_at_answer_max": max((float(str(r.get("cpu_s_at_answer", "nan"))) for r in runs), default=None),
        "plan_s_median": sorted(float(str(r["plan_s"])) for r in runs)[len(runs) // 2],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-runs", type=int, default=10)
    parser.add_argument("--quiet-runs", type=int, default=3)
    parser.add_argument("--waiters", type=int, default=8)
    parser.add_argument("--bench", action="store_true", help="also time `cudaload bench` under the same load")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--json", type=Path, help="'results' files it under benchmarks/results/<machine>/")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cudaload-probe-busy-"))
    model = _model(work)
    cores = len(os.sched_getaffinity(0))
    kinds: dict[str, object] = {}
    for name in args.kinds:
        kind = KINDS[name]
        quiet_runs = [_one(model, kind, work / f"{name}-quiet-{i}") for i in range(args.quiet_runs)]
        verdict = collections.Counter(str(r["dtype"]) for r in quiet_runs).most_common(1)[0][0]
        print(f"{name}: quiet verdict {verdict}: {[r['dtype'] for r in quiet_runs]}", flush=True)
        neighbours = _neighbours(2 * cores)
        try:
            time.sleep(2)
            load_before = os.getloadavg()[0]
            busy_runs = []
            for i in range(args.busy_runs):
                busy_runs.append(_one(model, kind, work / f"{name}-busy-{i}"))
                r = busy_runs[-1]
                print(
                    f"  busy {i}: {r['dtype']} {r['process_wall_s']:.1f} s wall, {r['process_cpu_s']:.1f} s CPU "
                    f"(plan {r['plan_s']:.1f} s): {str(r['reason'])[:160]}",
                    flush=True,
                )
            waiters = _waiters(model, kind, work / f"{name}-waiters", 1 + args.waiters) if args.waiters else []
            bench = _bench(kind, Path.home() / ".cache" / "cudaload") if args.bench else None
            load_after = os.getloadavg()[0]
        finally:
            for n in neighbours:
                n.kill()
                n.wait()
        readers = [w for w in waiters if w["read_the_record"]]
        kinds[name] = {
            "environment": kind,
            "quiet_verdict": verdict,
            "quiet": _summary(quiet_runs, verdict),
            "busy": _summary(busy_runs, verdict),
            "waiters": {
                "processes": len(waiters),
                "measured": len(waiters) - len(readers),
                "agree_with_quiet": sum(w["dtype"] == verdict for w in waiters),
                "reader_plan_s_max": max((float(str(w["plan_s"])) for w in readers), default=None),
                "reader_after_record_s_max": max((float(str(w["after_record_s"])) for w in readers), default=None),
                "measurer_plan_s": [w["plan_s"] for w in waiters if not w["read_the_record"]],
            },
            "bench": bench,
            "neighbours": 2 * cores,
            "load_average_1min": [round(load_before, 2), round(load_after, 2)],
            "quiet_runs": quiet_runs,
            "busy_runs": busy_runs,
            "waiter_runs": waiters,
        }
        print(json.dumps({k: v for k, v in kinds[name].items() if not k.endswith("_runs")}), flush=True)
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        fields = {
            "usable_cores": cores,
            "model": "SmolLM2-135M-shaped Llama config, bf16 (probe bucket F.linear 512x2048)",
            "note": "the machine is shared: other engineers' processes ran too (load average before/after each kind)",
            "kinds": kinds,
        }
        out = write_benchmark_record(args.json, Path(__file__).parent / "results", "probe-busy", fields)
        print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
