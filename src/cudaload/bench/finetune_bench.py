"""Fine-tuning benchmark: LoRA against 4-bit QLoRA, each as cudaload plans it, measured.

Both variants load the same local checkpoint with `load_for_finetune()` (`quantize=None` and
`quantize="4bit"`), each in a fresh Python process, so that its peak memory is its own: one
warm-up training step, then `steps` timed steps on one fixed batch of random tokens (forward with
labels, backward, optimizer step; the loss's outputs are dropped before the backward, as
`Trainer.compute_loss` does). The optimizer is the one the plan's `TrainingArguments` name
(`adamw_torch_fused`, or on CUDA bitsandbytes' `paged_adamw_8bit` for
QLoRA), with autocast when the plan's arguments set `bf16`/`fp16`.

Memory, measured from a baseline taken after the warm-up step (the model, the adapters and the
optimizer's state exist; the gradients were dropped):

- CUDA: `torch.cuda.max_memory_allocated()` after `reset_peak_memory_stats()` at the baseline:
  the peak of everything torch allocated, weights included. bitsandbytes' paged optimizer state
  is CUDA unified memory, outside torch's allocator, so not in it (it is small for LoRA).
- CPU: resident memory. The peak is VmHWM from /proc/self/status, reset at the baseline by
  writing "5" to /proc/self/clear_refs; not getrusage's ru_maxrss, which Linux carries from the
  parent into a child across exec and which cannot be reset. The child runs with glibc's
  `MALLOC_MMAP_THRESHOLD_=65536` (and no trimming threshold): every tensor over 64 KiB is its
  own mmap, returned to the kernel when freed; with glibc's defaults freed tensors stay resident
  and the peak depends on allocation history (one step read 450-600 MB instead of 124 MB).
  `total` is that peak less the resident memory just before the model was loaded (after the
  imports).

Each measurement sits next to the plan's estimate of the same quantity (`estimate_training_memory`,
in `plan.finetune.memory_estimate`, for this run's seq_len x batch):

- `step`: growth over the baseline during the timed steps <-> activations + LoRA gradients (fp32,
  4 bytes per adapter parameter): what the measured phase allocates.
- `total`: the peak <-> weights + LoRA (weights, gradients, optimizer state) + activations: the
  estimate less its overhead term (the CUDA context and allocator slack are not allocations).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import describe_error
from .environment import machine_facts, versions

__all__ = ["format_finetune_report", "run_finetune_bench"]

SCHEMA = 1
MiB = 2**20
VARIANTS: tuple[tuple[str, str | None], ...] = (("LoRA", None), ("QLoRA 4-bit", "4bit"))
"""(name, `quantize=` passed to load_for_finetune): LoRA on the unquantized base, in the plan's dtype."""
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc settings for a CPU child: freed tensors leave the resident set (see the module docstring)."""
LEARNING_RATE = 1e-3
"""High enough that a few steps on one repeated batch move the loss visibly (a sanity check)."""
QUICK_SEQ_LEN = 64
QUICK_STEPS = 2
CHILD_TIMEOUT_S = 1800.0
QUICK_TIMEOUT_S = 300.0
PEAK_MEASURES = {
    "cpu": "resident memory (VmHWM reset by /proc/self/clear_refs at the baseline, glibc mmap threshold 64 KiB): "
    "step = peak growth over the baseline; total = peak less the resident memory before the model loaded",
    "cuda": "torch.cuda.max_memory_allocated() after reset_peak_memory_stats() at the baseline: total = that peak, "
    "step = that peak less memory_allocated() at the baseline; paged optimizer state (CUDA unified memory) "
    "is outside it",
}


# --- pure helpers ------------------------------------------------------------------------------


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator rounded to 4 places; None when either is missing or the denominator <= 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 4)


def step_statistics(times: list[float]) -> dict[str, float | None]:
    """Median, min, max and spread (max / min) of the timed steps' seconds."""
    if not times:
        return {"median_s": None, "min_s": None, "max_s": None, "spread": None}
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "spread": ratio(max(times), min(times)),
    }


