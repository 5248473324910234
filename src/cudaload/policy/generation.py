"""Generation settings: KV-cache size, how much batch x context fits, cache implementation,
torch.compile / CUDA graphs, and the tokenizer's padding side. Pure: facts come in as data.

What transformers does by itself (5.22-5.24; paths relative to site-packages/transformers), which
this policy follows unless it says otherwise:

- `generate()` builds a `DynamicCache(config=...)` unless `cache_implementation` asks for another
  (generation/utils.py, `GenerationMixin._prepare_cache_for_generation`); sliding-window layers keep
  only their window (cache_utils.py, `DynamicSlidingWindowLayer`, `get_layer_types_and_kwargs`).
- It compiles the forward by itself only when the cache is compileable and not a `DynamicCache`
  (i.e. a static cache), the model is on cuda/xpu/neuron/tpu, not quantized by a method whose
  `HfQuantizer.is_compileable` is False (bitsandbytes), and not offloaded to CPU/disk
  (generation/utils.py, `GenerationMixin._valid_auto_compile_criteria`); the default
  `CompileConfig` uses mode "reduce-overhead", i.e. CUDA graphs
  (generation/configuration_utils.py, `CompileConfig`).
- Continuous batching (`generate_batch`, `cache_implementation="paged"`) compiles nothing by
  default (`ContinuousBatchingConfig.default_compile_level` = 0) and turns CUDA graphs on only when
  no attention mask is needed, i.e. with FlashAttention
  (generation/continuous_batching/initialization.py, `decide_use_cuda_graphs`); it gives the KV
  cache 90% of the memory left after loading, 80% with logits processors, 60% on CPU
  (`resolve_max_memory_percent`).
- Decoder-only batched generation needs left padding: generate() warns "A decoder-only architecture
  is being used, but right-padding was detected!" (generation/utils.py, `generate`).
"""

from __future__ import annotations

from typing import Any

from ..errors import SettingError
from ..facts.dtypes import BYTES
from ..facts.kv_cache import CACHE_IMPLEMENTATIONS, CHECKPOINT_STATIC_CACHES, STATIC_CACHES, GenerationFacts
from ..facts.machine import Machine
from ..frozen import frozen
from ..plans import Decision, GenerationPlan, Rejected
from ..request import Workload
from .compile import NOT_FULLGRAPH, decide_compile, decide_continuous_batching, why_not_compiled
from .devices import gpu_indices
from .fit import format_bytes

__all__ = [
    "CPU_SHARE",
    "DECODE_HEAVY_TOKENS",
    "GPU_SHARE",
    "decide_generation",
    "kv_budget",
]

GPU_SHARE = 0.8
"""Share of the GPU memory left beside the weights that the KV cache may take: transformers'
continuous batching uses 0.8 when logits processors run (sampling), 0.9 without
(`resolve_max_memory_percent`); the rest holds the prefill's activations and logits."""
CPU_SHARE = 0.6
"""The same on a CPU, where the cache shares RAM with everything else (upstream's value for cpu/mps)."""
DECODE_HEAVY_TOKENS = 256
"""A static cache + torch.compile pays back its warm-up only over long decodes: planned when a
workload generates at least this many tokens and at least as many as it reads."""


def kv_budget(machine: Machine, device_map: Any, weight_bytes: int) -> tuple[int | None, str]:
    """(bytes the KV cache may use beside the weights, where), from the machine's free memory.

    None when the memory is unknown (a CPU whose available RAM was not read).
    """
    if not machine.gpus or device_map == "cpu":
        available = machine.cpu.memory_available
        if available is None:
            return None, "RAM (size unknown)"
        return int((available - weight_bytes) * CPU_SHARE), (
            f"{int(CPU_SHARE * 100)}% of the RAM left beside the weights ({format_bytes(available)} available - "
            f"{format_bytes(weight_bytes)} of weights)"
        )
    indices = gpu_indices(device_map)
    gpus = [g for g in machine.gpus if not indices or g.index in indices] or list(machine.gpus)
    free = sum(g.usable_memory for g in gpus)
    where = gpus[0].name if len(gpus) == 1 else f"{len(gpus)} GPUs"
    return int((free - weight_bytes) * GPU_SHARE), (
        f"{int(GPU_SHARE * 100)}% of the memory left beside the weights on {where} ({format_bytes(free)} free - "
        f"{format_bytes(weight_bytes)} of weights)"
    )


