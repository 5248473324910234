"""What the policy knows about a model: `ModelFacts`, plain data (no reading, no deciding).

`read_model_facts()` (cudaload/capability/model_config.py) builds them from a config; the policy takes them as
arguments, and tests build them by hand (`any_model()`, `reference_model()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..frozen import frozen
from ..upstream import FP16_FRAGILE_FAMILIES
from .kv_cache import GenerationFacts
from .stored_weights import CheckpointQuantization

__all__ = ["NAMED_FLAGS", "ModelFacts", "any_model", "generates", "multimodal_generator", "reference_model"]

NAMED_FLAGS = {
    "_supports_flash_attn": "supports_flash",
    "_supports_sdpa": "supports_sdpa",
    "_supports_flex_attn": "supports_flex",
}
"""The model-class attention flags ModelFacts names as fields (FlashAttention, SDPA, flex); every other flag an
attention backend's record names (facts/attention_backends.py) is kept in `ModelFacts.class_flags`."""


def generates(class_name: str) -> bool:
    """Whether a transformers class (Auto or model class, by name) generates text: a causal or a
    sequence-to-sequence LM, the classes with a `generate()` that plans a KV cache."""
    return any(kind in class_name for kind in ("CausalLM", "Seq2SeqLM"))


_GENERATING_HEADS = ("ConditionalGeneration", "ImageTextToText", "SpeechSeq2Seq", "Vision2Seq", "TextToWaveform")
"""Class-name parts of transformers' speech and image-text models that have `generate()` (Whisper, LLaVA, ...),
whose generation cudaload does not plan."""


def multimodal_generator(*class_names: str) -> bool:
    """Whether a class (Auto or model class, by name) generates from speech or images: it has `generate()`, but
    not the text LM's KV cache `generates` plans (WhisperForConditionalGeneration, AutoModelForImageTextToText)."""
    return any(part in name for name in class_names for part in _GENERATING_HEADS)