def estimate_parts(estimate: dict[str, int], lora_parameters: int) -> dict[str, int]:
    """The plan's estimate split as the measurement is: `step` (what the timed steps allocate over
    the baseline: activations + fp32 LoRA gradients) and `total` (weights + LoRA + activations: the
    estimate less its overhead, which is no allocation)."""
    gradients = 4 * lora_parameters
    return {
        "step": estimate["activations"] + gradients,
        "total": estimate["weights"] + estimate["lora"] + estimate["activations"],
    }


def summarise(variants: list[dict[str, Any]]) -> dict[str, Any]:
    """QLoRA over LoRA: median step time, peak memory (total) and its estimate, from the rows."""
    by_quantize = {v["quantize"]: v for v in variants if v.get("error") is None}
    lora, qlora = by_quantize.get(None), by_quantize.get("4bit")
    if lora is None or qlora is None:
        return {"qlora_over_lora": None}
    return {
        "qlora_over_lora": {
            "step_time": ratio(qlora["step_time"]["median_s"], lora["step_time"]["median_s"]),
            "peak_memory": ratio(qlora["memory"]["total"]["bytes"], lora["memory"]["total"]["bytes"]),
            "peak_memory_estimate": ratio(
                qlora["memory"]["total"]["estimate_bytes"], lora["memory"]["total"]["estimate_bytes"]
            ),
        }
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MiB


def format_finetune_report(result: dict[str, Any]) -> str:
    """The result as a table: one row per variant, measured next to the plan's estimate."""
    machine, vers, model, work = result["machine"], result["versions"], result["model"], result["workload"]
    cpu = machine["cpu"]
    gpus = ", ".join(f"{g['name']} (sm {g['capability']})" for g in machine["gpus"]) or "no CUDA GPU"
    shape = model.get("shape") or {}
    size = f"{model['parameters'] / 1e6:.1f}M params" if model.get("parameters") else "? params"
    layout = ", ".join(f"{k} {shape[k]}" for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k in shape)
    lines = [
        f"cudaload bench --finetune ({'quick' if work['quick'] else 'full'}, {result['date']}): "
        f"{model.get('architecture') or 'model'} {size} ({layout}), seq_len {work['seq_len']} x batch "
        f"{work['batch_size']}, {work['statistic']}, {work['threads'] or 'default'} torch threads",
        f"machine: {cpu['model']}, {cpu['cores']} cores, {cpu['arch']}; {gpus}",
        f"versions: python {vers['python']}, torch {vers['torch']}, transformers {vers['transformers']}, "
        f"peft {vers.get('peft')}, bitsandbytes {vers.get('bitsandbytes')}, cudaload {vers['cudaload']}",
        "",
        f"  {'variant':<12} {'plan':<28} {'step s':>7} {'spread':>6} {'peak MiB':>9} {'est. MiB':>9} "
        f"{'meas/est':>8} {'step MiB':>9} {'est. MiB':>9} {'meas/est':>8} {'trainable':>10}  loss first -> last",
    ]
    for row in result["variants"]:
        plan = row.get("plan") or {}
        label = f"{plan.get('dtype', '?')}/{plan.get('quantization') or 'none'}/{plan.get('optimizer', '?')}"
        if row.get("interrupted"):
            lines.append(f"  {row['name']:<12} {label:<28} interrupted (Ctrl-C) before it was measured")
            continue
        if row.get("error") is not None:
            lines.append(f"  {row['name']:<12} {label:<28} failed: {row['error']}")
            continue
        t, total, step = row["step_time"], row["memory"]["total"], row["memory"]["step"]
        losses = row["loss"]
        lines.append(
            f"  {row['name']:<12} {label:<28} {_fmt(t['median_s'], '7.3f')} {_fmt(t['spread'], '6.2f')} "
            f"{_fmt(_mib(total['bytes']), '9.1f')} {_fmt(_mib(total['estimate_bytes']), '9.1f')} "
            f"{_fmt(total['ratio'], '8.2f')} {_fmt(_mib(step['bytes']), '9.1f')} "
            f"{_fmt(_mib(step['estimate_bytes']), '9.1f')} {_fmt(step['ratio'], '8.2f')} "
            f"{row['trainable_parameters']:>10,}  {losses['first']:.4f} -> {losses['last']:.4f}"
        )
    lines.append("")
    summary = (result.get("summary") or {}).get("qlora_over_lora")
    if summary:
        lines.append(
            f"QLoRA / LoRA: step time {_fmt(summary['step_time'], '.2f')}x, peak memory "
            f"{_fmt(summary['peak_memory'], '.2f')}x (estimate {_fmt(summary.get('peak_memory_estimate'), '.2f')}x)"
        )
    else:
        lines.append("QLoRA / LoRA: no ratio (a variant did not run)")
    if result.get("interrupted"):
        lines.append("INTERRUPTED (Ctrl-C): the rows above are what was measured before it")
    lines.append(f"peak: {work['peak_memory']}")
    lines.append(
        "estimate: total = weights + LoRA (weights, gradients, optimizer state) + activations (the plan's "
        "estimate less its overhead); step = activations + LoRA gradients"
    )
    lines.append(
        f"step s: {work['statistic']}; loss first -> last: the warm-up step's loss (before any update) -> "
        f"the last step's (after {work['steps']} updates on the same batch)"
    )
    if work["quick"]:
        lines.append("quick mode: a smoke test; its numbers compare nothing")
    if "written_to" in result:
        lines.append(f"written to {result['written_to']}")
    lines.append(f"took {result.get('wall_s', 0):.0f} s")
    return "\n".join(lines)


# --- the child: one variant, measured in its own process -------------------------------------


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _optimizer(torch: Any, name: str, params: list[Any], on_cuda: bool) -> tuple[Any, str]:
    """The optimizer the plan's TrainingArguments name, as Trainer builds it (its default
    weight decay 0), and a line saying what ran."""
    if name == "paged_adamw_8bit" and on_cuda:
        from bitsandbytes.optim.adamw import PagedAdamW8bit

        paged = PagedAdamW8bit(params, lr=LEARNING_RATE, weight_decay=0.0)  # type: ignore[no-untyped-call]
        return paged, "bitsandbytes PagedAdamW8bit"
    if name == "adamw_torch_fused":  # torch has fused AdamW on the CPU too (policy/training.py cites it)
        return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0, fused=True), "torch AdamW (fused)"
    used = "torch AdamW" if name == "adamw_torch" else f"torch AdamW ({name} needs CUDA)"
    return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0), used


