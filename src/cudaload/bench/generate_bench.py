"""The generation comparison: the plan's generation settings against default `generate()`.

One model is loaded with the plan's from_pretrained kwargs; then a batch of prompts of different
lengths is generated, in interleaved rounds (as `harness` does), with:

- the plan's settings (`plan.generation`: its `generate_kwargs` and `padding_side`);
- default `generate()`: no cache arguments, inputs padded on the side a tokenizer pads by default
  (the checkpoint's tokenizer_config.json `padding_side`, else transformers'
  `PreTrainedTokenizerBase.padding_side = "right"`);
- every cache implementation the plan rejected (e.g. "static" on a CPU), with the plan's padding.

For each: decode tokens/s over the batch, generate() seconds, peak memory (measured as `harness`
does), the KV-cache bytes generate() really held (summed over the returned cache's tensors) beside
the plan's estimate, and how many sequences continued exactly as they do when generated alone,
unpadded (greedy decoding: a mismatch means padding changed the output, as right padding does to a
decoder-only model).

In an adaptive run (no `--repeats`) a variant whose decode rate and generate() time have both decided how it
compares with the plan (`rounds.decided`) is measured no further, nor is one past its time box
(`harness.VariantBox`: its equal part of the comparison's share of the budget); on busy cores a default bench
generates fewer new tokens here (`contention.busy_generation`), and the section says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import describe_error
from ..facts.kv_cache import CACHE_IMPLEMENTATIONS
from .harness import LOAD_SHARE, RUN_SHARE, BenchRun, VariantBox
from .meters import PeakMemory, StepClock, round_clock
from .results import median, ratio
from .rounds import RoundBudget, decided, ratios_settled

__all__ = ["GenerationVariant", "compare_generation", "generation_variants", "prompt_lengths"]

TRANSFORMERS_PADDING_SIDE = "right"
"""`PreTrainedTokenizerBase.padding_side` (tokenization_utils_base.py): what a tokenizer pads on
unless its tokenizer_config.json says otherwise."""


@dataclass
class GenerationVariant:
    """One way of calling generate(), and what was measured of it."""

    name: str
    generate_kwargs: dict[str, Any]
    padding_side: str
    is_plan: bool = False
    is_default: bool = False
    error: str | None = None
    generate_s: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)
    weights_bytes: int | None = None
    peak_bytes: int | None = None
    kv_cache_bytes: int | None = None
    matches_unpadded: int | None = None
    """Sequences whose greedy continuation equals the one generated for them alone (warm-up round)."""
    stopped: str | None = None
    """Why it was measured no further (decided against the plan, or past its time box); None: every round."""

    @property
    def cache(self) -> str:
        return str(self.generate_kwargs.get("cache_implementation", "default"))

    def to_dict(self, default: GenerationVariant | None, batch: int) -> dict[str, Any]:
        generate_s, decode = median(self.generate_s), median(self.decode_tps)
        # the ratios over the rounds both measured: one of the two may have stopped early
        n = min(len(self.generate_s), len(default.generate_s)) if default else 0
        base_s, base_tps = (median(default.generate_s[:n]), median(default.decode_tps[:n])) if default else (None, None)
        paired_s, paired_tps = median(self.generate_s[:n]), median(self.decode_tps[:n])
        return {
            "name": self.name,
            "generate_kwargs": self.generate_kwargs,
            "padding_side": self.padding_side,
            "is_plan": self.is_plan,
            "is_default": self.is_default,
            "ok": self.error is None and decode is not None,
            "error": self.error,
            "generate_s": generate_s,
            "decode_tokens_per_s": decode,
            "peak_memory_bytes": self.peak_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "matches_unpadded": self.matches_unpadded,
            "sequences": batch,
            "rounds": len(self.generate_s),
            "stopped": self.stopped,
            # Over default generate(): >1 this variant is faster / uses more memory.
            "speedup_over_default": {
                "generate": ratio(base_s, paired_s),
                "decode": ratio(paired_tps, base_tps),
            },
            "memory_over_default": ratio(self.peak_bytes, default.peak_bytes if default else None),
        }


def default_padding_side(path: Path) -> str:
    """The side the checkpoint's own tokenizer pads on by default (transformers' default without one)."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return TRANSFORMERS_PADDING_SIDE
    side = config.get("padding_side") if isinstance(config, dict) else None
    return side if side in ("left", "right") else TRANSFORMERS_PADDING_SIDE


