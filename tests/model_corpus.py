"""A corpus of tiny random models: every causal-LM family the installed transformers ships that builds
small from its config class, plus one of each other kind (encoder, encoder-decoder, speech, vision,
multimodal). Shared by the corpus tests (tests/test_model_corpus.py): one load per family, which any
number of checks (`CHECKS` there) then look at.

How a family is built (DESIGN.md section 4, "Breadth"): start from the config class's defaults, shrink
every size field (nested text/vision/audio sub-configs too), cut per-layer lists and per-layer tables to
the new layer count, keep special token ids inside the shrunk vocabulary. A type whose config refuses
every shrunk variant, or whose model is still over `MAX_PARAMETERS`, is left out with the reason
(`Corpus.left_out`): the corpus says what it does not cover.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cudaload
from cudaload import CudaloadError

# The most a size field may keep; a larger default is cut to this (only ever down).
SIZES = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim", "embedding_size"), 64),
    **dict.fromkeys(("word_embed_proj_dim", "emb_dim", "hidden_size_global"), 64),
    "projection_dim": 32,
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim"), 128),
    **dict.fromkeys(("ffn_hidden_size", "hidden_dim", "inner_hidden_size"), 128),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size"), 32),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads"), 4),
    **dict.fromkeys(("encoder_attention_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("head_dim", "kv_channels", "v_head_dim", "kv_lora_rank", "q_lora_rank"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "rope_dim", "rotary_dim"), 8),
    **dict.fromkeys(("vocab_size", "vocab_size_per_layer_input", "encoder_hash_byte_group_vocab", "n_words"), 256),
    "unpadded_vocab_size": 256,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), 128),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_k"), 2),
    **dict.fromkeys(("n_group", "topk_group"), 1),
    **dict.fromkeys(("linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"), 16),
    "linear_num_key_heads": 2,
    **dict.fromkeys(("image_size",), 32),
    "patch_size": 8,
    "num_mel_bins": 16,
    **dict.fromkeys(("max_source_positions", "max_target_positions"), 64),
    **dict.fromkeys(("sliding_window", "local_attention_window_len"), 32),
}
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
DEPTH_FIELDS = (*LAYER_FIELDS, "encoder_layers", "decoder_layers", "num_decoder_layers")
# Tried in order until the config class accepts the shrunk values and the model builds: some configs
# require as many key/value heads as query heads, a hybrid needs more layers to hold one of each kind.
# A variant whose model's forward fails on the check input (a rotary width that no longer fits the head,
# a hybrid cut to linear-attention layers only) is not a model anyone ships: the next one is tried.
VARIANTS: tuple[dict[str, int], ...] = (
    {},
    dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads"), 4),
    dict.fromkeys(DEPTH_FIELDS, 4),
    {**dict.fromkeys(DEPTH_FIELDS, 4), **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "rope_dim"), 16)},
    dict.fromkeys(DEPTH_FIELDS, 8),
)
MAX_PARAMETERS = 20_000_000  # "builds in a few seconds" on a 2-core CI box, saving included


def shrink(values: dict[str, Any], sizes: dict[str, int], depth: int = 0) -> dict[str, Any]:
    """The keyword arguments that rebuild a config (its `to_dict()`) small. At the top level only the
    changed fields (the class derives the rest from them, e.g. `layer_types` from the layer count); a
    nested sub-config is passed whole, since its parent builds it from that dict alone."""
    layers = next((values[k] for k in LAYER_FIELDS if isinstance(values.get(k), int)), None)
    new_layers = next((sizes[k] for k in LAYER_FIELDS if k in values and k in sizes), 2)
    vocab = values.get("vocab_size")
    top = min(vocab, sizes["vocab_size"]) - 1 if isinstance(vocab, int) and vocab > 0 else None
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shrink(value, sizes, depth + 1)
        elif key in sizes and type(value) is int and value > sizes[key]:
            out[key] = sizes[key]
        elif key == "head_dim" and value is None and "num_attention_heads" in values:
            out[key] = sizes[key]  # some classes (Ministral) leave it None in the defaults and need it set
        elif top is not None and key.endswith(("token_id", "token_index")) and type(value) is int and value > top:
            out[key] = top
        elif top is not None and key.endswith("token_id") and isinstance(value, list):
            out[key] = [min(v, top) if type(v) is int else v for v in value]
        elif key == "mrope_section" and isinstance(value, list) and len(value) == 3:
            out[key] = [2, 3, 3]  # multimodal rotary sections sum to half the shrunk head (16)
        elif isinstance(value, dict) and key == "rope_parameters":
            out[key] = shrink(value, sizes, depth + 1)
        elif isinstance(value, list) and layers and layers > new_layers and len(value) == layers:
            out[key] = value[:new_layers]  # a per-layer list: the first layers' pattern
        elif key.endswith("per_layer_config") and isinstance(value, dict) and value and layers:
            out[key] = _per_layer_table(value, sizes, new_layers)
        elif depth:
            out[key] = value
    if values.get("head_dim") is not None and values.get("head_dim") == values.get("qk_rope_head_dim"):
        out["head_dim"] = out.get("qk_rope_head_dim", values["head_dim"])  # MLA: the rotary part's width (DeepSeek V3)
    rope = out.get("rope_parameters")
    if "_vl" in str(values.get("model_type", "")) and isinstance(rope, dict) and "mrope_section" not in rope:
        # Qwen2-VL's rotary code defaults to sections of a 128-wide head (transformers 5.25
        # modeling_qwen2_vl.py: Qwen2VLRotaryEmbedding reads rope_parameters.get("mrope_section", [16, 24, 24]))
        out["rope_parameters"] = {**rope, "mrope_section": [2, 3, 3]}
    return out


def _per_layer_table(table: dict[str, Any], sizes: dict[str, int], layers: int) -> dict[str, Any]:
    """A heterogeneous config's per-layer overrides (transformers 5.25 `per_layer_config`), kept
    heterogeneous: the entries of the layers that remain, else the first entry moved to the last layer,
    each shrunk to twice the global sizes (so the layer still differs from the others)."""
    doubled = {k: 2 * v for k, v in sizes.items()}
    kept = {k: v for k, v in table.items() if int(k) < layers} or {str(layers - 1): next(iter(table.values()))}
    return {k: shrink(v, doubled, 1) if isinstance(v, dict) else v for k, v in kept.items()}


@dataclass(frozen=True)
class Family:
    """One model of the corpus: its name, config model type and the class it is built and saved with
    (None: AutoModelForCausalLM's class for the type)."""

    name: str
    model_type: str
    model_class: str | None = None
    config: Callable[[], Any] | None = None
    """A hand-written tiny config (for a family whose defaults do not shrink into a valid model); None: shrunk
    from the config class's defaults."""
    prepare: Callable[[Any], None] | None = None
    """Called on the built model before its check forward and save (X-MOD's `set_default_language`)."""


# One of each kind beyond the causal LMs (issue 39: the families the check forward must serve).
OTHER_FAMILIES = (
    Family("bert-encoder", "bert", "BertModel"),
    Family("t5-seq2seq", "t5", "T5ForConditionalGeneration"),
    Family("bart-seq2seq", "bart", "BartForConditionalGeneration"),
    Family("whisper-speech", "whisper", "WhisperForConditionalGeneration"),
    Family("vit-classifier", "vit", "ViTForImageClassification"),
    Family("clip-dual-encoder", "clip", "CLIPModel"),
    Family("llava-image-text", "llava", "LlavaForConditionalGeneration"),
    Family("qwen2_vl-image-text", "qwen2_vl", "Qwen2VLForConditionalGeneration"),
)


def _tiny_vision() -> dict[str, Any]:
    return {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def _blip(config_name: str) -> Callable[[], Any]:
    """BLIP-2 / InstructBLIP: a ViT, a Q-Former and an OPT, with the image token every such checkpoint names."""

    def config() -> Any:
        import transformers

        return getattr(transformers, config_name)(
            vision_config={**_tiny_vision(), "image_size": 32, "patch_size": 8},
            qformer_config={**_tiny_vision(), "encoder_hidden_size": 32, "vocab_size": 256},
            text_config={
                "model_type": "opt",
                "vocab_size": 256,
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "ffn_dim": 64,
                "num_attention_heads": 2,
                "word_embed_proj_dim": 32,
                "max_position_embeddings": 64,
            },
            num_query_tokens=4,
            image_token_index=255,
        )

    return config


def _vision_encoder_decoder(size: int) -> Callable[[], Any]:
    """A ViT of `size` px (32: below the 224 a vision_config-less guess would feed; 384: above it) and a GPT-2."""

    def config() -> Any:
        from transformers import GPT2Config, VisionEncoderDecoderConfig, ViTConfig

        encoder = ViTConfig(**_tiny_vision(), image_size=size, patch_size=8 if size < 100 else 32)
        decoder = GPT2Config(vocab_size=256, n_embd=32, n_layer=1, n_head=2, n_positions=64, add_cross_attention=True)
        built = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
        built.decoder_start_token_id = built.pad_token_id = 0
        return built

    return config


def _musicgen() -> Any:
    from transformers import MusicgenConfig

    codes = 64  # the decoder's start and pad token is the one past the codebook (as musicgen's 2048 of 2048)
    built = MusicgenConfig(
        text_encoder={
            "model_type": "t5",
            "vocab_size": 256,
            "d_model": 32,
            "d_ff": 64,
            "num_layers": 1,
            "num_heads": 2,
        },
        audio_encoder={
            "model_type": "encodec",
            "audio_channels": 1,
            "codebook_size": codes,
            "hidden_size": 16,
            "num_filters": 4,
            "upsampling_ratios": [2, 2],
            "sampling_rate": 800,
            "target_bandwidths": [1.5],
            "codebook_dim": 16,
            "num_residual_layers": 1,
            "compress": 2,
        },
        decoder={
            "vocab_size": codes,
            "pad_token_id": codes,
            "bos_token_id": codes,
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "ffn_dim": 64,
            "num_attention_heads": 2,
            "num_codebooks": 2,
            "max_position_embeddings": 64,
        },
    )
    built.decoder_start_token_id = built.pad_token_id = codes
    return built


_SMALL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 128}


def _hand_written(config_name: str, **values: Any) -> Callable[[], Any]:
    def config() -> Any:
        import transformers

        return getattr(transformers, config_name)(**{**_SMALL, **values})

    return config


def _xmod_default_language(model: Any) -> None:
    model.set_default_language("en_XX")  # written into the config it is saved with


# Families whose defaults do not shrink into a valid model (hybrid Mamba/attention, MLA + MoE, linear
# attention), and the kinds a check forward of token ids alone cannot serve (issue 49 item 2).
HAND_WRITTEN = (
    Family(
        "bamba",
        "bamba",
        config=_hand_written(
            "BambaConfig",
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            attn_layer_indices=[1],  # one Mamba-2 layer, one attention layer
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_d_state=16,
            mamba_chunk_size=16,
        ),
    ),
    Family(
        "jamba",
        "jamba",
        config=_hand_written(
            "JambaConfig",
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=4,
            num_experts_per_tok=2,
            mamba_d_state=8,
            use_mamba_kernels=False,
        ),
    ),
    Family(
        "deepseek_v2",
        "deepseek_v2",
        config=_hand_written(
            "DeepseekV2Config",
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            first_k_dense_replace=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=32,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_group=1,
            topk_group=1,
        ),
    ),
    Family(
        "kimi_linear",
        "kimi_linear",
        config=_hand_written(
            "KimiLinearConfig",
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            layer_types=["linear_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse"],
            num_experts=4,
            num_experts_per_token=2,
            num_shared_experts=1,
            moe_intermediate_size=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            linear_head_dim=16,
            linear_num_heads=4,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    Family("xmod-default-language", "xmod", "XmodForCausalLM", prepare=_xmod_default_language),
    Family("blip2-image-text", "blip-2", "Blip2ForConditionalGeneration", config=_blip("Blip2Config")),
    Family(
        "instructblip-image-text",
        "instructblip",
        "InstructBlipForConditionalGeneration",
        config=_blip("InstructBlipConfig"),
    ),
    Family("ved-32px", "vision-encoder-decoder", "VisionEncoderDecoderModel", config=_vision_encoder_decoder(32)),
    Family("ved-384px", "vision-encoder-decoder", "VisionEncoderDecoderModel", config=_vision_encoder_decoder(384)),
    Family("musicgen-text-to-audio", "musicgen", "MusicgenForConditionalGeneration", config=_musicgen),
)


def families() -> tuple[Family, ...]:
    """Every causal-LM model type the installed transformers maps (sorted; a type of `HAND_WRITTEN` with its
    hand-written config), then `OTHER_FAMILIES` and the rest of `HAND_WRITTEN` the installed transformers has."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    written = {f.name: f for f in HAND_WRITTEN}
    causal = tuple(written.pop(t, Family(t, t)) for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    return (*causal, *OTHER_FAMILIES, *(f for f in written.values() if f.model_type in CONFIG_MAPPING))


def build(family: Family) -> Any:
    """The family's tiny random model (float32, seeded), or raises what the last variant raised."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from cudaload.loaders.verify import check_inputs

    config_class = CONFIG_MAPPING[family.model_type]
    defaults = config_class().to_dict() if family.config is None else {}
    model_class = getattr(transformers, family.model_class or "AutoModelForCausalLM")
    error: Exception | None = None
    for variant in VARIANTS if family.config is None else ({},):
        sizes = {**SIZES, **dict.fromkeys(DEPTH_FIELDS, 2), **variant}
        try:
            config = config_class(**shrink(defaults, sizes)) if family.config is None else family.config()
            torch.manual_seed(0)
            if hasattr(model_class, "from_config"):
                model = model_class.from_config(config, dtype=torch.float32)
            else:
                model = model_class._from_config(config, dtype=torch.float32)
            if family.prepare is not None:
                family.prepare(model)
            inputs, why = check_inputs(model)
            assert inputs, why
            with torch.inference_mode():
                model.eval()(**inputs)
            return model
        except Exception as exc:  # the config class, the model or its forward refused this variant: try the next
            error = exc
    assert error is not None
    raise error


@dataclass
class Corpus:
    """The saved models (family -> folder) and the families left out, with why."""

    saved: dict[Family, Path] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread: a tiny model's matrices are too small to share, and on a busy 2-core box
    the threads' hand-offs cost a hundred times the work (measured: 1 ms against 7 us per 8x64x128 linear)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build_corpus(root: Path, only: tuple[Family, ...] | None = None) -> Corpus:
    """Build and save every family (or `only` these) under `root`, with a tiny tokenizer."""
    with one_thread():
        return _build_corpus(root, only)


def _build_corpus(root: Path, only: tuple[Family, ...] | None) -> Corpus:
    from transformers.utils import logging as hf_logging

    from cudaload.demo import save_tiny_tokenizer

    corpus = Corpus()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a random model's "weights not initialised" notes are expected
    hf_logging.disable_progress_bar()
    try:
        for family in only or families():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # upstream deprecation notes of default configs
                    model = build(family)
            except Exception as exc:  # recorded: the corpus says what it leaves out
                corpus.left_out[family.name] = f"does not build small: {type(exc).__name__}: {str(exc)[:120]}"
                continue
            count = sum(p.numel() for p in model.parameters())
            if count > MAX_PARAMETERS:
                corpus.left_out[family.name] = f"{count:,} parameters after shrinking (over {MAX_PARAMETERS:,})"
                continue
            path = root / family.name
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model.save_pretrained(path)
            except Exception as exc:  # recorded, as above
                corpus.left_out[family.name] = f"does not save: {type(exc).__name__}: {str(exc)[:120]}"
                continue
            text = model.config.get_text_config(decoder=True)
            save_tiny_tokenizer(path, int(getattr(text, "vocab_size", 256) or 256))
            corpus.saved[family] = path
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return corpus


# --- one load per family, and the checks that look at it -------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """One family loaded both ways, for the checks to compare."""

    family: Family
    path: Path
    model: Any  # through cudaload.load(); `model.cudaload_plan` is what was applied
    bare: Any  # bare from_pretrained with the plan's kwargs


def same_logits_as_bare(loaded: Loaded) -> str:
    """The check forward's output (same inputs) is the same tensor both ways: same dtype, same values."""
    import torch

    from cudaload.loaders.verify import check_inputs, checked_output

    outputs = []
    for model in (loaded.model, loaded.bare):
        inputs, why = check_inputs(model)
        if not inputs:
            return f"no check input: {why}"
        with torch.inference_mode():
            out = model(**inputs)
        # An encoder without a head (BertModel) has no logits: its hidden states are what it gives.
        outputs.append(checked_output(out) if checked_output(out) is not None else out.last_hidden_state)
    mine, bare = outputs
    if mine is None or bare is None:
        return f"no logits to compare ({type(loaded.model).__name__})"
    if mine.dtype != bare.dtype or mine.shape != bare.shape:
        return f"logits differ in kind: {mine.dtype} {tuple(mine.shape)} vs bare {bare.dtype} {tuple(bare.shape)}"
    if not torch.equal(mine, bare):
        return f"logits differ from bare by {float((mine.float() - bare.float()).abs().max()):.4g}"
    return ""


def verified(loaded: Loaded) -> str:
    """The check forward ran and passed (True), or was skipped with a reason; never failed."""
    applied = loaded.model.cudaload_plan
    if applied.verified is None and not applied.verify_note:
        return "the check forward was skipped without saying why"
    return "" if applied.verified is not False else "the check forward failed"


def sub_models_keep_their_attention(loaded: Loaded) -> str:
    """A sub-model whose class supports SDPA is not run eager because the top class lacks it (bare
    from_pretrained gives each sub-model its own default; issue 39 item 3, GOT-OCR2)."""
    applied = loaded.model.cudaload_plan
    if "attn_implementation" in applied.plan.explicit:
        return ""
    config = loaded.model.config
    eager = []
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        owner = next((m for m in loaded.model.modules() if getattr(m, "config", None) is sub and sub is not None), None)
        if owner is not None and getattr(owner, "_supports_sdpa", False) and sub._attn_implementation == "eager":
            eager.append(f"{key} ({type(owner).__name__} supports sdpa)")
    return f"sub-models run eager: {', '.join(eager)}" if eager else ""


def reads_back_what_the_plan_shows(loaded: Loaded) -> str:
    """Every value the plan shows is the loaded model's own (issue 36 item 1, loaders/readback.py): an upstream
    default that moves under cudaload (transformers 5.25's use_kernels) fails here, on the set where it moved."""
    from cudaload.loaders.readback import read_back

    return " ".join(read_back(loaded.model.cudaload_plan.plan, loaded.model))


CHECKS: list[Callable[[Loaded], str]] = [
    same_logits_as_bare,
    verified,
    sub_models_keep_their_attention,
    reads_back_what_the_plan_shows,
]
"""What every family's one load is checked for; append a check to add one (it returns the problem, "" for none)."""

# Families cudaload refuses, with the error class and the words that make the refusal true. Empty: every
# family of the corpus that builds loads.
REFUSED: dict[str, tuple[type[CudaloadError], str]] = {}


def load_both(family: Family, path: Path) -> Loaded:
    from cudaload.capability.model_class import resolve_auto_class

    model = cudaload.load(str(path))
    plan = model.cudaload_plan.plan
    bare = resolve_auto_class(plan.auto_class).from_pretrained(path, **cudaload.from_pretrained_kwargs(plan))
    return Loaded(family, path, model, bare)


def run_corpus(corpus: Corpus, checks: list[Callable[[Loaded], str]]) -> tuple[dict[str, str], list[str]]:
    """(problems by family, the families that passed every check)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with one_thread():
            return _run(corpus, checks)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def _run(corpus: Corpus, checks: list[Callable[[Loaded], str]]) -> tuple[dict[str, str], list[str]]:
    problems: dict[str, str] = {}
    passed: list[str] = []
    for family, path in corpus.saved.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a plan's notes (CudaloadWarning) and upstream's are not the subject
            try:
                loaded = load_both(family, path)
            except CudaloadError as exc:
                expected = REFUSED.get(family.name)
                if expected is None or not isinstance(exc, expected[0]) or expected[1] not in str(exc):
                    problems[family.name] = f"refused: {type(exc).__name__}: {str(exc)[:300]}"
                continue
            found = [p for p in (check(loaded) for check in checks) if p]
        if found:
            problems[family.name] = "; ".join(found)
        else:
            passed.append(family.name)
    return problems, passed
