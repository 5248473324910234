"""Side-by-side benchmark: cudaload's plan against every alternative on this machine, in one run.

A Qwen3-shaped causal LM with random weights is saved in bfloat16 (nothing is downloaded), then
loaded with the plan's `from_pretrained` kwargs and with every other dtype x attention
implementation, each with the plan's device_map. For each variant: load seconds, prefill seconds
for one prompt, and decode tokens/s. Runs are interleaved (round r times every variant) so that a
transient slowdown of the machine hits all variants alike; each number is the median of the
measured rounds, after one warm-up round.

Ratios read "plan speed-up": variant time / plan time (decode: plan tok/s / variant tok/s), so
>1 means the plan is faster and <1 means that variant beats the plan.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .demo import save_random_qwen3
from .loaders import input_device
from .plans import jsonable

__all__ = ["DTYPES", "default_result_name", "format_report", "run_bench"]

DTYPES = ("float32", "bfloat16", "float16")
"""Every dtype tried, on CPU and CUDA alike."""
ATTENTION = ("sdpa", "eager")
"""Attention implementations tried besides the plan's chain (on CUDA the chain adds FlashAttention etc.)."""

SCHEMA = 1


@dataclass(frozen=True)
class _Shape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


@dataclass(frozen=True)
class _Workload:
    name: str
    shape: _Shape
    prompt_tokens: int
    new_tokens: int
    repeats: int
    warmup: int = 1
    threads: int | None = None
    """torch CPU threads during the run; None: torch's default (one per usable core)."""


_FULL = _Workload(
    "full",
    _Shape(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    prompt_tokens=256,
    new_tokens=64,
    repeats=3,
)
_QUICK = _Workload(
    "quick",
    _Shape(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
    prompt_tokens=64,
    new_tokens=16,
    repeats=1,
    # A smoke test: on small VMs, OpenMP threads spinning between a tiny model's many short ops
    # made 2-thread decode up to 50x slower and erratic (measured on a 2-vCPU KVM guest).
    threads=1,
)


@dataclass
class _Variant:
    dtype: str
    attn_implementation: str
    kwargs: dict[str, Any]
    is_plan: bool = False
    is_bare: bool = False
    """`from_pretrained(path)` with no arguments: what a user gets without cudaload."""
    applied: str | None = None
    """dtype/attention read back from the loaded model (how the bare variant is told apart)."""
    error: str | None = None
    model: Any = None
    runs: dict[str, list[float]] = field(default_factory=lambda: {"load_s": [], "prefill_s": [], "decode_tps": []})
    generate_s: list[float] = field(default_factory=list)
    memory_bytes: int | None = None
    finite_logits: bool | None = None

    @property
    def name(self) -> str:
        return "bare from_pretrained(path)" if self.is_bare else f"{self.dtype}/{self.attn_implementation}"


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _sanitise(text: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:60] or "unknown"


def default_result_name(machine: Any = None, when: datetime | None = None) -> str:
    """`cpu-<cpu model>-<date>.json`, or `cuda-<gpu name>-<date>.json` when a CUDA GPU is visible.

    Built from the hardware's model names only (no host name), so results from different
    machines sit side by side in benchmarks/results/.
    """
    if machine is None:
        from .capability import detect

        machine = detect()
    day = (when or datetime.now(timezone.utc)).strftime("%Y-%m-%d")
    if machine.gpus:
        return f"cuda-{_sanitise(machine.gpus[0].name)}-{day}.json"
    return f"cpu-{_sanitise(machine.cpu.model)}-{day}.json"


def _build_model(directory: Path, shape: _Shape) -> Path:
    """Save a random-weight Qwen3 causal LM in bfloat16 into `directory` (once)."""
    if (directory / "config.json").exists() and any(directory.glob("*.safetensors")):
        return directory
    save_random_qwen3(directory, dtype="bfloat16", bos_token_id=None, eos_token_id=1, pad_token_id=0, **asdict(shape))
    gc.collect()
    return directory


class _StepClock:
    """A logits processor that only notes when each generated token's logits were ready.

    `generate` calls it once per new token: the first call follows the prefill, the later ones
    each follow one decode step, so (N-1) steps / (last - first stamp) is the pure decode rate.
    """

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.stamps: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.sync()
        self.stamps.append(time.perf_counter())
        return scores


@contextmanager
def _torch_threads(torch: Any, threads: int | None) -> Iterator[None]:
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _machine_facts(machine: Any, torch: Any) -> dict[str, Any]:
    cpu = machine.cpu
    return {
        "description": machine.describe(),
        "cpu": {
            "model": cpu.model,
            "arch": cpu.arch,
            "cores": cpu.cores,
            "isa_flags": sorted(cpu.flags),
            "fast_bf16": cpu.fast_bf16,
            "memory_total_bytes": cpu.memory_total,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_default_threads": torch.get_num_threads(),
        },
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "capability": f"{g.capability[0]}.{g.capability[1]}",
                "total_memory_bytes": g.total_memory,
            }
            for g in machine.gpus
        ],
        "platform": platform.platform(),
    }


