"""Do processes that start together agree on the CPU dtype, and how long does their first plan take?

For each N (1, 4, 8 by default) start N processes at the same moment on an empty cudaload cache
(gunicorn workers, pytest-xdist, notebooks opened together); each plans one model (config only,
nothing loaded) and reports its dtype, the reason, whether it measured or read the record, and how
long `plan()` took. The N=1 run, alone on its cache, is the reference the others are compared with.
The 1-minute load average, the usable cores and the CPU are recorded with every run: on a shared
machine the reference itself may be disturbed (the reason then says "not measured reliably").
Not a test: tests never assert timings.

    python benchmarks/probe_concurrency.py [--counts 1 4 8] [--json results]
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

_PLAN = """
import json, sys, time
sys.stdin.readline()  # every process is started and imported before any plans
started = time.perf_counter()
import cudaload
plan = cudaload.plan(sys.argv[1])
took = time.perf_counter() - started
reason = plan.decision("dtype").reason
probe_s = plan.timings.get("probe") or 0.0  # this process's own probe time: 0 when it read the record
print(json.dumps({"dtype": plan.dtype, "plan_s": round(took, 3), "probe_s": round(probe_s, 3),
                  "read_the_record": probe_s == 0, "reason": reason}))
"""


def _model(work: Path) -> str:
    """A 0.6B-shaped Qwen3 config saved in bf16 (hidden 1024, MLP 3072): no weights, plan() reads
    the config only. Its probe bucket, F.linear 1024x2048, is the one every model of 1B and up uses."""
    from transformers import Qwen3Config

    path = work / "qwen3-0.6b-shape"
    Qwen3Config(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151_936, dtype="bfloat16",
    ).save_pretrained(path)  # fmt: skip
    return str(path)


def _group(model: str, count: int, cache: Path) -> dict[str, object]:
    env = {**os.environ, "CUDALOAD_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    load = os.getloadavg()[0]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PLAN, model], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    time.sleep(0.2)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    runs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"a planning process failed with status {p.returncode}")
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {"processes": count, "load_average_1min_before": round(load, 2), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--model", help="a local model folder (default: a 0.6B-shaped Qwen3 config, bf16)")
    parser.add_argument(
        "--json", type=Path, help="write the runs here; 'results' files them under benchmarks/results/<machine>/"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cudaload-probe-concurrency-"))
    model = args.model or _model(work)
    groups = []
    reference = None
    for count in sorted(set(args.counts)):
        group = _group(model, count, work / f"cache-{count}")
        runs = group["runs"]
        assert isinstance(runs, list)
        if reference is None:
            reference = runs[0]["dtype"]  # the lone process (the smallest count, 1 by default)
        group["agree_with_the_lone_process"] = sum(r["dtype"] == reference for r in runs)
        group["plan_s_max"] = max(r["plan_s"] for r in runs)
        group["measured"] = sum(not r["read_the_record"] for r in runs)
        groups.append(group)
        print(
            f"{count} at once: {group['agree_with_the_lone_process']}/{count} agree with the lone process "
            f"({reference}); first plan() up to {group['plan_s_max']:.2f} s; {group['measured']} measured "
            f"(load {group['load_average_1min_before']:.2f} before)",
            flush=True,
        )
        for r in runs:
            print(f"    {r['dtype']:9s} {r['plan_s']:6.2f} s  {r['reason'][:150]}", flush=True)
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        fields = {
            "usable_cores": len(os.sched_getaffinity(0)),
            "model": "0.6B-shaped Qwen3 config, bf16" if args.model is None else args.model,
            "reference_dtype": reference,
            "groups": groups,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        }
        out = write_benchmark_record(args.json, Path(__file__).parent / "results", "probe-concurrency", fields)
        print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
