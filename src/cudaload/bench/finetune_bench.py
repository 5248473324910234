"""Fine-tuning benchmark: LoRA against 4-bit QLoRA, each as cudaload plans it, measured.

Both variants load the same local checkpoint with `load_for_finetune()` (`quantize=None` and
`quantize="4bit"`), each in a fresh Python process, so that its peak memory is its own: one
warm-up training step, then `steps` timed steps on one fixed batch of random tokens (forward with
labels, backward, optimizer step; the loss's outputs are dropped before the backward, as
`Trainer.compute_loss` does). The optimizer is the one the plan's `TrainingArguments` name
(`adamw_torch_fused`, or on CUDA bitsandbytes' `paged_adamw_8bit` for
QLoRA), with autocast when the plan's arguments set `bf16`/`fp16`.

Each variant's process (`finetune_child.py`) measures its step time and peak memory next to the plan's
estimate of the same quantity; `finetune_report.py` compares the variants and prints the table.
"""

from __future__ import annotations

import json
import math
import os
import select
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
from .finetune_child import LEARNING_RATE
from .finetune_report import ratio, step_statistics, summarise

__all__ = ["run_finetune_bench"]

SCHEMA = 1
VARIANTS: tuple[tuple[str, str | None], ...] = (("LoRA", None), ("QLoRA 4-bit", "4bit"))
"""(name, `quantize=` passed to load_for_finetune): LoRA on the unquantized base, in the plan's dtype."""
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc settings for a CPU child: freed tensors leave the resident set (see finetune_child.py)."""
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

    CODE = "from cudaload.bench.finetune_child import child_main; child_main()"

    def __init__(self, spec: dict[str, Any], env: dict[str, str], timeout: float, tmp: Path) -> None:
        self.out = tmp / f"{spec['name']}.json"
        self.stderr_path = tmp / f"{spec['name']}.stderr"
        self.timeout = timeout
        self.started = time.monotonic()
        self.error: str | None = None
        with self.stderr_path.open("w", encoding="utf-8") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", self.CODE, json.dumps({**spec, "out": str(self.out)})],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                encoding="utf-8",
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
            return json.loads(self.out.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
        stderr = self.stderr_path.read_text(encoding="utf-8")
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
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
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