def _versions(torch: Any) -> dict[str, str | None]:
    import transformers

    from . import __version__

    try:
        import accelerate

        accelerate_version: str | None = accelerate.__version__
    except ImportError:
        accelerate_version = None
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "torch_cuda": torch.version.cuda,
        "transformers": str(transformers.__version__),
        "accelerate": accelerate_version,
        "cudaload": __version__,
    }


def _variants(plan: Any) -> list[_Variant]:
    """The plan's own variant first, then every other dtype x attention, each with the plan's
    other kwargs (device_map, ...) unchanged, then a bare `from_pretrained(path)`."""
    base = plan.from_pretrained_kwargs()
    attention = list(dict.fromkeys([*plan.attention_chain, *ATTENTION]))
    dtypes = list(dict.fromkeys([plan.dtype, *DTYPES]))
    variants = [_Variant(plan.dtype, plan.attn_implementation, base, is_plan=True)]
    for dtype in dtypes:
        for attn in attention:
            if (dtype, attn) != (plan.dtype, plan.attn_implementation):
                variants.append(_Variant(dtype, attn, {**base, "dtype": dtype, "attn_implementation": attn}))
    variants.append(_Variant("checkpoint", "default", {}, is_bare=True))
    return variants


def _baseline(variants: list[_Variant], plan: Any) -> _Variant | None:
    """The plan's variant; if it failed, what load() would fall back to (the next link of the
    chain that worked, with the plan's dtype)."""
    by_name = {v.name: v for v in variants}
    for attn in plan.attention_chain:
        candidate = by_name.get(f"{plan.dtype}/{attn}")
        if candidate is not None and candidate.error is None:
            return candidate
    return None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_bench(
    *,
    quick: bool = False,
    out: str | os.PathLike[str] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    repeats: int | None = None,
    threads: int | None = None,
    save: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the plan and every alternative on this machine; return (and write to `out`) the result.

    - `quick`: a tiny model, short prompt, one measured round: a smoke test taking seconds.
    - `model_dir`: where the random-weight model is saved and reused (default: a temporary dir).
    - `repeats`: measured rounds (default 3, quick 1); each number is their median.
    - `threads`: torch CPU threads for the run (default: torch's, quick: 1), restored afterwards.
    - `save`: store the measured grid as a tuning record in cudaload's cache; later plans of this
      model shape on this machine (same CPU/GPUs, torch, threads) pick the measured winner.
    - `log`: called with a line per phase (e.g. `print` to stderr), for progress.

    The plan is made as `load()` makes it (measured on this machine, for this run's prompt and
    new-token counts), so the table compares what a user of cudaload gets.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"  # a local model: nothing may reach the Hub
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import torch
    from transformers import AutoModelForCausalLM

    from .capability import detect
    from .planner import plan as make_plan

    work = _QUICK if quick else _FULL
    if repeats is not None:
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, not {repeats}")
        work = replace(work, repeats=repeats)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        work = replace(work, threads=threads)
    started = time.perf_counter()

    def say(line: str) -> None:
        if log is not None:
            log(f"{time.perf_counter() - started:6.1f}s  {line}")

    machine = detect()
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")

    default_threads = torch.get_num_threads()
    with (
        tempfile.TemporaryDirectory(prefix="cudaload-bench-") as tmp,
        _quiet_progress_bars(),
        _torch_threads(torch, work.threads),
    ):
        root = Path(model_dir) if model_dir is not None else Path(tmp)
        path = root / f"qwen3-{work.name}"
        say(f"building the {work.name} model in {path}")
        _build_model(path, work.shape)

        the_plan = make_plan(str(path), workload=(work.prompt_tokens, work.new_tokens))
        variants = _variants(the_plan)
        on_cuda = bool(machine.gpus) and torch.cuda.is_available()

        def sync() -> None:
            if on_cuda:
                torch.cuda.synchronize()

        def release() -> None:
            gc.collect()
            if on_cuda:
                torch.cuda.empty_cache()

        def load(v: _Variant) -> Any:
            sync()
            start = time.perf_counter()
            model = AutoModelForCausalLM.from_pretrained(str(path), **v.kwargs)
            sync()
            return model, time.perf_counter() - start

        path_for_record = _model_key(path) if save else ""
        rounds = work.warmup + work.repeats
        parameters = 0
        # Phase 1: load times, interleaved; each model is dropped before the next load.
        for r in range(rounds):
            say(f"load round {r + 1}/{rounds}")
            for v in variants:
                if v.error is not None:
                    continue
                try:
                    model, seconds = load(v)
                except Exception as exc:  # an unusable option is a result, not a crash
                    v.error = f"load: {_describe(exc)}"
                    release()
                    continue
                if r >= work.warmup:
                    v.runs["load_s"].append(seconds)
                if v.memory_bytes is None:
                    v.memory_bytes = int(model.get_memory_footprint())
                    v.applied = f"{str(model.dtype).removeprefix('torch.')}/{model.config._attn_implementation}"
                parameters = parameters or sum(int(p.numel()) for p in model.parameters())
                del model
                release()

        # Phase 2: prefill and decode, interleaved over all loaded variants.
        for v in variants:
            if v.error is None:
                try:
                    v.model, _ = load(v)
                except Exception as exc:  # e.g. out of memory with every variant resident
                    v.error = f"load: {_describe(exc)}"
                    release()
        generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(2, work.shape.vocab_size, (1, work.prompt_tokens), generator=generator)
        for r in range(rounds):
            say(f"prefill/decode round {r + 1}/{rounds}")
            for v in variants:
                if v.error is not None or v.model is None:
                    continue
                try:
                    prefill, decode_tps, generate = _measure(v.model, prompt, work.new_tokens, sync, torch)
                except Exception as exc:
                    v.error = f"run: {_describe(exc)}"
                    v.model = None
                    release()
                    continue
                finite, prefill_s = prefill
                v.finite_logits = finite if v.finite_logits is None else (v.finite_logits and finite)
                if r >= work.warmup:
                    v.runs["prefill_s"].append(prefill_s)
                    v.runs["decode_tps"].append(decode_tps)
                    v.generate_s.append(generate)
        for v in variants:
            v.model = None
        release()

    baseline = _baseline(variants, the_plan)
    result = _result(work, machine, torch, date, the_plan, variants, baseline, on_cuda, parameters)
    result["workload"]["threads"] = work.threads or default_threads
    if save:
        saved = _save_record(path_for_record, machine, result, work.threads or default_threads)
        result["tuning_record"] = str(saved) if saved else None
    result["wall_s"] = round(time.perf_counter() - started, 2)
    if out is not None:
        target = Path(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(result, indent=2) + "\n")
        result["written_to"] = str(target)
    return result


def _model_key(path: Path) -> str:
    from .model_facts import read_model_facts

    return read_model_facts(str(path)).shape_key


def _save_record(model_key: str, machine: Any, result: dict[str, Any], threads: int) -> Path | None:
    """Store the measured grid (every variant that ran, bare excluded) as a tuning record."""
    from .capability.facts import TunedVariant, TuningRecord
    from .capability.tuning import write_tuning_record

    work = result["workload"]
    record = TuningRecord(
        model_key=model_key,
        prompt_tokens=work["prompt_tokens"],
        new_tokens=work["new_tokens"],
        variants=tuple(
            TunedVariant(r["dtype"], r["attn_implementation"], r["load_s"], r["prefill_s"], r["decode_tokens_per_s"])
            for r in result["variants"]
            if r["ok"] and not r["is_bare"]
        ),
        fingerprint=tuple(sorted(replace(machine, threads=threads).fingerprint().items())),
        measured_at=result["date"][:10],
    )
    return write_tuning_record(record)


def _measure(
    model: Any, prompt: Any, new_tokens: int, sync: Callable[[], None], torch: Any
) -> tuple[tuple[bool, float], float, float]:
    """((finite logits, prefill seconds), decode tokens/s, generate seconds) for one round."""
    device = input_device(model)
    ids = prompt.to(device)
    mask = torch.ones_like(ids)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    with torch.inference_mode():
        sync()
        start = time.perf_counter()
        # logits_to_keep=1: the prefill as generate runs it (no lm_head over the whole prompt).
        logits = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1).logits
        sync()
        prefill_s = time.perf_counter() - start
        finite = bool(torch.isfinite(logits).all())
        del logits
        clock = _StepClock(sync)
        sync()
        start = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
            pad_token_id=pad,
            logits_processor=[clock],
        )
        sync()
        generate_s = time.perf_counter() - start
    produced = int(out.shape[1] - ids.shape[1])
    if produced != new_tokens or len(clock.stamps) != new_tokens:
        raise RuntimeError(f"generate produced {produced} tokens ({len(clock.stamps)} steps), not {new_tokens}")
    steps = new_tokens - 1
    span = clock.stamps[-1] - clock.stamps[0]
    decode_tps = steps / span if steps > 0 and span > 0 else new_tokens / generate_s
    return (finite, prefill_s), decode_tps, generate_s


