"""What load() costs over bare from_pretrained on tiny models, on a cached plan (issue 37, item 6).

For each tiny causal-LM family (saved with `from_config(...).save_pretrained`, random weights) and each
cudaload tree given (`--tree NAME=PATH`: what the child processes import, e.g. this branch against a checkout of
main; a project root is installed first, as a user's `pip install` does, into a folder of its own, and a `src`
folder is imported as it is), `cudaload.bench.overhead.load_costs` runs fresh processes with torch and
transformers imported beforehand: bare `from_pretrained(**plan kwargs)`, `load()` on a cached plan (one
plan and one load() ran first, so the test forward's record is there when the tree writes one) and
`load(verify=False)`, interleaved, `--repeats` each; wall and CPU seconds (CPU: every thread of the child,
so waiting for a core on a busy machine costs nothing). The load average is recorded before and after.

Goals, median over the families, never asserted in a test: issue 37's, load() on a cached plan <= 1.2x bare
from_pretrained + 50 ms (`load_over_limit` <= 1); issue 50's, load() of a proven checkpoint (its test forward
proven by an earlier process: every measured load here) <= 1.05x bare + 20 ms (`issue50_over_limit` <= 1), in
a fresh process and again in a warm one, CPU and wall. With the same kwargs, load()'s own from_pretrained call is
bare's, so the second goal is also judged on cudaload's own share, apart from from_pretrained's spread from one
process to the next (+-20 ms on a busy 2-core machine): load()'s CPU outside transformers'
`PreTrainedModel.from_pretrained` (imports, plan, checks, read-back) <= bare's outside it (an Auto class resolving
the model class) + 0.05 x bare + 20 ms.

    python benchmarks/load_overhead.py [--tree after=. --tree before=/tmp/main] [--repeats 3] [--json results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def _families(work: Path) -> dict[str, Path]:
    """A handful of tiny causal LMs, each saved in bfloat16 (as most checkpoints are) with random weights."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    configs = {
        "qwen3": transformers.Qwen3Config(head_dim=16, num_key_value_heads=2, max_position_embeddings=128, **TINY),
        "llama": transformers.LlamaConfig(num_key_value_heads=2, max_position_embeddings=128, **TINY),
        "mistral": transformers.MistralConfig(num_key_value_heads=2, max_position_embeddings=128, **TINY),
        "phi3": transformers.Phi3Config(
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=1, **TINY
        ),
        "gpt2": transformers.GPT2Config(
            vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0
        ),
    }
    paths = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        path = work / name
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)
        paths[name] = path
    return paths


def _importable(tree: str, work: Path, name: str) -> str:
    """The folder the children import `tree` from: a project root (a pyproject.toml) installed with pip into a
    folder of its own, as a user's install lays it out (its `RECORD` beside the package: cudaload keys its stored
    plans by it, planner/plan_store.py `code_identity`); anything else is a `src` folder, imported as it is."""
    if not (Path(tree) / "pyproject.toml").is_file():
        return str(Path(tree).resolve())
    target = work / f"installed-{name}"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*command, "--target", str(target), str(Path(tree).resolve())], check=True)
    return str(target)