@frozen
class ModelFacts:
    """What the policy knows about a model, read from its config and class alone (no weights).

    `read_model_facts()` builds it; `plan()` accepts it in place of a model (for planning a model
    without its files, e.g. in tests); with `generate=True` only facts that carry `generation`.

    Attributes:
        source: Where the config came from: the path or Hub id (a config object's `_name_or_path`).
        model_type: The config's `model_type` (e.g. "qwen3", "llama", "gpt2").
        model_class: The class the Auto class resolves to (e.g. "Qwen3ForCausalLM").
        auto_class: The Auto class it was resolved with (e.g. "AutoModelForCausalLM").
        supports_flash: The class supports FlashAttention (`_supports_flash_attn`).
        supports_sdpa: The class supports torch SDPA (`_supports_sdpa`).
        supports_flex: The class supports flex attention (`_supports_flex_attn`).
        parameters: Exact count of the model's parameters (tied weights counted once).
        checkpoint_dtype: "float32", "float16" or "bfloat16" from the config (or, without one,
            the safetensors header); None when unknown.
        head_dim: The attention head dimension; None when unknown.
        num_layers: Decoder layers; None when unknown.
        hidden_size: Hidden size; None when unknown.
        sliding_window: The sliding attention window in tokens; None without one.
        softcap: `attn_logit_softcapping` (Gemma 2): a FlashAttention kernel must take `softcap`
            (FA2 from 2.6.0, FA3, FA4); SDPA never does, and the classes that pass it declare no
            SDPA support. None without it.
        quantized: The checkpoint's `quantization_config.quant_method` (e.g. "bitsandbytes",
            "gptq"), if already quantized; else None.
        remote_code: The config has an `auto_map` (the repository ships its own code).
        linear_names: Leaf names of the nn.Linear layers in the decoder (LoRA targets), lm_head
            excluded.
        linear_shapes: (leaf name, in_features, out_features, how many) for those layers.
        vocab_size: The vocabulary size; None when unknown.
        conv1d: Projections are transformers' Conv1D (GPT-2 style), not nn.Linear.
        head_dims: Every attention head dimension the config declares: a FlashAttention kernel
            must support each. Empty when unknown.
        qk_v_head_dims: (query-key, value) head dims when they differ (MLA); else None.
        expert_parameters: Fused MoE expert weights (3-D parameters), which LoRA reaches through
            peft's `target_parameters`; empty for dense models.
        compatible_flash: The class's `_compatible_flash_implementations`, or None.
        attention_heads: `num_attention_heads`; None when unknown.
        kv_heads: `num_key_value_heads` (= heads without GQA); None when unknown.
        tp_plan: The config has a `base_model_tp_plan` (`tp_plan="auto"` can shard it).
        quantization: How an already-quantized checkpoint stores its weights (its
            `quantization_config`: method, bits per weight, how many weights); None when it is not.
        final_softcap: `final_logit_softcapping` (Gemma 2): tanh on the logits keeps a copy of them
            for the backward (counted by the training-memory estimate). None without it.
        generation: The KV-cache layout and generation flags (`GenerationFacts`), read from the
            same config; None when cudaload cannot read one from it, or in facts built by hand.
        attention_sinks: The attention layers hold learnable sinks (a `sinks` parameter per layer, gpt-oss):
            a FlashAttention kernel must take them (`s_aux` / `learnable_sink`), in bf16 only.
        sub_model_sdpa: For a composite model (LLaVA, GOT-OCR2), each sub-config's name and whether the
            model class built from it supports SDPA; empty for a model of one part.
        class_flags: (flag, value) of each model-class flag a registered attention backend names beyond the three
            above (`AttentionBackend.class_flag`); read them with `supports(flag)`.
        no_split_modules: The class's `_no_split_modules`, what FSDP2 wraps one by one.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> facts = cudaload.read_model_facts(str(build_tiny_model(tempfile.mkdtemp())))
        >>> facts.model_type, facts.model_class, facts.checkpoint_dtype, facts.num_layers, facts.kv_heads
        ('qwen3', 'Qwen3ForCausalLM', 'bfloat16', 2, 2)
        >>> facts.linear_names
        ('down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj')
    """

    source: str
    model_type: str
    model_class: str
    auto_class: str
    supports_flash: bool
    supports_sdpa: bool
    supports_flex: bool
    parameters: int
    """Exact count of the model's parameters (tied weights counted once)."""
    checkpoint_dtype: str | None = None
    head_dim: int | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    sliding_window: int | None = None
    softcap: float | None = None
    """`attn_logit_softcapping` (Gemma 2): SDPA cannot apply it; of the FlashAttention kernels only
    FA2 is known to (transformers raises for a kernel without it)."""
    quantized: str | None = None
    """The checkpoint's `quantization_config.quant_method`, if already quantized."""
    remote_code: bool = False
    linear_names: tuple[str, ...] = ()
    """Leaf names of the nn.Linear layers in the decoder (LoRA targets), lm_head excluded."""
    linear_shapes: tuple[tuple[str, int, int, int], ...] = ()
    """(leaf name, in_features, out_features, how many) for those layers."""
    vocab_size: int | None = None
    conv1d: bool = False
    """Projections are transformers' Conv1D (GPT-2 style), not nn.Linear."""
    head_dims: tuple[int, ...] = ()
    """Every attention head dimension the config declares (head_dim, sliding/global variants, MLA's
    query-key and value dims): a FlashAttention kernel must support each. Empty when unknown."""
    qk_v_head_dims: tuple[int, int] | None = None
    """(query-key, value) head dims when they differ (MLA, e.g. DeepSeek's 192/128)."""
    expert_parameters: tuple[str, ...] = ()
    """Fused MoE expert weights (3-D nn.Parameters such as `mlp.experts.gate_up_proj`, named from the
    layer down): transformers 5 fuses experts, so `target_modules` cannot reach them; peft's
    `target_parameters` can."""
    compatible_flash: tuple[str, ...] | None = None
    """The class's `_compatible_flash_implementations`: transformers replaces any other
    FlashAttention request with the first of these it can run (modeling_utils.py)."""
    attention_heads: int | None = None
    kv_heads: int | None = None
    """`num_attention_heads` and `num_key_value_heads` (= heads without GQA): tensor parallelism splits
    heads, so both must divide the TP size."""
    tp_plan: bool = False
    """The config has a `base_model_tp_plan`: `tp_plan="auto"` can shard it (transformers' `supports_tp_plan`)."""
    quantization: CheckpointQuantization | None = None
    """How an already-quantized checkpoint stores its weights (facts/stored_weights.py); None when it is not."""
    final_softcap: float | None = None
    """`final_logit_softcapping` (Gemma 2): the logits pass through tanh, which keeps a copy of them for
    the backward (policy/memory.py counts it). None without it."""
    generation: GenerationFacts | None = None
    """The KV-cache layout and generation flags (facts/kv_cache.py), read from the same config."""
    attention_sinks: bool = False
    """Learnable attention sinks (gpt-oss's `self.sinks = nn.Parameter(...)`,
    transformers 5.22-5.25 models/gpt_oss/modeling_gpt_oss.py: GptOssAttention.__init__): transformers hands them
    to a FlashAttention kernel as `s_aux` or `learnable_sink` and silently drops them for a kernel that takes neither
    (transformers 5.22-5.25 modeling_flash_attention_utils.py: _process_flash_attention_kwargs)."""
    sub_model_sdpa: tuple[tuple[str, bool], ...] = ()
    """(sub-config name, its model class supports SDPA) per sub-model: transformers decides attention per
    sub-model (configuration_utils.py: `PreTrainedConfig._attn_implementation`'s setter takes a dict by
    sub-config name, 5.22 and 5.25), so a top class without SDPA can hold a language model with it."""

    class_flags: tuple[tuple[str, bool], ...] = ()
    """(flag, value) of each model-class flag an attention backend's record names beyond supports_flash,
    supports_sdpa and supports_flex (facts/attention_backends.py: AttentionBackend.class_flag)."""
    no_split_modules: tuple[str, ...] = ()
    """The class's `_no_split_modules` (its decoder layer classes): what FSDP2 wraps one by one
    (`fsdp_config["transformer_layer_cls_to_wrap"]`). Empty when the class names none."""

    def supports(self, flag: str) -> bool:
        """The model class's attention flag `flag` (e.g. "_supports_sdpa"): a named field for the three
        ModelFacts names (NAMED_FLAGS), else `class_flags`; False for a flag that was not read."""
        field = NAMED_FLAGS.get(flag)
        return bool(getattr(self, field)) if field is not None else dict(self.class_flags).get(flag, False)

    @property
    def generates(self) -> bool:
        """A causal or sequence-to-sequence LM: a model whose plan can have a generation section."""
        return generates(self.auto_class)

    def __post_init__(self) -> None:
        # The facts cache stores `dataclasses.asdict` output as JSON: a quantization comes back as a mapping.
        if isinstance(self.quantization, Mapping):
            object.__setattr__(self, "quantization", CheckpointQuantization.from_json(self.quantization))

    @property
    def linear_parameters(self) -> int:
        """Weights in those layers: what 4-/8-bit quantization shrinks."""
        return sum(fan_in * fan_out * count for _, fan_in, fan_out, count in self.linear_shapes)

    @property
    def shape_key(self) -> str:
        """The model's shape as one string: architecture, sizes, linear layers and checkpoint dtype.

        Two checkpoints with the same key run the same computation at the same speed, so a
        benchmark of one (a tuning record) applies to the other.
        """
        linears = ",".join(f"{name}:{fan_in}x{fan_out}x{count}" for name, fan_in, fan_out, count in self.linear_shapes)
        return (
            f"{self.model_class} params={self.parameters} layers={self.num_layers} hidden={self.hidden_size} "
            f"head_dim={self.head_dim} vocab={self.vocab_size} dtype={self.checkpoint_dtype} linears={linears}"
        )

    @property
    def intermediate_size(self) -> int | None:
        """The widest decoder projection (the MLP's), from the linear layers; None when unknown."""
        return max((max(fan_in, fan_out) for _, fan_in, fan_out, _ in self.linear_shapes), default=None)

    @property
    def fp16_fragile(self) -> bool:
        return self.model_type in FP16_FRAGILE_FAMILIES