def generation_variants(generation: Any, default_padding: str) -> list[GenerationVariant]:
    """The plan's settings, default generate() and each rejected cache, without duplicates.

    Two variants are the same when they build the same cache and pad on the same side; the plan's
    row then also carries `is_default`."""
    planned = GenerationVariant("plan", dict(generation.generate_kwargs), generation.padding_side, is_plan=True)
    default = GenerationVariant("default generate()", {}, default_padding, is_default=True)
    variants = [planned]
    if (planned.cache, planned.padding_side) == (default.cache, default.padding_side):
        planned.is_default = True
    else:
        variants.append(default)
    rejected = generation.decision("generation.cache_implementation").rejected
    for option in rejected:
        if option.value not in CACHE_IMPLEMENTATIONS:
            continue
        candidate = GenerationVariant(
            f"{option.value} cache", {"cache_implementation": option.value}, generation.padding_side
        )
        if all((v.cache, v.padding_side) != (candidate.cache, candidate.padding_side) for v in variants):
            variants.append(candidate)
    return variants


def prompt_lengths(prompt_tokens: int, batch: int) -> list[int]:
    """Lengths from `prompt_tokens` down to about half of it, so a batch needs padding."""
    return [max(1, prompt_tokens - i * prompt_tokens // (2 * batch)) for i in range(batch)]


def _padded(torch: Any, prompts: list[Any], side: str, pad: int) -> tuple[Any, Any]:
    longest = max(int(p.shape[0]) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for i, p in enumerate(prompts):
        n = int(p.shape[0])
        where = slice(longest - n, longest) if side == "left" else slice(0, n)
        ids[i, where], mask[i, where] = p, 1
    return ids, mask


def _cache_bytes(cache: Any) -> int | None:
    """Bytes of the K/V tensors a transformers Cache holds (None when it exposes no layers)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    total = 0
    for layer in layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if tensor is not None and hasattr(tensor, "nbytes"):
                total += int(tensor.nbytes)
    return total


def compare_generation(
    path: Path,
    the_plan: Any,
    work: BenchRun,
    batch: int,
    vocab_size: int,
    *,
    on_cuda: bool,
    say: Callable[[str], None] = lambda line: None,
    shortened: str | None = None,
) -> dict[str, Any]:
    """Measure every generation variant on one model loaded with the plan (see the module docstring).
    `shortened`: why `work.new_tokens` is fewer than the run's own (`contention.busy_generation`), recorded."""
    import torch

    generation = the_plan.generation
    variants = generation_variants(generation, default_padding_side(path))
    work = replace(work, cpu_clock=work.cpu_clock and not on_cuda)  # a GPU's work is not this process's CPU time
    memory = PeakMemory(torch, on_cuda)

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    lengths = prompt_lengths(work.prompt_tokens, batch)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, max(vocab_size, 3), (n,), generator=generator) for n in lengths]
    previous_threads = torch.get_num_threads()
    if work.threads is not None:
        torch.set_num_threads(work.threads)
    say(f"generation: loading the model with the plan, {len(variants)} generate() variants")
    planned = _PlannedModel(path, the_plan, work.new_tokens)
    try:
        with torch.inference_mode():
            _compare_rounds(torch, planned, variants, prompts, work, memory, sync, say)
    finally:
        torch.set_num_threads(previous_threads)
    section = _comparison(generation, variants, lengths, work.new_tokens, memory)
    return {**section, "clock": round_clock(work.cpu_clock)[1], "shortened": shortened}


class _PlannedModel:
    """The model loaded with the plan's kwargs, and generate() with the settings every variant shares."""

    def __init__(self, path: Path, the_plan: Any, new_tokens: int) -> None:
        from transformers import AutoModelForCausalLM

        from ..loaders import from_pretrained_kwargs, input_device

        kwargs = from_pretrained_kwargs(the_plan)
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kwargs)
        self.model = model
        self.pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        self.device = input_device(model)
        self.weights = int(model.get_memory_footprint())
        self.new = new_tokens

    def generate(self, ids: Any, mask: Any, settings: dict[str, Any], clock: Any = None, new: int | None = None) -> Any:
        """generate() with `settings`; `new` tokens (default: the run's new tokens)."""
        new = self.new if new is None else new
        return self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            do_sample=False,
            min_new_tokens=new,
            max_new_tokens=new,
            pad_token_id=self.pad,
            return_dict_in_generate=True,
            logits_processor=[clock] if clock is not None else None,
            **settings,
        )


def _compare_rounds(
    torch: Any,
    planned: _PlannedModel,
    variants: list[GenerationVariant],
    prompts: list[Any],
    work: BenchRun,
    memory: PeakMemory,
    sync: Callable[[], None],
    say: Callable[[str], None],
) -> None:
    """The unpadded reference continuations, then every variant timed in interleaved rounds."""
    new = planned.new
    say("generation: each prompt alone, unpadded (the reference continuation)")
    alone = [planned.generate(p[None], torch.ones(1, int(p.shape[0]), dtype=torch.long), {}) for p in prompts]
    reference = [out.sequences[0, -new:].cpu() for out in alone]
    del alone
    share = 1 - LOAD_SHARE - RUN_SHARE
    budget, r = RoundBudget(work, share, phase="generation", say=say), 0
    box = VariantBox(budget, len(variants))
    while (r <= work.warmup or _still_timed(variants)) and budget.another(
        r, lambda: ratios_settled([v.decode_tps for v in variants if v.error is None])
    ):
        say(f"generation {budget.label(r)}")
        for i, v in enumerate(variants):
            if v.error is not None or v.stopped is not None:
                continue
            v.stopped = None if v.is_plan else box.over(i, r)  # the plan's row is every decided ratio's reference
            if v.stopped is not None:
                say(f"generation: {v.name} {v.stopped}")
                continue
            started = box.clock()
            _time_round(torch, planned, v, r, prompts, reference, work, memory, sync)
            box.add(i, box.clock() - started)
        r += 1
        for line in stop_decided(variants, work):
            say(line)