def _plan_facts(plan: Any, path: str) -> dict[str, Any]:
    """A variant's plan as recorded: dtype, quantization, LoRA, optimizer, checkpointing, estimate."""
    from ..capability.model_config import read_model_facts
    from ..policy.memory import lora_parameters

    finetune = plan.finetune
    quantization = plan.decision("quantize").value
    lora = dict(finetune.lora)
    estimates = finetune.memory_estimate
    estimate = estimates["16bit" if quantization is None else quantization]
    facts = read_model_facts(path)
    adapters = lora_parameters(facts, int(lora["r"]), tuple(lora["target_modules"]))
    return {
        "dtype": plan.dtype,
        "attn_implementation": plan.attn_implementation,
        "quantization": quantization,
        "quantization_config": plan.kwargs.get("quantization_config"),
        "lora": lora,
        "optimizer": finetune.training_arguments.get("optim"),
        "training_arguments": dict(finetune.training_arguments),
        "gradient_checkpointing": finetune.gradient_checkpointing,
        "decisions": {d.setting: d.reason for d in plan.decisions if d.setting in ("dtype", "quantize", "lora")},
        "memory_estimate": {"assumes": estimates["assumes"], **estimate},
        "lora_parameters_estimated": adapters,
        "estimate_compared": estimate_parts(estimate, adapters),
    }


