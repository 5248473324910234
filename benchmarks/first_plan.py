"""The first plan in a fresh process, and a warm `cudaload plan` / `doctor` (issue 50, item 1).

Each number comes from a fresh interpreter (what a script pays), in CPU seconds (the child's every thread, user +
system, from `resource.getrusage(RUSAGE_CHILDREN)`: waiting for a core on a busy machine costs none) and wall
seconds, the median of `--repeats`, interleaved, with the load average before and after each child:

- `reference`: what from_pretrained pays before it reads a weight, and plan() pays too: import torch and
  transformers, read the config, resolve the model class (its modeling code);
- `first_plan`: `import cudaload; plan(MODEL)` on an empty measurement cache (the dtype probe measures), and
  inside it the probe's own CPU seconds (`measure_dtypes` timed with `time.process_time`);
- `own`: the reference's imports and class first, then `import cudaload; plan(MODEL)` on an empty cache, timed
  inside the child (`time.process_time`, every thread): cudaload's own share measured in one process, where
  `first_plan - reference` is the difference of two medians of 6-8 s whose runs spread by a second here;
- `plan_warm`, `doctor_warm`: `python -m cudaload plan MODEL` and `python -m cudaload doctor` on the cache the
  first plan and a first doctor (which probes the reference model's bucket) filled.

cudaload's own share of a first plan is `own` (and, as before, `first_plan - reference`). Each CPU kind:
native, and held to AVX2 (`ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`, `--kinds native,avx2`).

Goals (issue 50): first plan <= 2.5 s wall on a quiet 2-core machine, <= 1 s of it cudaload's own (probe
included); warm `cudaload plan` and `doctor` <= 0.2 s. Never asserted in a test.

    python benchmarks/first_plan.py [--model FOLDER] [--repeats 3] [--kinds native,avx2] [--json results]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = dict(  # SmolLM2-135M's config (its probe bucket and class), 2 of its 30 layers: planning reads no weight
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=2,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)
KINDS = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}

_CHILDREN = {
    "reference": """
import torch, transformers
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
config = AutoConfig.from_pretrained(MODEL)
MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
out = {}
""",
    "own": """
import time
import torch, transformers
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(MODEL))]
c, t = time.process_time(), time.perf_counter()
import cudaload
plan = cudaload.plan(MODEL)
out = {"own_cpu_s": time.process_time() - c, "own_wall_s": time.perf_counter() - t,
       "probe_wall_s": plan.timings.get("probe", 0.0)}
""",
    "first_plan": """
import time
import cudaload
from cudaload.capability import dtype_probe
measure, spent = dtype_probe.measure_dtypes, []
def timed(*args):
    c = time.process_time()
    try:
        return measure(*args)
    finally:
        spent.append(time.process_time() - c)
dtype_probe.measure_dtypes = timed
plan = cudaload.plan(MODEL)
out = {"probe_cpu_s": sum(spent), "probe_wall_s": plan.timings.get("probe", 0.0), "dtype": plan.dtype,
       "probe_conditions": plan.decision("dtype").reason[-300:]}
""",
}


def _child(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one fresh interpreter; its wall and CPU seconds (every thread), the load around it, what it printed."""
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({done.returncode}): {done.stderr[-800:]}")
    found = [line for line in done.stdout.splitlines() if line.startswith("FIRST-PLAN ")]
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        **(json.loads(found[0].removeprefix("FIRST-PLAN ")) if found else {}),
    }


def _code(kind: str, model: str) -> list[str]:
    return ["-c", f"MODEL = {model!r}\n" + _CHILDREN[kind] + "\nimport json; print('FIRST-PLAN ' + json.dumps(out))"]


def _stats(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 4), "runs": [round(v, 4) for v in values]}


