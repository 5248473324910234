"""What a model's config says about generation, and the generation part of a Plan.

`read_generation_facts()` reads the KV-cache layout (which layers cache what, per token) from the
config the way transformers' own caches do (`cache_utils.get_layer_types_and_kwargs`, the function
`DynamicCache(config=...)` and `StaticCache` call), plus the few class flags generation depends on.
It imports transformers lazily; the dataclasses here are plain data, so the pure policy
(`policy/generation.py`) can take them as arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .plans import Decision, _short, jsonable

__all__ = [
    "CACHE_IMPLEMENTATIONS",
    "GenerationFacts",
    "GenerationPlan",
    "KvLayers",
    "read_generation_facts",
]

CACHE_IMPLEMENTATIONS = ("dynamic", "static", "offloaded", "offloaded_static", "quantized")
"""`cache_implementation` values generate() builds a cache for (transformers 5.22-5.24,
generation/configuration_utils.py: STATIC_CACHE_IMPLEMENTATIONS + DYNAMIC_CACHE_IMPLEMENTATIONS;
"paged" switches generate() to continuous batching and is not planned here)."""

# How each upstream cache layer type (cache_utils.DYNAMIC_LAYER_TYPE_MAPPING) stores tokens.
PER_TOKEN_TYPES = frozenset({"full_attention", "hybrid", "indexed_attention"})
"""One K and one V entry per token, for the whole context ("hybrid" also keeps a linear state)."""
WINDOW_TYPES = frozenset({"sliding_attention", "chunked_attention", "hybrid_sliding", "reference_sliding_attention"})
"""Per token, but only the last `sliding_window` (or `attention_chunk_size`) tokens."""
STATE_TYPES = frozenset({"conv", "linear_attention", "moe", "mlp", "dummy"})
"""No per-token entry: a fixed-size convolution/recurrent state per sequence, or nothing."""


@dataclass(frozen=True)
class KvLayers:
    """Decoder layers of one kind and shape, as the KV cache stores them.

    Example: `KvLayers("sliding_attention", count=26, elements_per_token=2048, window=4096)` is 26
    layers that each cache 2048 numbers (K and V) per token for the last 4096 tokens.
    """

    layer_type: str
    """transformers' layer type name (config `layer_types`, or inferred as upstream does)."""
    count: int
    elements_per_token: int
    """Numbers one layer caches per token and sequence: KV heads x (K head dim + V head dim), the
    compressed latent for MLA models (kv_lora_rank + qk_rope_head_dim), plus an indexer key if any.
    0 for layers that keep no per-token entry."""
    window: int | None = None
    """At most this many tokens are kept (sliding or chunked attention); None: the whole context."""

    @property
    def per_token(self) -> bool:
        return self.elements_per_token > 0

    def tokens_kept(self, context: int) -> int:
        """Tokens of a `context`-token sequence this layer holds (the window, at most)."""
        return context if self.window is None else min(context, self.window)


@dataclass(frozen=True)
class GenerationFacts:
    """What generation depends on in the model, read from its config and class (no weights).

    Build it with `read_generation_facts(config)`; tests may build one by hand.
    """

    layers: tuple[KvLayers, ...]
    max_positions: int | None = None
    """`max_position_embeddings` (or `n_positions`): the longest context the model was built for."""
    encoder_decoder: bool = False
    supports_cache: bool = True
    """generate() builds a Cache for it (`GenerationMixin._supports_default_dynamic_cache`)."""
    compiles_fullgraph: bool = True
    """The class's `_can_compile_fullgraph`: its forward traces into one graph under torch.compile."""
    checkpoint_cache_implementation: str | None = None
    """`cache_implementation` set by the checkpoint's generation_config.json, if any."""
    notes: tuple[str, ...] = ()
    """What could not be read exactly (unknown layer types, missing sizes)."""

    def kv_bytes(self, batch: int, context: int, dtype_bytes: int) -> int:
        """Bytes the per-token KV entries of `batch` sequences of `context` tokens take.

        Fixed-size linear-attention/convolution states are not included (see `state_layers`).
        """
        return batch * dtype_bytes * sum(g.count * g.elements_per_token * g.tokens_kept(context) for g in self.layers)

    def bytes_per_token(self, dtype_bytes: int, *, beyond_windows: bool = False) -> int:
        """Bytes one more token of one sequence adds: every caching layer, or with
        `beyond_windows=True` only the layers without a window (past every window)."""
        return dtype_bytes * sum(
            g.count * g.elements_per_token for g in self.layers if not (beyond_windows and g.window is not None)
        )

    @property
    def state_layers(self) -> int:
        """Layers with no per-token KV (linear attention, convolution, or none at all)."""
        return sum(g.count for g in self.layers if not g.per_token)