def _max_context(facts: GenerationFacts, dtype_bytes: int, budget: int, cap: int) -> int:
    """The longest single sequence whose KV cache fits in `budget` (binary search: the size grows
    with the context, flattening once every windowed layer is full)."""
    if facts.kv_bytes(1, cap, dtype_bytes) <= budget:
        return cap
    low, high = 0, cap
    while low < high:
        mid = (low + high + 1) // 2
        if facts.kv_bytes(1, mid, dtype_bytes) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def _kv_decision(facts: GenerationFacts, dtype: str, d: int, per_token: int) -> Decision:
    """The "generation.kv_cache" decision: `per_token` bytes of KV cache at `d` bytes per number."""
    parts = []
    for g in facts.layers:
        if not g.per_token:
            continue
        window = f", last {g.window} tokens" if g.window is not None else ""
        parts.append(f"{g.count} {g.layer_type} x {g.elements_per_token} numbers{window}")
    detail = " + ".join(parts) if parts else "no layer caches per token"
    reason = f"{format_bytes(per_token)} per token per sequence in {dtype} ({d} bytes): {detail} (K and V per layer)"
    beyond = facts.bytes_per_token(d, beyond_windows=True)
    if beyond != per_token:
        reason += f"; {format_bytes(beyond)} per token past the windows"
    if facts.state_layers:
        reason += (
            f"; {facts.state_layers} layer(s) keep a fixed-size state per sequence instead "
            "(linear attention/convolution: not per token, not counted)"
        )
    return Decision("generation.kv_cache", per_token, reason)


def _cache_decision(
    machine: Machine,
    facts: GenerationFacts,
    requested: str | None,
    workload: Workload,
    compile_blocker: str | None,
    fits: bool,
) -> Decision:
    if requested is not None:
        if requested not in CACHE_IMPLEMENTATIONS:
            raise SettingError(
                f"cache_implementation={requested!r} is not a cache generate() builds. Pass one of "
                f"{', '.join(CACHE_IMPLEMENTATIONS)}, or leave it unset to let cudaload choose."
            )
        if not facts.supports_cache:
            raise SettingError(
                f"cache_implementation={requested!r} was asked, but this model keeps its own cache and generate() "
                "ignores cache_implementation for it (`_supports_default_dynamic_cache` is False). Leave it unset."
            )
        return Decision("generation.cache_implementation", requested, "your choice", source="user")
    if not facts.supports_cache:
        return Decision(
            "generation.cache_implementation",
            None,
            "the model builds its own cache (generate() skips `cache_implementation` when "
            "`_supports_default_dynamic_cache` is False)",
        )
    if facts.checkpoint_cache_implementation in CHECKPOINT_STATIC_CACHES:
        return Decision(
            "generation.cache_implementation",
            facts.checkpoint_cache_implementation,
            "set by the checkpoint's generation_config.json; generate() builds "
            f"{facts.checkpoint_cache_implementation!r} as a static cache (generation/configuration_utils.py: "
            "DEPRECATED_STATIC_CACHE_IMPLEMENTATIONS)",
        )
    if facts.checkpoint_cache_implementation in CACHE_IMPLEMENTATIONS:
        return Decision(
            "generation.cache_implementation",
            facts.checkpoint_cache_implementation,
            "set by the checkpoint's generation_config.json; generate() uses it",
        )
    if not fits and machine.gpus:
        return Decision(
            "generation.cache_implementation",
            "offloaded",
            "the KV cache of one sequence does not fit on the GPU beside the weights: the offloaded dynamic "
            "cache keeps only the layer in use on the GPU (slower: every step copies the cache)",
            (Rejected("dynamic", "one sequence's KV cache exceeds the GPU budget"),),
        )
    long_decode = workload.new_tokens >= DECODE_HEAVY_TOKENS and workload.new_tokens >= workload.prompt_tokens
    if not machine.gpus:
        why_not_static = (
            "generate() compiles only on cuda/xpu/neuron/tpu (`_valid_auto_compile_criteria`); uncompiled, a static "
            "cache only preallocates the whole length"
        )
    elif compile_blocker is not None:
        why_not_static = f"pays only compiled, and generate() will not compile here: {compile_blocker}"
    elif long_decode and not facts.compiles_fullgraph:
        why_not_static = NOT_FULLGRAPH
    elif long_decode:
        return Decision(
            "generation.cache_implementation",
            "static",
            f"{workload.describe()} is decode-bound: a static cache lets generate() torch.compile the forward "
            "with CUDA graphs (`_valid_auto_compile_criteria`), cutting per-token launch overhead; the warm-up "
            "(compiling, once per new shape) is repaid over long decodes",
            (
                Rejected("dynamic", "transformers' default: never compiled by generate(), one kernel launch each"),
                Rejected("offloaded", "the cache fits on the GPU: offloading only adds copies"),
            ),
        )
    else:
        why_not_static = (
            f"the torch.compile warm-up is repaid only over long decodes (>= {DECODE_HEAVY_TOKENS} new tokens, "
            f"more than the prompt), and {workload.describe()} is not one: plan with workload='decode-heavy' or pass "
            "cache_implementation='static'"
        )
    return Decision(
        "generation.cache_implementation",
        "dynamic",
        "transformers' default for generate() (`_prepare_cache_for_generation`): grows with the sequence, "
        "sliding-window layers keep only their window",
        (Rejected("static", why_not_static),),
    )


