"""cudaload's plan against every dtype x attention alternative on this machine, side by side.

    python benchmarks/cpu_dtype.py            # full run (a few minutes on 2 cores)
    python benchmarks/cpu_dtype.py --quick    # a tiny model: a smoke test in seconds

Writes the result JSON to benchmarks/results/cpu-<cpu model>-<date>.json (cuda-<gpu>-<date>.json
on a CUDA machine) unless --out says otherwise, and prints the table. Nothing is downloaded.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import argparse
import sys
from pathlib import Path

from cudaload.bench import default_result_name, format_report, run_bench

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, one measured round (seconds)")
    parser.add_argument("--out", help=f"result JSON path (default: {RESULTS.name}/{default_result_name()})")
    parser.add_argument("--repeats", type=int, help="measured rounds, after one warm-up (default 3, quick 1)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's; quick: 1)")
    parser.add_argument("--model-dir", help="save and reuse the random-weight model here (default: a temp dir)")
    parser.add_argument("--save", action="store_true", help="also store a tuning record in cudaload's cache")
    args = parser.parse_args(argv)
    out = args.out or str(RESULTS / default_result_name())
    result = run_bench(
        quick=args.quick,
        out=out,
        model_dir=args.model_dir,
        repeats=args.repeats,
        threads=args.threads,
        save=args.save,
        log=lambda line: print(f"[bench] {line}", file=sys.stderr, flush=True),
    )
    print(format_report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