def measure(model: str, kind: str, repeats: int) -> dict[str, Any]:
    base = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", *KINDS["avx2"])},
        **KINDS[kind],
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    steps = ("reference", "first_plan", "own", "plan_warm", "doctor_warm")
    runs: dict[str, list[dict[str, Any]]] = {step: [] for step in steps}
    with tempfile.TemporaryDirectory(prefix="cudaload-first-plan-") as tmp:
        _child(_code("reference", model), base)  # bytecode written, files in the page cache: not a first run
        for r in range(repeats):
            env = {**base, "CUDALOAD_CACHE": str(Path(tmp) / f"cache-{r}")}
            runs["reference"].append(_child(_code("reference", model), env))
            runs["first_plan"].append(_child(_code("first_plan", model), env))
            runs["own"].append(_child(_code("own", model), {**base, "CUDALOAD_CACHE": str(Path(tmp) / f"own-{r}")}))
            _child(["-m", "cudaload", "doctor"], env)  # its own probe (the reference model's bucket) recorded
            runs["plan_warm"].append(_child(["-m", "cudaload", "plan", model], env))
            runs["doctor_warm"].append(_child(["-m", "cudaload", "doctor"], env))
            print(kind, r + 1, {k: (round(v[-1]["wall_s"], 2), round(v[-1]["cpu_s"], 2)) for k, v in runs.items()})
    out: dict[str, Any] = {}
    for step, rows in runs.items():
        out[step] = {unit: _stats([row[unit] for row in rows]) for unit in ("wall_s", "cpu_s")}
        out[step]["load_1min"] = [row["load_1min"] for row in rows]
    out["probe_cpu_s"] = _stats([row["probe_cpu_s"] for row in runs["first_plan"]])
    out["probe_wall_s"] = _stats([row["probe_wall_s"] for row in runs["first_plan"]])
    out["dtype"] = [row["dtype"] for row in runs["first_plan"]]
    out["probe_conditions"] = runs["first_plan"][-1]["probe_conditions"]
    own = {u: out["first_plan"][u]["median"] - out["reference"][u]["median"] for u in ("wall_s", "cpu_s")}
    out["cudaload_own"] = {u: round(v, 4) for u, v in own.items()}
    out["cudaload_own_in_process"] = {
        unit: _stats([row[f"own_{unit}"] for row in runs["own"]]) for unit in ("cpu_s", "wall_s")
    }
    out["goals"] = {
        "first_plan_wall_s <= 2.5 (quiet)": out["first_plan"]["wall_s"]["median"] <= 2.5,
        "first_plan_cpu_s <= 2.5": out["first_plan"]["cpu_s"]["median"] <= 2.5,
        "cudaload_own_cpu_s <= 1.0": own["cpu_s"] <= 1.0,
        "cudaload_own_in_process_cpu_s <= 1.0": out["cudaload_own_in_process"]["cpu_s"]["median"] <= 1.0,
        "plan_warm_cpu_s <= 0.2": out["plan_warm"]["cpu_s"]["median"] <= 0.2,
        "doctor_warm_cpu_s <= 0.2": out["doctor_warm"]["cpu_s"]["median"] <= 0.2,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a local checkpoint (default: a SmolLM2-135M-shaped one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default="native,avx2")
    parser.add_argument("--tree", default=str(ROOT / "src"), help="the cudaload sources the children import")
    parser.add_argument("--json", default=None, help='"results" (benchmarks/results/<machine>/) or a path')
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(Path(args.tree).resolve())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cudaload-first-plan-model-") as tmp:
        model = args.model
        if model is None:
            import torch
            from transformers import AutoModelForCausalLM, LlamaConfig

            model = str(Path(tmp) / "smollm2-shaped")
            config = LlamaConfig(**SMOLLM2)  # type: ignore[arg-type]
            AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model)
        results = {kind: measure(model, kind, args.repeats) for kind in args.kinds.split(",")}
    fields = {
        "goal": "first plan <= 2.5 s wall quiet, <= 1 s of it cudaload's own; warm plan and doctor <= 0.2 s",
        "tree": args.tree,
        "model": args.model or "SmolLM2-135M-shaped (2 layers, bf16, random weights)",
        "repeats": args.repeats,
        "statistic": "median over fresh processes; CPU = user + system of every thread of the child",
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "kinds": results,
    }
    shown = ("cudaload_own", "cudaload_own_in_process", "goals", "probe_cpu_s")
    print(json.dumps({k: {s: v[s] for s in shown} for k, v in results.items()}))
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        print("wrote", write_benchmark_record(args.json, ROOT / "benchmarks" / "results", "first-plan", fields))


if __name__ == "__main__":
    main()