@dataclass(frozen=True)
class GenerationPlan:
    """The generation settings of a Plan (`plan.generation`), each a Decision with its reason.

    - `generate_kwargs`: what to pass to `model.generate(...)` to get the planned cache (empty when
      transformers' own default is the plan).
    - `padding_side`: the tokenizer padding side for batched inputs ("left" for decoder-only).
    - `kv_bytes_per_token`, `max_batch`, `max_context`: the KV-cache arithmetic behind the decisions.

    Built by `plan(..., generate=True)` (and by `load()` for a causal or seq2seq LM, decided again
    with the attention and dtype really applied); `explain()` shows its decisions.

    Attributes:
        decisions: One `Decision` per generation setting: "generation.kv_cache",
            "generation.max_batch", "generation.cache_implementation", "generation.compile",
            "generation.continuous_batching", "generation.padding_side".
        generate_kwargs: What to pass to `model.generate(...)` to get the planned cache (e.g.
            `{"cache_implementation": "static"}`); empty when transformers' own default is the plan.
        padding_side: The tokenizer padding side for batched inputs: "left" for decoder-only
            models, "right" for encoder-decoder ones, or yours (`tokenizer_for()` follows it).
        cache_implementation: The planned cache: "dynamic", "static", "offloaded",
            "offloaded_static", "quantized" (yours, or the checkpoint's generation_config), or
            None when the model builds its own cache.
        compile: generate() will torch.compile the forward (upstream's `_valid_auto_compile_criteria`).
        context: The context (prompt + new tokens) `max_batch` is computed for.
        kv_bytes_per_token: Bytes one token of one sequence adds to the KV cache, all caching
            layers (within windows).
        max_batch: Sequences of `context` tokens whose KV cache fits in the budget; None when
            memory is unknown.
        max_context: The longest single sequence whose KV cache fits (capped at the model's max
            positions); None when memory is unknown.
        budget_bytes: Bytes the KV cache may use: a share of the GPU memory (or, on a CPU, the
            RAM) left beside the weights; None when unknown.
        dtype: The dtype the KV cache is sized in (the model's).
        facts: The model's generation facts (KV layout, max positions) the decisions used.
        warnings: Generation settings that work but cost you (also shown by the plan's explain()).
        inputs: The policy's other inputs (machine, attention, placement...), kept so `load()` can
            decide again with what was really applied.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> h100 = cudaload.Machine.simulated("H100")
        >>> generation = cudaload.plan(path, machine=h100, generate=True, workload="decode-heavy").generation
        >>> generation.cache_implementation, generation.compile, generation.generate_kwargs
        ('static', True, {'cache_implementation': 'static'})
        >>> generation.kv_bytes_per_token, generation.max_context  # 2 layers x K+V x 2 kv heads x 16 x 2 bytes
        (256, 256)
        >>> generation.decision("generation.padding_side").value
        'left'
    """

    decisions: tuple[Decision, ...]
    generate_kwargs: Mapping[str, Any]
    padding_side: str
    cache_implementation: str | None
    compile: bool
    """generate() will torch.compile the forward (upstream's `_valid_auto_compile_criteria`)."""
    context: int
    """The context (prompt + new tokens) `max_batch` is computed for."""
    kv_bytes_per_token: int
    """Bytes one token of one sequence adds to the KV cache, all caching layers (within windows)."""
    max_batch: int | None
    """Sequences of `context` tokens whose KV cache fits in the budget; None when memory is unknown."""
    max_context: int | None
    """The longest single sequence whose KV cache fits (capped at the model's max positions)."""
    budget_bytes: int | None
    dtype: str
    facts: GenerationFacts
    warnings: tuple[str, ...] = ()
    inputs: Mapping[str, Any] = field(default_factory=dict)
    """The policy's other inputs (machine, attention, placement...), kept so `load()` can decide
    again with what was really applied."""

    def decision(self, setting: str) -> Decision:
        for d in self.decisions:
            if d.setting == setting:
                return d
        raise KeyError(setting)

    def kv_cache_bytes(self, batch: int, context: int) -> int:
        """KV-cache bytes for `batch` sequences of `context` tokens in the plan's dtype."""
        from .facts.dtypes import BYTES

        return self.facts.kv_bytes(batch, context, BYTES.get(self.dtype, 4))

    def to_dict(self) -> dict[str, Any]:
        return {
            "generate_kwargs": jsonable(self.generate_kwargs),
            "padding_side": self.padding_side,
            "cache_implementation": self.cache_implementation,
            "compile": self.compile,
            "context": self.context,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_batch": self.max_batch,
            "max_context": self.max_context,
            "budget_bytes": self.budget_bytes,
            "dtype": self.dtype,
            "layers": [
                {
                    "layer_type": g.layer_type,
                    "count": g.count,
                    "elements_per_token": g.elements_per_token,
                    "window": g.window,
                }
                for g in self.facts.layers
            ],
            "decisions": [d.to_dict() for d in self.decisions],
            "warnings": list(self.warnings),
        }

    def explain_lines(self, value_width: int = 36) -> list[str]:
        """The generation block of `Plan.explain()`."""
        lines = [f"  generation (context {self.context} tokens):"]
        width = max(len(d.setting) for d in self.decisions)
        for d in self.decisions:
            mark = " (set by you)" if d.source == "user" else ""
            lines.append(f"    {d.setting:<{width}}  {_short(d.value, value_width):<{value_width}}  {d.reason}{mark}")
            for r in d.rejected:
                lines.append(f"    {'':<{width}}  x {_short(r.value, value_width - 2):<{value_width - 2}}  {r.reason}")
        lines += [f"    WARNING: {w}" for w in self.warnings]
        return lines

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _int(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _elements_per_token(layer_config: Any, layer_type: str) -> tuple[int, str | None]:
    """(numbers cached per token by one layer, a note when a size had to be guessed)."""
    if layer_type in STATE_TYPES:
        return 0, None
    note = None
    latent = _int(layer_config, "kv_lora_rank")
    if latent is not None:
        # MLA (DeepSeek V2/V3 and kin): transformers caches the compressed latent and the rotary key
        # as two single-head tensors (modeling_deepseek_v3.py: "Cache read / write is performed while
        # latent KV is still compressed").
        elements = latent + (_int(layer_config, "qk_rope_head_dim") or 0)
    else:
        heads = _int(layer_config, "num_attention_heads", "n_head")
        kv_heads = _int(layer_config, "num_key_value_heads") or heads
        hidden = _int(layer_config, "hidden_size", "n_embd", "d_model")
        head_dim = _int(layer_config, "head_dim") or (hidden // heads if hidden and heads else None)
        if kv_heads is None or head_dim is None:
            return 0, f"{layer_type}: the config gives no attention heads or head size; its cache is not counted"
        v_dim = _int(layer_config, "v_head_dim") or head_dim
        k_dim = _int(layer_config, "qk_head_dim") or head_dim
        elements = kv_heads * (k_dim + v_dim)
    if layer_type == "indexed_attention":
        elements += _int(layer_config, "index_head_dim") or 0
    if layer_type not in PER_TOKEN_TYPES | WINDOW_TYPES:
        note = f"layer type {layer_type!r} is new to cudaload: counted as full attention"
    return elements, note


def _layer_types(config: Any) -> tuple[list[str], list[dict[str, Any]], list[Any]]:
    """Layer types and per-layer cache kwargs exactly as transformers builds its caches."""
    layers = _int(config, "num_hidden_layers", "n_layer", "num_layers") or 0
    per_layer = list(getattr(config, "per_layer_config", None) or [config] * layers)
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # older transformers: the same inference, by hand
        types = list(getattr(config, "layer_types", None) or [])
        if not types:
            for c in per_layer:
                window = getattr(c, "sliding_window", None)
                chunk = getattr(c, "attention_chunk_size", None)
                types.append("sliding_attention" if window else "chunked_attention" if chunk else "full_attention")
        kwargs: list[dict[str, Any]] = [
            {"sliding_window": getattr(c, "sliding_window", None) or getattr(c, "attention_chunk_size", None)}
            if t in WINDOW_TYPES
            else {}
            for t, c in zip(types, per_layer, strict=False)
        ]
        return types, kwargs, per_layer
    types, kwargs = get_layer_types_and_kwargs(config)
    return list(types), list(kwargs), per_layer


def read_generation_facts(
    config: Any, model_class: type | None = None, generation_config: Mapping[str, Any] | None = None
) -> GenerationFacts:
    """The KV-cache layout and generation flags of a model, from its config (no weights).

    Args:
        config: a transformers `PretrainedConfig` (the whole model's; its decoder text config is used).
        model_class: the model class (for `_can_compile_fullgraph` and whether generate() builds a
            Cache for it); None when unknown.
        generation_config: the checkpoint's generation_config.json as a dict, if it has one
            (`checkpoint_generation_config(path)`).

    Example::

        from transformers import AutoConfig
        facts = read_generation_facts(AutoConfig.from_pretrained("Qwen/Qwen3-0.6B"))
        facts.bytes_per_token(2)   # bf16 KV bytes per token: 28 layers x 8 heads x 256 x 2
    """
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types, kwargs, per_layer = _layer_types(text)
    groups: dict[tuple[str, int, int | None], int] = {}
    notes: list[str] = []
    for layer_type, layer_kwargs, layer_config in zip(
        types, kwargs, per_layer, strict=False
    ):  # kv-shared layers come last
        elements, note = _elements_per_token(layer_config, layer_type)
        if note and note not in notes:
            notes.append(note)
        window = layer_kwargs.get("sliding_window") if layer_type in WINDOW_TYPES else None
        key = (layer_type, elements, int(window) if window else None)
        groups[key] = groups.get(key, 0) + 1
    supports_cache = True
    fullgraph = False  # unknown class (remote code): do not count on compiling it
    if model_class is not None:
        check = getattr(model_class, "_supports_default_dynamic_cache", None)
        supports_cache = bool(check()) if callable(check) else True
        fullgraph = bool(getattr(model_class, "_can_compile_fullgraph", False))
    checkpoint_cache = (generation_config or {}).get("cache_implementation")
    if checkpoint_cache == "hybrid":
        # generate() unsets a checkpoint's "hybrid" (the old static sliding cache) and uses the
        # dynamic sliding-window cache instead (generation/utils.py, `_prepare_generation_config`).
        checkpoint_cache = None
    return GenerationFacts(
        layers=tuple(KvLayers(t, n, e, w) for (t, e, w), n in groups.items()),
        max_positions=_int(text, "max_position_embeddings", "n_positions"),
        encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
        supports_cache=supports_cache,
        compiles_fullgraph=fullgraph,
        checkpoint_cache_implementation=str(checkpoint_cache) if checkpoint_cache else None,
        notes=tuple(notes),
    )


def checkpoint_generation_config(source: str, revision: str | None = None) -> dict[str, Any]:
    """The checkpoint's generation_config.json as a dict ({} when it has none or it cannot be read)."""
    import os

    path = os.path.join(source, "generation_config.json")
    if not os.path.isdir(source):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source, "generation_config.json", revision=revision)
        except Exception:  # an id the cache helper rejects: no generation config to read
            return {}
        if not isinstance(cached, str):
            return {}
        path = cached
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