def _spread(values: list[float]) -> float | None:
    return round(max(values) / min(values), 3) if values and min(values) > 0 else None


def _paired(numerators: list[float], denominators: list[float]) -> float | None:
    """Median of the per-round ratios; None unless both ran every measured round."""
    if not numerators or len(numerators) != len(denominators) or min(denominators) <= 0:
        return None
    return round(statistics.median([n / d for n, d in zip(numerators, denominators, strict=True)]), 4)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 4)


def _result(
    work: _Workload,
    machine: Any,
    torch: Any,
    date: str,
    the_plan: Any,
    variants: list[_Variant],
    baseline: _Variant | None,
    on_cuda: bool,
    parameters: int,
) -> dict[str, Any]:
    base = {
        "load": _median(baseline.runs["load_s"]) if baseline else None,
        "prefill": _median(baseline.runs["prefill_s"]) if baseline else None,
        "decode": _median(baseline.runs["decode_tps"]) if baseline else None,
        "end_to_end": _end_to_end(baseline) if baseline else None,
    }
    rows: list[dict[str, Any]] = []
    for v in variants:
        load_s, prefill_s, decode_tps = (
            _median(v.runs["load_s"]),
            _median(v.runs["prefill_s"]),
            _median(v.runs["decode_tps"]),
        )
        ok = v.error is None and load_s is not None and prefill_s is not None and decode_tps is not None
        rows.append(
            {
                "name": v.name,
                "dtype": v.dtype,
                "attn_implementation": v.attn_implementation,
                "is_plan": v.is_plan,
                "is_bare": v.is_bare,
                "applied": v.applied,
                "is_baseline": v is baseline,
                "ok": ok,
                "error": v.error,
                "load_s": load_s,
                "prefill_s": prefill_s,
                "prefill_tokens_per_s": work.prompt_tokens / prefill_s if prefill_s else None,
                "decode_tokens_per_s": decode_tps,
                "generate_s": _median(v.generate_s),
                "end_to_end_s": _end_to_end(v),
                "memory_bytes": v.memory_bytes,
                "finite_logits": v.finite_logits,
                "runs": {k: list(vals) for k, vals in v.runs.items()},
                # max/min over the measured rounds: how far apart repeated runs of the same thing were.
                "spread": {
                    "load": _spread(v.runs["load_s"]),
                    "prefill": _spread(v.runs["prefill_s"]),
                    "decode": _spread(v.runs["decode_tps"]),
                },
                # >1: the plan is that many times faster than this variant; <1: this variant wins.
                "plan_speedup": {
                    "load": _ratio(load_s, base["load"]) if ok else None,
                    "prefill": _ratio(prefill_s, base["prefill"]) if ok else None,
                    "decode": _ratio(base["decode"], decode_tps) if ok else None,
                    "end_to_end": _ratio(_end_to_end(v), base["end_to_end"]) if ok else None,
                },
                # The same ratios taken round by round (variant and plan ran seconds apart in each
                # round), then the median: steadier when the machine drifts between rounds.
                "plan_speedup_paired": {
                    "load": _paired(v.runs["load_s"], baseline.runs["load_s"]) if ok and baseline else None,
                    "prefill": _paired(v.runs["prefill_s"], baseline.runs["prefill_s"]) if ok and baseline else None,
                    "decode": _paired(baseline.runs["decode_tps"], v.runs["decode_tps"]) if ok and baseline else None,
                },
                "kwargs": jsonable(v.kwargs),
            }
        )
    done = [r for r in rows if r["ok"]]
    best = {
        "load": min(done, key=lambda r: r["load_s"])["name"] if done else None,
        "prefill": min(done, key=lambda r: r["prefill_s"])["name"] if done else None,
        "decode": max(done, key=lambda r: r["decode_tokens_per_s"])["name"] if done else None,
        "end_to_end": min(done, key=lambda r: r["end_to_end_s"])["name"] if done else None,
    }
    plan_row = next(r for r in rows if r["is_plan"])
    bare_row = next((r for r in rows if r["is_bare"]), None)
    shape = work.shape
    return {
        "benchmark": "cudaload.bench",
        "schema": SCHEMA,
        "mode": work.name,
        "date": date,
        "machine": _machine_facts(machine, torch),
        "versions": _versions(torch),
        "model": {
            "architecture": "Qwen3ForCausalLM (random weights)",
            "checkpoint_dtype": "bfloat16",
            **{k: getattr(shape, k) for k in shape.__dataclass_fields__},
            "parameters": parameters,
        },
        "workload": {
            "prompt_tokens": work.prompt_tokens,
            "new_tokens": work.new_tokens,
            "batch": 1,
            "warmup_rounds": work.warmup,
            "measured_rounds": work.repeats,
            "statistic": "median",
            "device": "cuda" if on_cuda else "cpu",
            "prefill": "model(input_ids, use_cache=True, logits_to_keep=1)",
            "decode": "generate(do_sample=False, min_new_tokens=N, max_new_tokens=N): (N-1) decode steps / "
            "time from the first to the last token's logits",
            "end_to_end": "load + generate() of the prompt and N new tokens (median load + median generate)",
        },
        "plan": {
            "kwargs": jsonable(dict(the_plan.kwargs)),
            "attention_chain": list(the_plan.attention_chain),
            "variant": next(r["name"] for r in rows if r["is_plan"]),
            "decisions": [d.to_dict() for d in the_plan.decisions],
            "warnings": list(the_plan.warnings),
            "timings": dict(the_plan.timings),
        },
        "baseline": baseline.name if baseline else None,
        "ratios": "plan_speedup = variant time / baseline time (decode: baseline tok/s / variant tok/s), "
        "of the medians; plan_speedup_paired = the median of that ratio taken in each round; "
        ">1: the plan is faster, <1: the variant beats the plan",
        "variants": rows,
        "best": best,
        "summary": _summary(
            plan_row, bare_row, {k: next(r for r in rows if r["name"] == n) for k, n in best.items() if n}
        ),
    }