class _Trainer:
    """One training step as Trainer runs it under the plan's arguments (optimizer, autocast, loss
    scaling), on one fixed batch of random tokens."""

    def __init__(self, torch: Any, model: Any, args: dict[str, Any], batch: int, seq: int) -> None:
        from ..loaders import input_device

        self.torch, self.model = torch, model
        self.device = torch.device(input_device(model))
        self.on_cuda = self.device.type == "cuda"
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer, self.optimizer_used = _optimizer(torch, str(args.get("optim")), self.trainable, self.on_cuda)
        self.mixed = torch.bfloat16 if args.get("bf16") else torch.float16 if args.get("fp16") else None
        self.autocast = torch.autocast(
            self.device.type, dtype=self.mixed or torch.float32, enabled=self.mixed is not None
        )
        self.scaler = torch.amp.GradScaler("cuda") if self.mixed is torch.float16 and self.on_cuda else None
        vocab = model.config.vocab_size
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (batch, seq), generator=generator).to(self.device)

    def sync(self) -> None:
        if self.on_cuda:
            self.torch.cuda.synchronize(self.device)

    def step(self) -> float:
        """One step's loss (before its update)."""
        ids, optimizer, scaler = self.ids, self.optimizer, self.scaler
        with self.autocast:  # as Trainer's compute_loss under bf16/fp16; the backward runs outside it
            loss = self.model(input_ids=ids, labels=ids).loss  # the outputs (and the logits) are dropped here
        value = loss.detach()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        self.sync()
        return float(value)


def _memory_baseline(trainer: _Trainer) -> tuple[int, str]:
    """Start the peak-memory measurement now: (the baseline bytes, how the peak is measured)."""
    torch, device = trainer.torch, trainer.device
    if trainer.on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device), "torch.cuda.max_memory_allocated"
    baseline = _status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        method = "VmHWM reset by clear_refs"
    except OSError:
        method = "VmHWM not reset (no clear_refs): the process's peak, the load's included"
    return baseline, method


def _memory_peak(trainer: _Trainer, baseline: int, before_load: int) -> tuple[int, int]:
    """(total, growth over the baseline) of the peak since `_memory_baseline` (see the module docstring)."""
    if trainer.on_cuda:
        peak = trainer.torch.cuda.max_memory_allocated(trainer.device)
        return peak, peak - baseline
    peak = _status("VmHWM")
    return peak - before_load, peak - baseline


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch

    from ..finetune import load_for_finetune
    from ..plans import jsonable

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    path, batch, seq = spec["model"], spec["batch_size"], spec["seq_len"]
    before_load = _status("VmRSS")
    started = time.perf_counter()
    model = load_for_finetune(path, quantize=spec["quantize"], seq_len=seq, batch_size=batch, local_files_only=True)
    load_s = time.perf_counter() - started
    plan = model.cudaload_plan.plan
    facts = _plan_facts(plan, path)
    trainer = _Trainer(torch, model, facts["training_arguments"], batch, seq)

    model.train()
    warmup_loss = trainer.step()  # lazy initialisation (kernels, thread pools, optimizer state) out of the timing
    gc.collect()
    trainer.sync()
    baseline, method = _memory_baseline(trainer)
    times, losses = [], []
    for _ in range(spec["steps"]):
        started = time.perf_counter()
        losses.append(trainer.step())
        times.append(time.perf_counter() - started)
    total, growth = _memory_peak(trainer, baseline, before_load)
    compared = facts["estimate_compared"]
    mixed = trainer.mixed
    return {
        "plan": jsonable(facts),
        "device": str(trainer.device),
        "optimizer": trainer.optimizer_used,
        "autocast": None if mixed is None else str(mixed).removeprefix("torch."),
        "load_s": load_s,
        "step_times_s": times,
        "loss": {"warmup": warmup_loss, "steps": losses},
        "trainable_parameters": sum(p.numel() for p in trainer.trainable),
        "memory": {
            "method": method,
            "baseline_bytes": baseline,
            "before_load_bytes": None if trainer.on_cuda else before_load,
            "step": {"bytes": growth, "estimate_bytes": compared["step"]},
            "total": {"bytes": total, "estimate_bytes": compared["total"]},
        },
        "torch_threads": torch.get_num_threads(),
    }


def _warm_imports(spec: dict[str, Any]) -> None:
    """Import what the load will (torch, transformers and the model's class, peft, bitsandbytes),
    so that the resident memory taken before the load counts no code, and the two variants'
    imports can run side by side while nothing is measured."""
    import torch  # noqa: F401
    from peft import LoraConfig  # noqa: F401

    from ..planner import plan

    if spec["quantize"] is not None:
        import bitsandbytes  # noqa: F401
    plan(spec["model"], finetune=True, quantize=spec["quantize"], seq_len=spec["seq_len"], local_files_only=True)