def _summary(families: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Medians over the families of each one's medians, and the goal."""
    out: dict[str, Any] = {}
    for unit in ("wall_s", "cpu_s"):
        kinds = next(iter(families.values()))[unit]
        med = {kind: statistics.median(f[unit][kind]["median"] for f in families.values()) for kind in kinds}
        limit, again = 1.2 * med["bare"] + 0.050, 1.2 * med["bare_again"] + 0.050
        tight, tight_again = 1.05 * med["bare"] + 0.020, 1.05 * med["bare_again"] + 0.020
        out[unit] = {
            **{k: round(v, 4) for k, v in med.items()},
            "limit": round(limit, 4),
            "load_over_limit": round(med["load"] / limit, 4),
            "goal_met": med["load"] <= limit,
            "again_limit": round(again, 4),
            "again_load_over_limit": round(med["load_again"] / again, 4),
            "again_goal_met": med["load_again"] <= again,
            "issue50_limit": round(tight, 4),
            "issue50_over_limit": round(med["load"] / tight, 4),
            "issue50_goal_met": med["load"] <= tight,
            "issue50_again_limit": round(tight_again, 4),
            "issue50_again_over_limit": round(med["load_again"] / tight_again, 4),
            "issue50_again_goal_met": med["load_again"] <= tight_again,
        }
    # load() = its from_pretrained + the rest, bare = its from_pretrained + the rest (an Auto class resolving the
    # model class: ~2 ms). With the same kwargs, load()'s from_pretrained is bare's, so issue 50's limit holds when
    # load()'s rest <= bare's rest + 0.05 x bare + 20 ms: cudaload's own share, judged apart from from_pretrained's
    # own spread from one process to the next (+-20 ms here), fresh and warm.
    rest = {
        kind: statistics.median(f["own_cpu_s"][kind]["median"] for f in families.values())
        for kind in ("load", "load_again", "bare", "bare_again")
    }
    allowed = {
        kind: rest[f"bare{again}"] + 0.05 * out["cpu_s"][f"bare{again}"] + 0.020
        for kind, again in (("load", ""), ("load_again", "_again"))
    }
    out["own_cpu_s"] = {
        "load": round(rest["load"], 4),
        "bare": round(rest["bare"], 4),
        "allowed": round(allowed["load"], 4),
        "over_allowed": round(rest["load"] / allowed["load"], 4),
        "issue50_goal_met": rest["load"] <= allowed["load"],
        "load_again": round(rest["load_again"], 4),
        "bare_again": round(rest["bare_again"], 4),
        "allowed_again": round(allowed["load_again"], 4),
        "again_over_allowed": round(rest["load_again"] / allowed["load_again"], 4),
        "issue50_again_goal_met": rest["load_again"] <= allowed["load_again"],
    }
    out["check_proven"] = all(all(f["check_proven"]) for f in families.values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", help="NAME=PATH: a project root (installed first) or a src folder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--families", default="qwen3,llama,mistral,phi3,gpt2")
    parser.add_argument("--json", default=None, help='"results" (benchmarks/results/<machine>/) or a path')
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in (args.tree or [f"this={ROOT}"]))
    from cudaload.bench.overhead import load_costs

    load_before = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cudaload-load-overhead-") as tmp:
        paths = _families(Path(tmp))
        imported = {name: _importable(tree, Path(tmp), name) for name, tree in trees.items()}
        wanted = args.families.split(",")
        for name in wanted:
            for tree in trees:  # interleaved per family: the trees see the same load
                os.environ["PYTHONPATH"] = imported[tree]
                costs = load_costs(paths[name], repeats=args.repeats, say=lambda line: print(line, file=sys.stderr))
                costs["model"] = name
                results.setdefault(tree, {})[name] = costs
                wall, cpu = costs["wall_s"], costs["cpu_s"]
                ms = {k: (wall[k]["median"] * 1e3, cpu[k]["median"] * 1e3) for k in cpu}
                print(
                    f"{tree:>8} {name:<8} "
                    + " | ".join(f"{k} {w:5.0f} ms wall {c:5.0f} ms CPU" for k, (w, c) in ms.items())
                    + f" | load/limit {costs['load_over_limit']}"
                    + f" | cudaload's own {costs['own_cpu_s']['load']['median'] * 1e3:.1f} ms CPU",
                    flush=True,
                )
    summary = {tree: _summary(families) for tree, families in results.items()}
    fields = {
        "goal": "load() on a cached plan <= 1.2x bare from_pretrained (same kwargs) + 50 ms, median over families",
        "issue50_goal": "load() of a proven checkpoint <= 1.05x bare from_pretrained + 20 ms, fresh and warm process",
        "trees": trees,
        "repeats": args.repeats,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "summary": summary,
        "families": results,
    }
    print(json.dumps({"summary": summary, "load_average": fields["load_average"]}, indent=2))
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        print("wrote", write_benchmark_record(args.json, ROOT / "benchmarks" / "results", "load-overhead", fields))


if __name__ == "__main__":
    main()