def _still_timed(variants: list[GenerationVariant]) -> bool:
    """Whether a variant besides the plan is still measured: without one, a round compares nothing."""
    return any(not v.is_plan and v.error is None and v.stopped is None for v in variants)


def stop_decided(variants: list[GenerationVariant], work: BenchRun) -> list[str]:
    """After a round of an adaptive run: each variant but the plan whose decode rate and generate() seconds have
    both decided how it compares with the plan's (`rounds.decided`) is measured no further (`stopped` says why);
    a line for each. A fixed `--repeats N` measures N rounds of every variant."""
    plan = next((v for v in variants if v.is_plan and v.error is None), None)
    if work.budget_s is None or plan is None:
        return []
    lines = []
    for v in variants:
        if v.is_plan or v.error is not None or v.stopped is not None:
            continue
        decode = decided(plan.decode_tps, v.decode_tps, rate=True)
        seconds = decided(plan.generate_s, v.generate_s)
        if decode and seconds:
            v.stopped = (
                f"stopped after {len(v.generate_s)} measured rounds, more cannot change how it compares: "
                f"decode {decode}, generate() {seconds}"
            )
            lines.append(f"generation: {v.name} {v.stopped}")
    return lines


def _time_round(
    torch: Any,
    planned: _PlannedModel,
    v: GenerationVariant,
    r: int,
    prompts: list[Any],
    reference: list[Any],
    work: BenchRun,
    memory: PeakMemory,
    sync: Callable[[], None],
) -> None:
    """One variant's generate() in round `r`: timed and, after warm-up, recorded; in the first measured
    round also its cache size and how many continuations match the unpadded reference. A warm-up round
    generates `work.warmup_new_tokens` (as `harness` warms up): it readies kernels and caches, and its
    decode rate is not kept (issue 50: a full-length warm-up was a quarter of this comparison's time)."""
    measured = r >= work.warmup
    new = planned.new if measured else min(planned.new, work.warmup_new_tokens)
    v.weights_bytes = planned.weights
    ids, mask = _padded(torch, prompts, v.padding_side, planned.pad)
    clock = round_clock(work.cpu_clock)[0]
    steps = StepClock(sync, clock)
    try:
        with memory.watch(v) if measured else nullcontext():
            sync()
            start = clock()
            out = planned.generate(ids, mask, v.generate_kwargs, steps, new)
            sync()
            seconds = clock() - start
    except Exception as exc:  # an unusable setting is a result, not a crash
        v.error = describe_error(exc)
        return
    continuation = out.sequences[:, ids.shape[1] :].cpu()
    if r == work.warmup:
        v.kv_cache_bytes = _cache_bytes(out.past_key_values)
        v.matches_unpadded = sum(bool(torch.equal(continuation[i], reference[i])) for i in range(len(prompts)))
    del out
    if measured:
        span = steps.stamps[-1] - steps.stamps[0] if len(steps.stamps) > 1 else 0.0
        v.generate_s.append(seconds)
        v.decode_tps.append(len(prompts) * (new - 1) / span if span > 0 else len(prompts) * new / seconds)


def _comparison(
    generation: Any, variants: list[GenerationVariant], lengths: list[int], new: int, memory: PeakMemory
) -> dict[str, Any]:
    """The comparison's JSON section: each variant against default generate(), and the plan's estimate."""
    batch = len(lengths)
    default = next(v for v in variants if v.is_default)
    rows = [v.to_dict(default, batch) for v in variants]
    # generate() sizes and fills the cache for max_length - 1 tokens: the last token is never fed
    # back (generation/utils.py, `max_cache_length = generation_config.max_length - 1`).
    kept = max(lengths) + new - 1
    return {
        "batch": batch,
        "prompt_lengths": lengths,
        "new_tokens": new,
        "plan": generation.to_dict(),
        "kv_cache_bytes_planned": generation.kv_cache_bytes(batch, kept),
        "kv_cache_measured": "bytes of the K/V tensors in the cache generate() returned",
        "matches_unpadded": "sequences whose greedy continuation equals generating that prompt alone, unpadded",
        "peak_memory": memory.method if memory.available else "not measured (no /proc/self/clear_refs)",
        "variants": rows,
    }
