"""The measuring loop: every variant loaded, prefilled and decoded in interleaved rounds.

Round r times every variant before round r+1 starts, so a transient slowdown of the machine hits
all variants alike; each number is later the median of the measured rounds (after `warmup`).
Phase 1 times loads one model at a time; phase 2 keeps every variant resident and times a
prefill and a generate() per round. Ctrl-C stops the loop: what was measured so far is kept and
the result says it was interrupted.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import SettingError, describe_error
from ..frozen import frozen
from ..loaders import input_device
from .meters import PeakMemory, StepClock, round_clock
from .rounds import RoundBudget, quiet_threads, ratios_settled, terminal_bar
from .verdict import share_plan_rounds, still_measured, stop_settled

__all__ = [
    "BUDGET_S",
    "BenchRun",
    "Measurement",
    "PeakMemory",
    "StepClock",
    "Variant",
    "VariantBox",
    "measure",
    "workload_for",
]

BUDGET_S = 60.0
"""Seconds the measured rounds of a full `cudaload bench` (no --repeats) may take, on the clock they are timed
with (wall; on busy cores the process's CPU seconds, within `rounds.WALL_BOUND` x in wall): loads LOAD_SHARE
of it, prefill/decode RUN_SHARE, the generation comparison the rest (`bench.rounds`). Issue 50: the default
bench within 90 s on 2 quiet cores, 180 s with 4 CPU-bound neighbours; a variant whose ratio to the plan is
decided stops early (`verdict.stop_settled`), so the budget goes to the close calls."""
LOAD_SHARE, RUN_SHARE = 0.25, 0.5


class VariantBox:
    """Each variant's time box in one phase of an adaptive run: its equal part of the phase's share of
    `BenchRun.budget_s`. A variant past its box after a measured round is measured no further (its numbers
    are the rounds it had, the row says so), so one slow variant (an emulated dtype, eager attention on a long
    prompt) cannot hold the others' rounds back; with a fixed `--repeats` there is no box. Its seconds are the
    phase's `rounds.RoundBudget`'s: its share, on its clock (the rounds' own, `meters.round_clock`)."""

    def __init__(self, budget: RoundBudget, variants: int) -> None:
        self.box = None if budget.fixed else budget.share_s / max(1, variants)
        self.warmup = budget.warmup
        self.clock, self.unit = budget.clock, " of CPU" if budget.cpu_clock else ""
        self.spent: dict[int, float] = {}

    def add(self, index: int, seconds: float) -> None:
        self.spent[index] = self.spent.get(index, 0.0) + seconds

    def over(self, index: int, done: int) -> str | None:
        """Why variant `index` is not measured in round `done + 1` (None: it is): past its box after at least
        one measured round."""
        spent = self.spent.get(index, 0.0)
        if self.box is None or done <= self.warmup or spent <= self.box:
            return None
        return (
            f"time-boxed after {done - self.warmup} measured rounds "
            f"({spent:.0f} s{self.unit}, its share {self.box:.0f} s)"
        )


@frozen
class BenchRun:
    """What one benchmark run does: `batch` prompts of `prompt_tokens`, `new_tokens` generated."""

    prompt_tokens: int
    new_tokens: int
    batch: int = 1
    repeats: int = 3
    """Measured rounds: exactly these with no `budget_s`, else at most these (`bench.rounds`)."""
    warmup: int = 1
    min_repeats: int = 2
    budget_s: float | None = None
    threads: int | None = None
    """torch CPU threads during the run; None: torch's default (one per usable core)."""
    warmup_new_tokens: int = 4
    """Tokens generated in a warm-up round (its prefill is the measured rounds' own shape): a
    warm-up readies kernels and caches, its decode rate is not kept."""
    generation_batch: int = 4
    """Prompts of different lengths in the generation comparison (`bench.generate_bench`)."""
    cpu_clock: bool = False
    """Time the rounds in the process's CPU seconds, on a CPU (`meters.round_clock`: a default bench on busy cores)."""


def workload_for(
    *,
    quick: bool,
    prompt_tokens: int | None = None,
    new_tokens: int | None = None,
    batch: int | None = None,
    repeats: int | None = None,
    threads: int | None = None,
    generation_batch: int | None = None,
) -> BenchRun:
    """The run's workload: the mode's defaults, then what the caller set (each checked)."""
    base = (
        # A smoke test: on small VMs, OpenMP threads spinning between a tiny model's many short ops
        # made 2-thread decode up to 50x slower and erratic (measured on a 2-vCPU KVM guest).
        BenchRun(prompt_tokens=64, new_tokens=16, repeats=1, threads=1, generation_batch=2)
        if quick
        # 128 + 32 tokens: a round of the 7 variants of SmolLM2 at 256 + 64 took over a minute on 2
        # busy cores (issue 37); ratios between variants settle as well on the shorter workload.
        else BenchRun(prompt_tokens=128, new_tokens=32, repeats=5, budget_s=None if repeats else BUDGET_S)
    )
    chosen = {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "batch": batch,
        "repeats": repeats,
        "threads": threads,
        "generation_batch": generation_batch,
    }
    for name, value in chosen.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SettingError(f"cudaload bench: {name}={value!r}; pass a whole number of at least 1.")
    return BenchRun(**{**base.__dict__, **{k: v for k, v in chosen.items() if v is not None}})


@dataclass
class Variant:
    """One way of loading the checkpoint, and what was measured of it."""

    dtype: str
    attn_implementation: str
    kwargs: dict[str, Any]
    is_plan: bool = False
    is_bare: bool = False
    """`from_pretrained(path)` with no arguments: what a user gets without cudaload."""
    applied: str | None = None
    """dtype/attention read back from the loaded model (how the bare variant is told apart)."""
    device: str | None = None
    """Where the loaded model's weights are (read back with `applied`)."""
    error: str | None = None
    model: Any = None
    load_s: list[float] = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)
    generate_s: list[float] = field(default_factory=list)
    weights_bytes: int | None = None
    peak_bytes: int | None = None
    """The most memory one prefill + generate() round needed, weights included (see `measure`)."""
    finite_logits: bool | None = None
    boxed: dict[str, str] = field(default_factory=dict)
    """Phase ("load", "run") -> why the variant was measured no further in it (`VariantBox`)."""

    @property
    def name(self) -> str:
        return "bare from_pretrained(path)" if self.is_bare else f"{self.dtype}/{self.attn_implementation}"


@frozen
class Measurement:
    """What a bench's load/prefill/decode grid measured besides each variant's own numbers."""

    parameters: int
    device: str
    interrupted: bool
    peak_memory: str
    """How `Variant.peak_bytes` was measured on this device."""
    clock: str = ""
    """What the rounds were timed in (`meters.round_clock`)."""


class _Loader:
    """Loads variants and tidies up after them on one device, remembering the parameter count.

    The count lives here (not in a return value) so a Ctrl-C mid-phase keeps what was seen."""

    def __init__(self, torch: Any, on_cuda: bool, path: Path, clock: Callable[[], float] = time.perf_counter) -> None:
        self.torch, self.on_cuda, self.path, self.clock = torch, on_cuda, path, clock
        self.parameters = 0

    def sync(self) -> None:
        if self.on_cuda:
            self.torch.cuda.synchronize()

    def release(self) -> None:
        gc.collect()
        if self.on_cuda:
            self.torch.cuda.empty_cache()

    def load(self, v: Variant) -> tuple[Any, float]:
        from transformers import AutoModelForCausalLM

        self.sync()
        start = self.clock()
        # local_files_only: the checkpoint is a local folder; nothing may be fetched mid-benchmark.
        model = AutoModelForCausalLM.from_pretrained(str(self.path), local_files_only=True, **v.kwargs)
        self.sync()
        return model, self.clock() - start


def measure(
    path: Path,
    variants: list[Variant],
    work: BenchRun,
    vocab_size: int,
    *,
    on_cuda: bool,
    progress: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> Measurement:
    """Fill each variant's measurements in place (see the module docstring). `on_cuda`: the
    variants run on a CUDA GPU (synchronise before reading clocks, measure CUDA memory)."""
    import torch

    memory = PeakMemory(torch, on_cuda)
    work = replace(work, cpu_clock=work.cpu_clock and not on_cuda)  # a GPU's work is not this process's CPU time
    clock, clock_name = round_clock(work.cpu_clock)  # the rounds' and, through `work`, the phases' budgets
    loader = _Loader(torch, on_cuda, path, clock)
    rounds = work.warmup + work.repeats
    interrupted = False
    bar = terminal_bar(2 * rounds * len(variants), progress)
    try:
        with quiet_threads(torch, work.threads):
            _time_loads(variants, work, loader, bar, say)
            for line in share_plan_rounds(variants, before=True):
                say(line)
            _load_resident(variants, loader)
            _time_runs(variants, work, vocab_size, loader, memory, bar, say)
            share_plan_rounds(variants, before=False)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        for v in variants:
            v.model = None
        loader.release()
    return Measurement(
        parameters=loader.parameters,
        device="cuda" if on_cuda else "cpu",
        interrupted=interrupted,
        peak_memory=memory.method if memory.available else "not measured (no /proc/self/clear_refs)",
        clock=clock_name,
    )


def _time_loads(variants: list[Variant], work: BenchRun, loader: _Loader, bar: Any, say: Callable[[str], None]) -> None:
    """Phase 1: load times, interleaved; each model is dropped before the next load."""
    budget, r = RoundBudget(work, LOAD_SHARE, phase="load", say=say), 0
    box = VariantBox(budget, len(variants))
    while still_measured(variants, "load") and budget.another(
        r, lambda: ratios_settled([v.load_s for v in variants if v.error is None])
    ):
        say(f"load {budget.label(r)}")
        for i, v in enumerate(variants):
            bar.set_description(f"load {r + 1} {v.name}")
            bar.update(1)
            if v.error is not None or "load" in v.boxed:
                continue
            why = None if v.is_plan else box.over(i, r)  # the plan's row is every ratio's reference
            if why is not None:
                v.boxed["load"] = why
                say(f"{v.name}: load {why}")
                continue
            try:
                start = box.clock()
                model, seconds = loader.load(v)
            except Exception as exc:  # an unusable option is a result, not a crash
                v.error = f"load: {describe_error(exc)}"
                loader.release()
                continue
            if r >= work.warmup:
                v.load_s.append(seconds)
            if v.weights_bytes is None:
                v.weights_bytes = int(model.get_memory_footprint())
                v.applied = f"{str(model.dtype).removeprefix('torch.')}/{model.config._attn_implementation}"
                v.device = str(getattr(model, "device", ""))
            loader.parameters = loader.parameters or sum(int(p.numel()) for p in model.parameters())
            del model
            loader.release()
            box.add(i, box.clock() - start)
        r += 1
        for line in stop_settled(variants, "load", work):
            say(line)


def _load_resident(variants: list[Variant], loader: _Loader) -> None:
    """Load every still-usable variant once more and keep it, for phase 2's interleaved rounds."""
    for v in variants:
        if v.error is None and "run" not in v.boxed:
            try:
                v.model, _ = loader.load(v)
            except Exception as exc:  # e.g. out of memory with every variant resident
                v.error = f"load: {describe_error(exc)}"
                loader.release()


def _time_runs(
    variants: list[Variant],
    work: BenchRun,
    vocab_size: int,
    loader: _Loader,
    memory: PeakMemory,
    bar: Any,
    say: Callable[[str], None],
) -> None:
    """Phase 2: prefill and decode, interleaved over all loaded variants, on one fixed prompt."""
    torch = loader.torch
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, max(vocab_size, 3), (work.batch, work.prompt_tokens), generator=generator)
    budget, r = RoundBudget(work, RUN_SHARE, phase="prefill/decode", say=say), 0
    running = [v for v in variants if v.error is None]
    box = VariantBox(budget, len(running))

    def settled() -> bool:
        return ratios_settled([v.prefill_s for v in running if v.error is None]) and ratios_settled(
            [v.decode_tps for v in running if v.error is None]
        )

    while still_measured(running, "run") and budget.another(r, settled):
        say(f"prefill/decode {budget.label(r)}")
        for i, v in enumerate(variants):
            bar.set_description(f"run {r + 1} {v.name}")
            bar.update(1)
            if v.error is not None or v.model is None or "run" in v.boxed:
                continue
            why = None if v.is_plan else box.over(i, r)
            if why is not None:
                v.boxed["run"] = why
                say(f"{v.name}: prefill/decode {why}")
                continue
            started = box.clock()
            new_tokens = work.new_tokens if r >= work.warmup else min(work.new_tokens, work.warmup_new_tokens)
            try:
                with memory.watch(v) if r >= work.warmup else nullcontext():
                    finite, prefill_s, decode_tps, generate_s = _run(v.model, prompt, new_tokens, loader, torch)
            except Exception as exc:
                v.error = f"run: {describe_error(exc)}"
                v.model = None
                loader.release()
                continue
            v.finite_logits = finite if v.finite_logits is None else (v.finite_logits and finite)
            if r >= work.warmup:
                v.prefill_s.append(prefill_s)
                v.decode_tps.append(decode_tps)
                v.generate_s.append(generate_s)
            box.add(i, box.clock() - started)
        r += 1
        for line in stop_settled(running, "run", work):
            say(line)


def _run(model: Any, prompt: Any, new_tokens: int, loader: _Loader, torch: Any) -> tuple[bool, float, float, float]:
    """(finite logits, prefill seconds, decode tokens/s over the batch, generate seconds) for one round, on the
    loader's clock."""
    sync, clock = loader.sync, loader.clock
    ids = prompt.to(input_device(model))
    mask = torch.ones_like(ids)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    with torch.inference_mode():
        sync()
        start = clock()
        # logits_to_keep=1: the prefill as generate runs it (no lm_head over the whole prompt).
        logits = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1).logits
        sync()
        prefill_s = clock() - start
        finite = bool(torch.isfinite(logits).all())
        del logits
        steps = StepClock(sync, clock)
        sync()
        start = clock()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
            pad_token_id=pad,
            logits_processor=[steps],
        )
        sync()
        generate_s = clock() - start
    produced = int(out.shape[1] - ids.shape[1])
    if produced != new_tokens or len(steps.stamps) != new_tokens:
        raise RuntimeError(f"generate produced {produced} tokens ({len(steps.stamps)} steps), not {new_tokens}")
    span = steps.stamps[-1] - steps.stamps[0]
    batch = int(ids.shape[0])
    decode_tps = batch * (new_tokens - 1) / span if new_tokens > 1 and span > 0 else batch * new_tokens / generate_s
    return finite, prefill_s, decode_tps, generate_s