def _not_modelled(facts: GenerationFacts, cache: Decision, max_batch: int | None) -> list[str]:
    """What the KV estimate leaves out, said in the plan rather than silently overstated."""
    notes: list[str] = []
    if facts.state_layers and max_batch:
        # e.g. Qwen3-Next's Gated DeltaNet layers: a recurrent state + a convolution state per sequence
        # (transformers 5.22-5.25 cache_utils.py: LinearAttentionLayer), ~74 MiB in fp32 at its sizes, whatever
        # the length.
        notes.append(
            f"generation: {facts.state_layers} layer(s) keep a fixed-size recurrent/convolution state per sequence "
            f"(linear attention) that max_batch={max_batch} does not count (not modelled): the real limit is lower, "
            "by as much as 6x for Qwen3-Next at short contexts."
        )
    if cache.value == "quantized":
        notes.append(
            "generation: cache_implementation='quantized' is sized at full width here (not modelled: the quantized "
            "cache keeps only its recent residual tokens in full precision), and its backend (optimum-quanto, or "
            "hqq) is not checked: generate() raises without it."
        )
    return notes


def _padding_decision(facts: GenerationFacts, requested: str | None) -> tuple[Decision, tuple[str, ...]]:
    # Right padding only warns in transformers 5.22-5.25 (generation/utils.py: "right-padding was detected! For
    # correct generation results, please set `padding_side='left'`"); the FlashAttention ValueError ("You are
    # attempting to perform batched generation with padding_side='right'") was 4.x modeling code (Mistral, Qwen2)
    # and no 5.x model raises it, so the reasons no longer claim FlashAttention raises.
    decoder_only = not facts.encoder_decoder
    if requested is not None:  # a valid side: GenerationRequest checked it
        warnings: tuple[str, ...] = ()
        if decoder_only and requested == "right":
            warnings = (
                "padding_side='right' for a decoder-only model: batched generate() continues from the padding "
                "(transformers warns 'right-padding was detected'). Kept, as you asked.",
            )
        return Decision("generation.padding_side", requested, "your choice", source="user"), warnings
    if decoder_only:
        return (
            Decision(
                "generation.padding_side",
                "left",
                "decoder-only: each sequence continues from its last position, so padding must come first "
                "(generate() warns on right-padding)",
                (Rejected("right", "batched generate() would continue from pad tokens"),),
            ),
            (),
        )
    return (
        Decision(
            "generation.padding_side",
            "right",
            "encoder-decoder: padding pads the encoder's input; the decoder starts from its own start token",
        ),
        (),
    )


