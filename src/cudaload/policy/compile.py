"""Whether generate() will torch.compile the forward on a plan, and whether continuous batching captures
CUDA graphs: the generation section's compile decisions (policy/generation.py composes them)."""

from __future__ import annotations

from ..facts.kv_cache import STATIC_CACHES, GenerationFacts
from ..facts.machine import Machine
from ..plans import Decision
from ..upstream import COMPILEABLE_QUANT_METHODS
from .attention import is_flash_attention

__all__ = ["NOT_FULLGRAPH", "decide_compile", "decide_continuous_batching", "why_not_compiled"]


def _transformers_at_least(machine: Machine, minimum: str) -> bool:
    return machine.software.at_least("transformers", minimum)


def why_not_compiled(machine: Machine, facts: GenerationFacts, quantized: str | None, offloaded: bool) -> str | None:
    """Why generate() will not auto-compile on this plan (None when it would with a static cache)."""
    if not machine.gpus:
        # transformers 5.22-5.25 generation/utils.py: GenerationMixin._valid_auto_compile_criteria asks for
        # `self.device.type in ["cuda", "xpu", "neuron", "tpu"]` in 5.22-5.24; 5.25.0 adds "mps". A CPU never qualifies.
        devices = "cuda/xpu/neuron/tpu/mps" if _transformers_at_least(machine, "5.25") else "cuda/xpu/neuron/tpu"
        return f"no CUDA GPU (generate() compiles only on {devices}; never on a CPU)"
    if quantized is not None and quantized not in COMPILEABLE_QUANT_METHODS:
        return f"{quantized}-quantized models are not compileable (their `HfQuantizer.is_compileable` is False)"
    if offloaded:
        return "weights offloaded to CPU/disk (`_valid_auto_compile_criteria` refuses offloaded models)"
    if facts.model_type is not None and "llama4" in facts.model_type:
        return (
            "transformers returns llama4's forward uncompiled (5.22-5.25 modeling_utils.py: "
            "PreTrainedModel.get_compiled_call)"
        )
    # `_can_compile_fullgraph` is no blocker: `_valid_auto_compile_criteria` (generation/utils.py, 5.22-5.25)
    # never reads it, so generate() compiles such a class too; `_cache_decision` weighs it instead.
    return None


# Why a static cache is not chosen for a class that does not declare `_can_compile_fullgraph`.
NOT_FULLGRAPH = (
    "the model class does not declare `_can_compile_fullgraph`: generate() would compile it all the same "
    "(`_valid_auto_compile_criteria` does not read the flag), but graph breaks would eat the gain"
)


def decide_compile(
    facts: GenerationFacts, cache: Decision, blocker: str | None, compiles: bool, attention: str
) -> Decision:
    if not compiles:
        static = cache.value in STATIC_CACHES
        why = blocker if static else f"the cache is {cache.value or 'the model own'}, not static"
        return Decision(
            "generation.compile", False, f"generate() does not compile: {why} (`_valid_auto_compile_criteria`)"
        )
    reason = (
        "generate() compiles the forward itself with a static cache on a GPU (`_valid_auto_compile_criteria`), "
        'default CompileConfig mode "reduce-overhead" (CUDA graphs)'
    )
    if is_flash_attention(attention):
        reason += "; with FlashAttention transformers turns fullgraph off (FA breaks the graph)"
    if not facts.compiles_fullgraph:
        reason += (
            "; the class does not declare `_can_compile_fullgraph` (not read by `_valid_auto_compile_criteria`): "
            "expect graph breaks"
        )
    return Decision("generation.compile", "reduce-overhead (CUDA graphs)", reason)


def decide_continuous_batching(machine: Machine, attention: str) -> Decision:
    graphs = bool(machine.gpus) and is_flash_attention(attention)
    return Decision(
        "generation.continuous_batching",
        "CUDA graphs, no compile" if graphs else "no CUDA graphs, no compile",
        (
            "generate_batch() would capture CUDA graphs: FlashAttention needs no attention mask"
            if graphs
            else "generate_batch() would not capture CUDA graphs: "
            + ("no GPU" if not machine.gpus else f"{attention} needs an attention mask, and padding it costs more")
        )
        + " (`decide_use_cuda_graphs`); it compiles nothing by default (default_compile_level 0). Agreed: "
        "graphs pay where the shapes need no mask",
    )
