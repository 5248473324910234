"""One variant of the fine-tuning benchmark, measured in its own process (`child_main`): the plan's
`load_for_finetune()`, one warm-up step, then the timed steps and the peak memory.

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
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import describe_error

__all__ = ["LEARNING_RATE", "child_main", "estimate_parts"]

LEARNING_RATE = 1e-3
"""High enough that a few steps on one repeated batch move the loss visibly (a sanity check)."""


def estimate_parts(estimate: dict[str, int], lora_parameters: int) -> dict[str, int]:
    """The plan's estimate split as the measurement is: `step` (what the timed steps allocate over
    the baseline: activations + fp32 LoRA gradients) and `total` (weights + LoRA + activations: the
    estimate less its overhead, which is no allocation)."""
    gradients = 4 * lora_parameters
    return {
        "step": estimate["activations"] + gradients,
        "total": estimate["weights"] + estimate["lora"] + estimate["activations"],
    }


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
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
    from ..policy import lora_leaves, lora_parameters

    finetune = plan.finetune
    quantization = plan.decision("quantize").value
    assert finetune.lora is not None  # the benchmark times LoRA against QLoRA
    lora = dict(finetune.lora)
    estimates = finetune.memory_estimate
    estimate = estimates["16bit" if quantization is None else quantization]
    facts = read_model_facts(path)
    adapters = lora_parameters(facts, int(lora["r"]), lora_leaves(facts, lora["target_modules"]))
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
        Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")  # reset VmHWM to the current RSS
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
    plan = model.cudaload_plan.plan  # type: ignore[union-attr]  # LoRA: a PeftModel, which has the attribute
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


def child_main() -> None:
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
    Path(spec["out"]).write_text(json.dumps(result), encoding="utf-8")
