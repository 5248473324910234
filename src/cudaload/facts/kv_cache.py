"""A model's KV-cache layout, as plain data: which decoder layers cache what per token.

`capability/kv_layout.py` reads it from a config (as transformers' caches do); the policy
(`policy/generation.py`) sizes caches and batches from it; tests build it by hand.
"""

from __future__ import annotations

from ..frozen import frozen

__all__ = [
    "CACHE_IMPLEMENTATIONS",
    "CHECKPOINT_STATIC_CACHES",
    "PER_TOKEN_TYPES",
    "STATE_TYPES",
    "STATIC_CACHES",
    "WINDOW_TYPES",
    "GenerationFacts",
    "KvLayers",
]

CACHE_IMPLEMENTATIONS = ("dynamic", "static", "offloaded", "offloaded_static", "quantized")
"""`cache_implementation` values generate() builds a cache for (transformers 5.22-5.24,
generation/configuration_utils.py: STATIC_CACHE_IMPLEMENTATIONS + DYNAMIC_CACHE_IMPLEMENTATIONS;
"paged" switches generate() to continuous batching and is not planned here)."""

CHECKPOINT_STATIC_CACHES = ("sliding_window", "hybrid_chunked", "offloaded_hybrid", "offloaded_hybrid_chunked")
"""Old names a checkpoint's generation_config may still carry that generate() builds as a static cache
(transformers 5.22-5.25 generation/configuration_utils.py: DEPRECATED_STATIC_CACHE_IMPLEMENTATIONS, part of
ALL_STATIC_CACHE_IMPLEMENTATIONS; `GenerationMixin._prepare_cache_for_generation` warns and builds a StaticCache).
"hybrid" is not one: `GenerationMixin._prepare_generation_config` unsets it, so Gemma 2/3 checkpoints get the
dynamic sliding-window cache (capability/kv_layout.py reads it so). cudaload never plans these names."""

STATIC_CACHES = ("static", "offloaded_static", *CHECKPOINT_STATIC_CACHES)
"""Every cache_implementation generate() builds as a static cache, and so may compile the forward for."""

# How each upstream cache layer type (cache_utils.DYNAMIC_LAYER_TYPE_MAPPING) stores tokens.
PER_TOKEN_TYPES = frozenset({"full_attention", "hybrid", "indexed_attention"})
"""One K and one V entry per token, for the whole context ("hybrid" also keeps a linear state)."""
WINDOW_TYPES = frozenset({"sliding_attention", "chunked_attention", "hybrid_sliding", "reference_sliding_attention"})
"""Per token, but only the last `sliding_window` (or `attention_chunk_size`) tokens."""
STATE_TYPES = frozenset({"conv", "linear_attention", "moe", "mlp", "dummy"})
"""No per-token entry: a fixed-size convolution/recurrent state per sequence, or nothing."""


@frozen
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


@frozen
class GenerationFacts:
    """What generation depends on in the model, read from its config and class (no weights).

    Read into `ModelFacts.generation` by `read_model_facts()` (`capability/kv_layout.py`); tests may
    build one by hand.
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
    model_type: str | None = None
    """The config's `model_type` (transformers returns llama4's forward uncompiled, whatever the cache)."""
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