def _child_main() -> None:
    """Entry point of a variant's process. The spec is argv[1] (JSON). After its imports it writes
    "ready" to stdout and waits for a line on stdin before it loads and measures; the result goes
    to spec["out"]. Anything libraries print goes to stderr."""
    spec = json.loads(sys.argv[1])
    handshake = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    with contextlib.suppress(Exception):  # the load below raises it again, and records it
        _warm_imports(spec)
    handshake.write("ready\n")
    handshake.flush()
    sys.stdin.readline()
    try:
        result = _measure(spec)
    except Exception as exc:  # a variant that cannot run here is a result, not a crash
        import traceback

        result = {"error": describe_error(exc), "traceback": traceback.format_exc()[-4000:]}
        try:
            from ..planner import plan
            from ..plans import jsonable

            planned = plan(
                spec["model"],
                finetune=True,
                quantize=spec["quantize"],
                seq_len=spec["seq_len"],
                batch_size=spec["batch_size"],
                local_files_only=True,
            )
            result["plan"] = jsonable(_plan_facts(planned, spec["model"]))
        except Exception as plan_exc:  # planning failed too: the load's error says why
            result["plan_error"] = describe_error(plan_exc)
    Path(spec["out"]).write_text(json.dumps(result))


# --- the parent: spawn each variant, compare ----------------------------------------------------


