"""Full training (`load_for_finetune(..., train="full")`) on this CPU: peak RSS growth of loading and three fused
AdamW steps against the plan's full-training estimate, and the optimizer's state bytes against its "optimizer" term.

    python benchmarks/full_training_memory.py [--json results]

Each case runs in its own process (a fresh peak RSS, taken after torch, transformers and the planner are imported
and a plan was made, so the growth is loading and training): a Qwen3-shaped model of 52M parameters (hidden 512,
6 layers, vocabulary 32000) built with `from_config`, 1024 tokens a step, bf16 and fp32, checkpointing on and off.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CASES = (("bfloat16", True), ("bfloat16", False), ("float32", True))
SEQ = 1024
VOCAB = 32000


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(path: str, dtype: str, checkpointing: bool) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, Trainer  # noqa: F401  # imported before the baseline

    import cudaload

    cudaload.plan(path, finetune=True, train="full", dtype=dtype, seq_len=SEQ)  # the planner's imports, too
    before = _peak_rss()
    model = cudaload.load_for_finetune(
        path, train="full", dtype=dtype, seq_len=SEQ, gradient_checkpointing=checkpointing
    )
    estimate = model.cudaload_plan.plan.finetune.memory_estimate["16bit"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # the planned adamw_torch_fused
    ids = torch.randint(2, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step")
    growth = _peak_rss() - before
    return {
        "dtype": dtype,
        "checkpointing": checkpointing,
        "seq_len": SEQ,
        "parameters": sum(p.numel() for p in model.parameters()),
        "estimate": estimate,
        "optimizer_state_measured": state,
        "peak_rss_growth": growth,
        "measured_over_estimate": round(growth / estimate["total"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help='write the record here ("results": benchmarks/results/<machine>/)')
    parser.add_argument("--child", nargs=3, metavar=("PATH", "DTYPE", "CHECKPOINTING"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.child[2] == "1")))
        return
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    shape = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "head_dim": 64}
    heads = {"num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 4096}
    config = Qwen3Config(vocab_size=VOCAB, **shape, **heads)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for dtype in sorted({d for d, _ in CASES}):
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).save_pretrained(f"{folder}/{dtype}")
        for dtype, checkpointing in CASES:
            argv = [sys.executable, __file__, "--child", f"{folder}/{dtype}", dtype, "1" if checkpointing else "0"]
            run = subprocess.run(argv, capture_output=True, text=True, check=True)
            rows.append(json.loads(run.stdout.splitlines()[-1]))
            print(json.dumps(rows[-1]))
    if args.json:
        from cudaload.bench.environment import write_benchmark_record

        root = Path(__file__).parent / "results"
        print(write_benchmark_record(args.json, root, "full-training-memory", {"cases": rows}))


if __name__ == "__main__":
    main()