def _end_to_end(v: _Variant) -> float | None:
    """The reference workload: one load, then generate() of the prompt (prefill + decode)."""
    load_s, generate_s = _median(v.runs["load_s"]), _median(v.generate_s)
    return load_s + generate_s if load_s is not None and generate_s is not None else None


_SECONDS = {"load": "load_s", "prefill": "prefill_s", "end_to_end": "end_to_end_s"}


def _seconds(row: dict[str, Any], metric: str) -> float | None:
    """Seconds for `metric` (decode: seconds per token), comparable across rows."""
    if metric == "decode":
        tps = row["decode_tokens_per_s"]
        return 1 / tps if tps else None
    value = row[_SECONDS[metric]]
    return float(value) if value is not None else None


def _summary(plan: dict[str, Any], bare: dict[str, Any] | None, best: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per metric: the plan's time over the best variant's and over bare from_pretrained's
    (1.00 = as fast; above 1 the plan is slower by that factor; below 1 it is faster)."""
    out: dict[str, Any] = {}
    for metric in ("load", "prefill", "decode", "end_to_end"):
        mine = _seconds(plan, metric) if plan["ok"] else None
        top = best.get(metric)
        out[metric] = {
            "best": top["name"] if top else None,
            "plan_over_best": _ratio(mine, _seconds(top, metric)) if top else None,
            "plan_over_bare": _ratio(mine, _seconds(bare, metric)) if bare and bare["ok"] else None,
        }
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_report(result: dict[str, Any]) -> str:
    """The result as a table, the plan's row marked with `*`."""
    machine, versions, model, work = result["machine"], result["versions"], result["model"], result["workload"]
    cpu = machine["cpu"]
    gpus = ", ".join(f"{g['name']} (sm {g['capability']})" for g in machine["gpus"]) or "no CUDA GPU"
    plan_kwargs = " ".join(f"{k}={v}" for k, v in result["plan"]["kwargs"].items())
    lines = [
        f"cudaload bench ({result['mode']}, {result['date']}): Qwen3-shaped {model['parameters'] / 1e6:.0f}M params, "
        f"{model['checkpoint_dtype']} checkpoint, prompt {work['prompt_tokens']} tokens, "
        f"{work['new_tokens']} new tokens, {work.get('threads', '?')} torch threads, "
        f"median of {work['measured_rounds']} after {work['warmup_rounds']} warm-up",
        f"machine: {cpu['model']}, {cpu['cores']} cores, {cpu['arch']}, ISA {' '.join(cpu['isa_flags']) or '-'}, "
        f"torch CPU capability {cpu['torch_cpu_capability']}; {gpus}",
        f"versions: python {versions['python']}, torch {versions['torch']}, transformers {versions['transformers']}, "
        f"cudaload {versions['cudaload']}",
        f"plan: {plan_kwargs} (attention chain {' -> '.join(result['plan']['attention_chain'])})",
        "",
        f"  {'variant':<44} {'load s':>7} {'prefill s':>9} {'prefill tok/s':>13} {'decode tok/s':>12} "
        f"{'end-to-end s':>12} {'memory MiB':>10}   plan speed-up load/prefill/decode/end-to-end: of medians | paired",
    ]
    for row in result["variants"]:
        mark = "*" if row["is_plan"] else " "
        label = row["name"] + (" (plan)" if row["is_plan"] else "")
        if row.get("is_bare") and row.get("applied"):
            label += f" = {row['applied']}"
        if not row["ok"]:
            lines.append(f"{mark} {label:<44} failed: {row['error']}")
            continue
        s, paired = row["plan_speedup"], row["plan_speedup_paired"]
        memory = row["memory_bytes"] / 2**20 if row["memory_bytes"] else None
        flag = "" if row["finite_logits"] else "  (non-finite logits!)"
        lines.append(
            f"{mark} {label:<44} {_fmt(row['load_s'], '7.3f')} {_fmt(row['prefill_s'], '9.3f')} "
            f"{_fmt(row['prefill_tokens_per_s'], '13.0f')} {_fmt(row['decode_tokens_per_s'], '12.1f')} "
            f"{_fmt(row.get('end_to_end_s'), '12.3f')} "
            f"{_fmt(memory, '10.0f')}   {_fmt(s['load'], '.2f')} / {_fmt(s['prefill'], '.2f')} / "
            f"{_fmt(s['decode'], '.2f')} / {_fmt(s.get('end_to_end'), '.2f')} | {_fmt(paired['load'], '.2f')} / "
            f"{_fmt(paired['prefill'], '.2f')} / {_fmt(paired['decode'], '.2f')}{flag}"
        )
    lines.append("")
    summary = result.get("summary")
    if summary:
        lines.append("the plan's time / the best variant's and / bare from_pretrained(path)'s (1.00 = as fast):")
        for metric, row in summary.items():
            lines.append(
                f"  {metric:<11} {_fmt(row['plan_over_best'], '.2f')}x best ({row['best']}), "
                f"{_fmt(row['plan_over_bare'], '.2f')}x bare"
            )
    if result.get("tuning_record"):
        lines.append(f"tuning record saved: {result['tuning_record']} (plans of this model here now use it)")
    if result["mode"] == "quick":
        lines.append("quick mode: a smoke test on a tiny model; its numbers compare nothing")
    if result["baseline"] is None:
        lines.append("no ratios: neither the plan's variant nor its fallbacks ran")
    elif not next(r for r in result["variants"] if r["is_plan"])["is_baseline"]:
        lines.append(f"the plan's variant failed; ratios are against its fallback {result['baseline']}")
    lines.append(
        "plan speed-up = variant time / plan time (decode: plan tok/s / variant tok/s): "
        ">1 the plan is faster, <1 that variant beats the plan; 'of medians' divides the medians, "
        "'paired' is the median of the same ratio taken in each round"
    )
    if work["measured_rounds"] > 1:
        worst = {
            what: max((r["spread"][what] for r in result["variants"] if r["ok"] and r["spread"][what]), default=None)
            for what in ("load", "prefill", "decode")
        }
        lines.append(
            "run-to-run spread (max/min over measured rounds, worst variant): "
            + ", ".join(f"{what} {_fmt(value, '.2f')}x" for what, value in worst.items())
            + ": ratios closer to 1 than that are noise"
        )
    best = result["best"]
    plan_name = result["plan"]["variant"]
    verdicts = [f"{what} {name}{' (the plan)' if name == plan_name else ''}" for what, name in best.items()]
    lines.append("fastest: " + ", ".join(verdicts))
    if "written_to" in result:
        lines.append(f"written to {result['written_to']}")
    lines.append(f"took {result.get('wall_s', 0):.0f} s")
    return "\n".join(lines)