def _child_env(on_cpu: bool) -> dict[str, str]:
    """The child's environment: offline, cudaload importable as in this process, glibc's mmap
    threshold on CPU. The parent's own environment is left as it is."""
    package_root = str(Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": python_path}
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if on_cpu:
        env.update(MALLOC_ENV)
    return env


class _Child:
    """A variant's process: started at once (its imports overlap the other's), measured only when
    released, one at a time, so no measured step shares the CPU with the other variant."""

    CODE = "from cudaload.bench.finetune_bench import _child_main; _child_main()"

    def __init__(self, spec: dict[str, Any], env: dict[str, str], timeout: float, tmp: Path) -> None:
        self.out = tmp / f"{spec['name']}.json"
        self.stderr_path = tmp / f"{spec['name']}.stderr"
        self.timeout = timeout
        self.started = time.monotonic()
        self.error: str | None = None
        with self.stderr_path.open("w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", self.CODE, json.dumps({**spec, "out": str(self.out)})],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def _left(self) -> float:
        return self.timeout - (time.monotonic() - self.started)

    def _kill(self, why: str) -> None:
        self.error = why
        self.process.kill()
        self.process.wait()

    def wait_ready(self) -> None:
        """Until the child has imported (or died, or ran out of time)."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], max(self._left(), 0))
        if not ready:
            self._kill(f"TimeoutExpired: the variant's process was still importing after {self.timeout:.0f} s")
        elif self.process.stdout.readline().strip() != "ready":
            self.process.wait()

    def run(self) -> dict[str, Any]:
        """Release the child to load and measure; its result, or the error that stopped it."""
        if self.error is None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write("go\n")
            self.process.stdin.flush()
            try:
                self.process.wait(timeout=max(self._left(), 0))
            except subprocess.TimeoutExpired:
                self._kill(f"TimeoutExpired: the variant's process ran past {self.timeout:.0f} s and was killed")
        if self.error is not None:
            return {"error": self.error}
        if self.out.exists():
            return json.loads(self.out.read_text())  # type: ignore[no-any-return]
        stderr = self.stderr_path.read_text()
        tail = stderr.strip().splitlines()[-1:] or [""]
        return {
            "error": f"the variant's process exited with status {self.process.returncode} and no result: {tail[0]}",
            "stderr_tail": stderr[-4000:],
        }

    def close(self) -> None:
        if self.process.poll() is None:
            self._kill("stopped")
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def _row(name: str, quantize: str | None, child: dict[str, Any]) -> dict[str, Any]:
    """One variant of the result, its ratios computed from its own numbers."""
    row: dict[str, Any] = {"name": name, "quantize": quantize, "error": child.get("error")}
    row["plan"] = child.get("plan")
    if row["error"] is not None:
        return {**row, **{k: child[k] for k in ("plan_error", "traceback", "stderr_tail") if k in child}}
    memory = child["memory"]
    for part in ("step", "total"):
        memory[part]["ratio"] = ratio(memory[part]["bytes"], memory[part]["estimate_bytes"])
    losses = child["loss"]["steps"]
    first, last = child["loss"]["warmup"], losses[-1] if losses else child["loss"]["warmup"]
    return {
        **row,
        "device": child["device"],
        "optimizer": child["optimizer"],
        "autocast": child["autocast"],
        "load_s": child["load_s"],
        "step_time": {**step_statistics(child["step_times_s"]), "runs_s": child["step_times_s"]},
        "loss": {"first": first, "last": last, "steps": losses, "finite": all(map(math.isfinite, [first, *losses]))},
        "trainable_parameters": child["trainable_parameters"],
        "memory": memory,
        "torch_threads": child["torch_threads"],
    }


def _model_info(path: Path) -> dict[str, Any]:
    config = json.loads((path / "config.json").read_text())
    keys = (
        "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
    )  # fmt: skip
    info: dict[str, Any] = {
        "path": str(path),
        "architecture": (config.get("architectures") or [None])[0],
        "checkpoint_dtype": config.get("dtype") or config.get("torch_dtype"),
        "shape": {k: config[k] for k in keys if k in config},
    }
    try:
        from ..capability.model_config import read_model_facts

        info["parameters"] = read_model_facts(str(path)).parameters
    except Exception as exc:  # the variants will say what is wrong with the checkpoint
        info["parameters"] = None
        info["parameters_error"] = describe_error(exc)
    return info


def run_finetune_bench(
    model_path: str | Path,
    *,
    steps: int = 3,
    seq_len: int = 256,
    batch_size: int = 1,
    quick: bool = False,
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """LoRA (unquantized base, in the plan's dtype) and 4-bit QLoRA of the local checkpoint
    `model_path`, each planned by cudaload for this machine and measured in its own process: step
    time and peak memory next to the plan's estimate. Returns the result (JSON-ready); writes nothing.

    - `steps`: timed training steps after one warm-up step (median, min, max reported).
    - `seq_len` x `batch_size`: the tokens of each step (random, the same batch every step); the
      plans and their memory estimates are made for the same.
    - `quick`: a smoke test: at most 2 steps of at most 64 tokens, 1 torch thread unless `threads`.
    - `threads`: torch CPU threads in each variant's process (default: torch's).
    - `log`: called with a line per phase (e.g. `print` to stderr), for progress.
    - `timeout_s`: per variant (default 1800 s, quick 300 s); a variant past it is killed and
      recorded with its error, as is one that cannot run here (e.g. no bitsandbytes).

    Ctrl-C returns what was measured: `interrupted` is then True and each variant not measured
    says so (before the first variant starts, KeyboardInterrupt is raised: there is nothing to show).
    """
    path = Path(model_path)
    _check_inputs(path, steps, seq_len, batch_size, threads)
    if quick:
        steps, seq_len = min(steps, QUICK_STEPS), min(seq_len, QUICK_SEQ_LEN)
        # On small VMs OpenMP threads spinning between a tiny model's short ops make steps erratic.
        threads = threads or 1
    timeout = timeout_s if timeout_s is not None else QUICK_TIMEOUT_S if quick else CHILD_TIMEOUT_S
    began = time.perf_counter()
    say = _phase_logger(log, began)

    from ..capability import detect

    machine = detect()
    kind = "cuda" if machine.gpus else "cpu"
    specs = _specs(path, steps, seq_len, batch_size, threads)
    ran = _run_variants(path, machine, specs, _child_env(on_cpu=kind == "cpu"), timeout, say)
    variants, interrupted, model, facts, software = ran
    if interrupted:
        if model is None:  # stopped while starting: nothing to show
            raise KeyboardInterrupt
        variants += _unmeasured(variants)
    return {
        "benchmark": "cudaload.bench.finetune",
        "schema": SCHEMA,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": facts,
        "versions": software,
        "model": model,
        "workload": _workload(quick, steps, seq_len, batch_size, threads, kind, timeout),
        "interrupted": interrupted,
        "variants": variants,
        "summary": summarise(variants),
        "wall_s": round(time.perf_counter() - began, 1),
    }


def _phase_logger(log: Callable[[str], None] | None, began: float) -> Callable[[str], None]:
    """`log`, each line prefixed with the seconds since `began`; a no-op without `log`."""

    def say(line: str) -> None:
        if log is not None:
            log(f"{time.perf_counter() - began:6.1f}s  {line}")

    return say


def _specs(path: Path, steps: int, seq_len: int, batch_size: int, threads: int | None) -> list[dict[str, Any]]:
    """What each variant's process is told to load and measure (one per entry of `VARIANTS`)."""
    return [
        {
            "name": f"variant{index}",
            "model": str(path.resolve()),
            "quantize": quantize,
            "steps": steps,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "threads": threads,
        }
        for index, (_, quantize) in enumerate(VARIANTS)
    ]


def _unmeasured(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """After a Ctrl-C: a row for each variant that did not run, saying so."""
    measured = {row["name"] for row in variants}
    return [
        {"name": name, "quantize": quantize, "plan": None, "error": "interrupted (Ctrl-C)", "interrupted": True}
        for name, quantize in VARIANTS
        if name not in measured
    ]


def _workload(
    quick: bool, steps: int, seq_len: int, batch_size: int, threads: int | None, kind: str, timeout: float
) -> dict[str, Any]:
    """The result's `workload` section: what each variant ran, and how its peak memory is read."""
    return {
        "quick": quick,
        "steps": steps,
        "warmup_steps": 1,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "threads": threads,
        "learning_rate": LEARNING_RATE,
        "statistic": f"median of {steps} timed steps after 1 warm-up step",
        "peak_memory": PEAK_MEASURES[kind],
        "child_env": MALLOC_ENV if kind == "cpu" else {},
        "timeout_s": timeout,
    }


def _check_inputs(path: Path, steps: int, seq_len: int, batch_size: int, threads: int | None) -> None:
    """Refuse a folder without a checkpoint and nonsensical sizes before any process starts."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{str(path)!r} has no config.json: run_finetune_bench takes a local checkpoint folder "
            "(save one with save_pretrained(), or build a random one with cudaload.demo.save_random_qwen3)."
        )
    for name, value in (("steps", steps), ("seq_len", seq_len), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")


def _run_variants(
    path: Path,
    machine: Any,
    specs: list[dict[str, Any]],
    env: dict[str, str],
    timeout: float,
    say: Callable[[str], None],
) -> tuple[list[dict[str, Any]], bool, dict[str, Any] | None, Any, Any]:
    """Start every variant's process, then measure them one at a time: (rows, interrupted, model
    info, machine facts, versions). On Ctrl-C the rows so far are kept; model info is None when
    it came before everything the result reports was gathered."""
    variants: list[dict[str, Any]] = []
    interrupted = False
    model: dict[str, Any] | None = None
    facts = software = None
    work = specs[0]
    with tempfile.TemporaryDirectory(prefix="cudaload-bench-finetune-") as tmp:
        say(f"starting {len(VARIANTS)} processes (imports side by side; measured one at a time)")
        children: list[_Child] = []
        try:
            for spec in specs:
                children.append(_Child(spec, env, timeout, Path(tmp)))
            facts, software = machine_facts(machine), versions()
            model = _model_info(path)  # last: once it is set, an interrupted run has all it reports
            for child in children:
                child.wait_ready()
            for (name, quantize), child in zip(VARIANTS, children, strict=True):
                say(
                    f"{name}: loading and training ({work['steps']} steps of {work['seq_len']} x "
                    f"{work['batch_size']} tokens)"
                )
                row = _row(name, quantize, child.run())
                done = f"median step {row['step_time']['median_s']:.3f} s" if row["error"] is None else "failed"
                say(f"{name}: {done}" + (f": {row['error']}" if row["error"] else ""))
                variants.append(row)
        except KeyboardInterrupt:  # Ctrl-C: what was measured is the result; the rest says it did not run
            interrupted = True
        finally:
            for child in children:
                child.close()
    return variants, interrupted, model, facts, software