def decide_generation(
    machine: Machine,
    facts: GenerationFacts,
    *,
    dtype: str,
    attention: str,
    weight_bytes: int,
    device_map: Any,
    quantized: str | None = None,
    workload: Workload | None = None,
    context: int | None = None,
    cache_implementation: str | None = None,
    padding_side: str | None = None,
) -> GenerationPlan:
    """The generation settings for a model planned with `dtype`, `attention` and `device_map`.

    Args:
        machine: the machine (as `usable_machine` leaves it).
        facts: the model's KV-cache layout (`read_generation_facts`).
        dtype, attention, device_map: the plan's choices (the KV cache is kept in `dtype`).
        weight_bytes: the weights' size in memory (`weight_bytes` of policy/memory.py).
        quantized: the model's quantization method (`quant_method`, e.g. "bitsandbytes", "fp8"),
            None when it is not quantized; transformers compiles only some (`COMPILEABLE_QUANT_METHODS`).
        workload: what the model will do (prompt and new tokens); decides static vs dynamic.
        context: tokens per sequence (prompt + new) for `max_batch`; default the workload's.
        cache_implementation, padding_side: your choices, validated and kept.

    Raises:
        SettingError: an unknown cache_implementation or padding_side, a context that is not a
            positive integer, or a cache_implementation for a model that builds its own cache.

    Example::

        gen = decide_generation(machine, facts, dtype="bfloat16", attention="sdpa",
                                weight_bytes=16 * GiB, device_map="cuda:0", context=8192)
        gen.max_batch, gen.decision("generation.cache_implementation").reason
    """
    workload = workload or Workload()
    chosen_context = _context(facts, context, workload)
    warnings: list[str] = []
    if facts.max_positions is not None and chosen_context > facts.max_positions:
        warnings.append(
            f"context {chosen_context} exceeds the model's {facts.max_positions} positions: beyond them its output "
            "degrades (or its position embeddings fail)."
        )
    d = BYTES.get(dtype, 4)
    per_token = facts.bytes_per_token(d)
    budget, where = kv_budget(machine, device_map, weight_bytes)
    fit = _fit(facts, d, chosen_context, budget, where)
    warnings += fit.warnings
    offloaded = isinstance(device_map, str) and device_map == "auto" and budget is not None and budget < 0
    blocker = why_not_compiled(machine, facts, quantized, offloaded)
    cache = _cache_decision(machine, facts, cache_implementation, workload, blocker, fit.max_batch != 0)
    compiles = cache.value in STATIC_CACHES and blocker is None
    padding, padding_warnings = _padding_decision(facts, padding_side)
    warnings += padding_warnings
    generate_kwargs: dict[str, Any] = {}
    if cache.value is not None and (cache.source == "user" or cache.value in ("static", "offloaded")):
        generate_kwargs["cache_implementation"] = cache.value
    warnings += [f"generation: {note}" for note in facts.notes]
    warnings += _not_modelled(facts, cache, fit.max_batch)
    decisions = (
        _kv_decision(facts, dtype, d, per_token),
        fit.decision,
        cache,
        decide_compile(facts, cache, blocker, compiles, attention),
        decide_continuous_batching(machine, attention),
        padding,
    )
    return GenerationPlan(
        decisions=decisions,
        generate_kwargs=generate_kwargs,
        padding_side=str(padding.value),
        cache_implementation=cache.value,
        compile=compiles,
        context=chosen_context,
        kv_bytes_per_token=per_token,
        max_batch=fit.max_batch,
        max_context=fit.max_context,
        budget_bytes=budget,
        dtype=dtype,
        facts=facts,
        warnings=tuple(warnings),
    )


def _context(facts: GenerationFacts, context: int | None, workload: Workload) -> int:
    """The context `max_batch` is computed for: yours, else the workload's capped at the model's positions."""
    if context is not None and (not isinstance(context, int) or isinstance(context, bool) or context < 1):
        raise SettingError(f"context={context!r}: pass a positive number of tokens (prompt + new), or leave it unset.")
    if context is not None:
        return context
    chosen = workload.prompt_tokens + workload.new_tokens
    return chosen if facts.max_positions is None else min(chosen, facts.max_positions)


@frozen
class _Fit:
    """The `generation.max_batch` decision, with the batch and context the KV-cache budget allows."""

    decision: Decision
    max_batch: int | None
    max_context: int | None
    warnings: tuple[str, ...] = ()


def _fit(facts: GenerationFacts, d: int, context: int, budget: int | None, where: str) -> _Fit:
    """The "generation.max_batch" decision: how many `context`-token sequences fit in the KV budget."""
    per_sequence = facts.kv_bytes(1, context, d)
    if budget is None:
        per = format_bytes(per_sequence)
        reason = f"the free memory is unknown ({where}): {per} of KV cache per sequence of {context} tokens"
        return _Fit(Decision("generation.max_batch", None, reason), None, None)
    cap = facts.max_positions or 1 << 24
    max_batch = max(budget, 0) // per_sequence if per_sequence else None
    max_context = _max_context(facts, d, max(budget, 0), cap) if facts.bytes_per_token(d) else cap
    fit = (
        f"batch {max_batch} x {context} tokens ({format_bytes(per_sequence)} each)"
        if max_batch is not None
        else "any batch (no per-token cache)"
    )
    decision = Decision(
        "generation.max_batch",
        {"batch": max_batch, "context": context},
        f"{fit} fit in {format_bytes(max(budget, 0))}: {where}, the share transformers' continuous batching "
        f"gives its cache (`resolve_max_memory_percent`); one sequence fits up to {max_context} tokens",
    )
    warnings: tuple[str, ...] = ()
    if max_batch == 0:
        warnings = (
            f"one sequence of {context} tokens needs {format_bytes(per_sequence)} of KV cache, more than the "
            f"{format_bytes(max(budget, 0))} left beside the weights: shorten the context (up to {max_context} tokens "
            "fit), quantize the weights, or use a GPU with more memory.",
        )
    return _Fit(decision, max_batch, max_context, warnings)
