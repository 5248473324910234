"""cudaload's training-memory estimate against the peak memory of one real LoRA step, on this CPU.

    python benchmarks/finetune_memory.py            # 4 runs, two model shapes (~2.5 minutes on 2 cores)
    python benchmarks/finetune_memory.py --quick    # one tiny run: a smoke test in seconds

Each run builds a random-weight Qwen3 causal LM from its config (nothing is downloaded), wraps it
with peft LoRA as the plan does (r=16, alpha=32, dropout=0.05 on every projection, adapters in
fp32), and runs one training step (forward with labels, backward, torch AdamW step: the
`adamw_torch` a CPU plan gets) in a fresh subprocess. What is measured is the growth of the
process's peak resident memory over its resident memory just before the step (after the model,
the adapters, the optimizer object and a 16-token warm-up step exist):

- peak = VmHWM from /proc/self/status, reset with /proc/self/clear_refs ("5") at the baseline.
  Not getrusage's ru_maxrss: Linux carries the parent's high-water mark into a child across exec
  (a child of an 800 MB process reports ru_maxrss >= 800 MB), and it cannot be reset.
- the child runs with glibc's MALLOC_MMAP_THRESHOLD_=65536 (and no trimming threshold): every
  tensor over 64 KiB is its own mmap, returned to the kernel when freed. With glibc's default
  (a threshold that grows to 32 MiB, and per-thread arenas) freed tensors stay resident and
  the peak depends on allocation history: the same step read 450-600 MB instead of 124 MB.

The estimate compared is the part of `estimate_training_memory()` that the step allocates:
activations (checkpointed layer inputs, one layer / every layer, the loss's logits) + LoRA
gradients and AdamW state (the LoRA weights and the base weights exist before the baseline).
The JSON (machine, versions, date, every run) goes to
benchmarks/results/finetune-memory-<cpu model>-<date>.json unless --out says otherwise.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 2**20
TARGETS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}

# Two shapes of ~35-40M parameters: one whose decoder layers dominate the step (small vocabulary,
# run with and without checkpointing), one whose logits do (Qwen3's 151936-entry vocabulary; fp32
# as this CPU's plan, and bf16 under CPU autocast as Trainer(bf16=True) runs it).
SMALL_VOCAB = dict(
    vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
    num_key_value_heads=4, head_dim=64,
)  # fmt: skip
LARGE_VOCAB = dict(
    vocab_size=151936, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32,
)  # fmt: skip
TINY = dict(
    vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16,
)  # fmt: skip
RUNS = [
    {"name": "small-vocab fp32 checkpointing", "shape": SMALL_VOCAB, "seq": 1024, "dtype": "float32", "ckpt": True},
    {"name": "small-vocab fp32 no checkpointing", "shape": SMALL_VOCAB, "seq": 1024, "dtype": "float32", "ckpt": False},
    {"name": "large-vocab fp32 checkpointing", "shape": LARGE_VOCAB, "seq": 512, "dtype": "float32", "ckpt": True},
    {"name": "large-vocab bf16-autocast checkpointing", "shape": LARGE_VOCAB, "seq": 256, "dtype": "bfloat16",
     "ckpt": True},  # bf16 matmuls are slow on CPUs without AMX: fewer tokens
]  # fmt: skip
QUICK = [{"name": "tiny fp32 no checkpointing", "shape": TINY, "seq": 256, "dtype": "float32", "ckpt": False}]


# --- the child: one LoRA step, measured -------------------------------------------------------


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    dtype = getattr(torch, spec["dtype"])
    config = Qwen3Config(**spec["shape"], max_position_embeddings=max(4096, spec["seq"]), use_cache=False)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    if spec["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)
    vocab = spec["shape"]["vocab_size"]

    def forward(ids: Any) -> Any:
        with autocast:  # as Trainer's compute_loss under bf16=True; backward runs outside it
            return model(input_ids=ids, labels=ids).loss  # the outputs (and logits) are dropped here

    warm = torch.randint(0, vocab, (1, 16))
    forward(warm).backward()  # lazy initialisation (kernels, thread pools) out of the measurement
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, vocab, (1, spec["seq"]))
    gc.collect()
    base = _status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        method = "VmHWM reset by clear_refs"
    except OSError:
        method = "VmHWM (not reset: valid when the step's peak is the process's peak)"
    started = time.perf_counter()
    loss = forward(ids)
    after_forward = _status("VmHWM")
    loss.backward()
    after_backward = _status("VmHWM")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    peak = _status("VmHWM")
    return {
        "method": method,
        "baseline_rss_bytes": base,
        "forward_peak_growth_bytes": after_forward - base,
        "backward_peak_growth_bytes": after_backward - base,
        "step_peak_growth_bytes": peak - base,
        "step_s": round(time.perf_counter() - started, 2),
        "loss": float(loss.detach()),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch_threads": torch.get_num_threads(),
    }


# --- the parent: estimate, spawn, compare -----------------------------------------------------


def _estimate(run: dict[str, Any]) -> dict[str, Any]:
    from transformers import Qwen3Config

    from cudaload.model_facts import read_model_facts
    from cudaload.policy.memory import (
        BYTES,
        estimate_training_memory,
        layer_bytes_per_token,
        logits_bytes_per_element,
        lora_parameters,
    )

    facts = read_model_facts(Qwen3Config(**run["shape"]))
    targets = tuple(TARGETS)
    estimate = estimate_training_memory(
        facts,
        dtype=run["dtype"],
        quantize=None,
        r=16,
        targets=targets,
        seq_len=run["seq"],
        batch=1,
        checkpointing=run["ckpt"],
        on_gpu=False,
    )
    lora_weights = 4 * lora_parameters(facts, 16, targets)  # fp32, allocated before the baseline
    logits_elements = run["seq"] * run["shape"]["vocab_size"]
    d = BYTES[run["dtype"]]
    return {
        **estimate.as_dict(),
        "step_growth": estimate.activations + estimate.lora - lora_weights,
        "logits": logits_bytes_per_element(run["dtype"]) * logits_elements,
        "logits_forward": (d + (4 if d < 4 else 0) + 4) * logits_elements,
        "layer": layer_bytes_per_token(facts, run["dtype"], None, targets, False) * run["seq"],
        "parameters": facts.parameters,
    }


def _spawn(run: dict[str, Any], threads: int | None) -> dict[str, Any]:
    spec = {k: run[k] for k in ("shape", "seq", "dtype", "ckpt")} | {"threads": threads}
    env = {**os.environ, **MALLOC_ENV}
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{run['name']}: the child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _sanitise(text: str) -> str:  # as cudaload.bench names its result files
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:60] or "unknown"


def _machine() -> dict[str, Any]:
    import peft
    import torch
    import transformers

    from cudaload.capability.cpu import parse_cpuinfo, parse_meminfo

    try:
        model, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
        total, _ = parse_meminfo(Path("/proc/meminfo").read_text())
    except OSError:
        model, flags, total = platform.processor() or platform.machine(), frozenset(), None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        import bitsandbytes

        bnb: str | None = bitsandbytes.__version__
    except ImportError:
        bnb = None
    return {
        "cpu": {"model": model, "isa_flags": sorted(flags), "cores": cores, "memory_total_bytes": total},
        "platform": platform.platform(),
        "libc": " ".join(platform.libc_ver()),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "bitsandbytes": bnb,
        },
    }


def _mib(n: float) -> str:
    return f"{n / MiB:8.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one tiny run (seconds): a smoke test")
    parser.add_argument("--out", help="result JSON path (default: results/finetune-memory-<cpu>-<date>.json)")
    parser.add_argument("--threads", type=int, help="torch CPU threads in each child (default: torch's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0

    machine = _machine()
    now = datetime.now(timezone.utc)
    out = Path(args.out or RESULTS / f"finetune-memory-{_sanitise(machine['cpu']['model'])}-{now:%Y-%m-%d}.json")
    runs = []
    for run in QUICK if args.quick else RUNS:
        estimate = _estimate(run)
        print(f"[finetune-memory] {run['name']}: {estimate['parameters'] / 1e6:.1f}M parameters", file=sys.stderr)
        measured = _spawn(run, args.threads)
        runs.append(
            {
                "name": run["name"],
                "model": {"architecture": "Qwen3ForCausalLM (random weights)", **run["shape"]},
                "seq_len": run["seq"],
                "batch": 1,
                "dtype": run["dtype"],
                "autocast": run["dtype"] != "float32",
                "gradient_checkpointing": run["ckpt"],
                "lora": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": TARGETS},
                "optimizer": "torch.optim.AdamW (adamw_torch)",
                "estimate_bytes": estimate,
                "measured": measured,
                "ratio_measured_over_estimate": round(measured["step_peak_growth_bytes"] / estimate["step_growth"], 3),
            }
        )
    result = {
        "benchmark": "benchmarks/finetune_memory.py",
        "schema": 1,
        "date": now.isoformat(timespec="seconds"),
        "machine": machine,
        "malloc_env": MALLOC_ENV,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    print(
        f"{'run':42} {'est. MiB':>9} {'meas. MiB':>9} {'ratio':>6}   est. logits fwd / bwd   meas. peak after fwd / bwd"
    )
    for r in runs:
        e, m = r["estimate_bytes"], r["measured"]
        print(
            f"{r['name']:42} {_mib(e['step_growth']):>9} {_mib(m['step_peak_growth_bytes']):>9} "
            f"{r['ratio_measured_over_estimate']:6.2f}   {_mib(e['logits_forward'])} /{_mib(e['logits'])}"
            f"   {_mib(m['forward_peak_growth_bytes'])} /{_mib(m['backward_peak_growth_bytes'])}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