def any_model() -> ModelFacts:
    """A bf16 model that supports every attention backend: asks "what would I get here?"."""
    return ModelFacts(
        source="(any model supporting FlashAttention and SDPA)",
        model_type="llama",
        model_class="a model",
        auto_class="AutoModelForCausalLM",
        supports_flash=True,
        supports_sdpa=True,
        supports_flex=True,
        parameters=0,
        checkpoint_dtype="bfloat16",
    )


def reference_model() -> ModelFacts:
    """any_model() with the shape of Llama-3.2-1B (16 layers, hidden 2048, MLP 8192, vocab 128256):
    a concrete size for "what dtype would a measured plan pick here?" (`cudaload doctor`)."""
    layers = 16
    shapes = (
        ("down_proj", 8192, 2048, layers),
        ("gate_proj", 2048, 8192, layers),
        ("k_proj", 2048, 512, layers),
        ("o_proj", 2048, 2048, layers),
        ("q_proj", 2048, 2048, layers),
        ("up_proj", 2048, 8192, layers),
        ("v_proj", 2048, 512, layers),
    )
    return replace(
        any_model(),
        source="a Llama-3.2-1B-shaped model",
        parameters=1_235_814_400,
        head_dim=64,
        num_layers=layers,
        hidden_size=2048,
        vocab_size=128_256,
        linear_names=tuple(name for name, *_ in shapes),
        linear_shapes=shapes,
    )
