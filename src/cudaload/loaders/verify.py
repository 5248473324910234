"""The test forward after loading: the model's main input (token ids, audio features, pixels) through the
model, and whether its logits are finite."""

from __future__ import annotations

from typing import Any, Literal

from ..errors import describe_error
from ..frozen import frozen
from .applied import Failure, Phase
from .fsdp_loading import SKELETON_NOTE

__all__ = ["NON_FINITE", "Failure", "Phase", "check_inputs", "checked_output", "input_device", "verify_forward"]


def input_device(model: Any) -> Any:
    """Where inputs go: the first device of a dispatched model (accelerate's hooks move the
    rest; "cpu"/"disk" entries mean CPU), else the model's device."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        first = next(iter(device_map.values()))
        if isinstance(first, int):
            return f"cuda:{first}"
        return "cpu" if str(first) in ("cpu", "disk") else str(first)
    return model.device


NON_FINITE = "the test forward gave non-finite logits"


@frozen
class _Verification:
    """What the test forward found: "passed" (finite logits), "skipped" (`problem` says why: no input
    cudaload can build, or no logits to check) or "failed" (`problem`; `error` is what it raised, None
    for non-finite logits)."""

    status: Literal["passed", "skipped", "failed"]
    problem: str = ""
    error: BaseException | None = None

    @property
    def verified(self) -> bool | None:
        """`AppliedPlan.verified`: True when passed, None when skipped, False when failed."""
        return {"passed": True, "skipped": None}.get(self.status, False)

    @property
    def failure(self) -> Failure | None:
        """The failure to attribute when the forward failed (phase "verify"), else None."""
        return Failure("verify", self.problem, self.error) if self.status == "failed" else None


_PASSED = _Verification("passed")


def _skipped(why: str) -> _Verification:
    return _Verification("skipped", why)


# The output a test forward checks, first found first: a language or classification head's logits, a
# dual encoder's image-text similarities (CLIP).
_CHECKED_OUTPUTS = ("logits", "logits_per_image")
_DECODER_TOKENS = 4


def check_inputs(model: Any) -> tuple[dict[str, Any], str]:
    """The test forward's inputs for `model` (on its input device), built from its main input
    (`PreTrainedModel.main_input_name`: input_ids, input_features, pixel_values, input_values), every other
    input its forward requires that cudaload knows how to build (token ids beside images for BLIP-2, the
    Q-Former's token ids for InstructBLIP, images beside token ids for CLIP), the decoder's start for an
    encoder-decoder (decoder_input_ids from `decoder_start_token_id`, one row per codebook for an audio
    decoder), and images shaped by the vision sub-config (`vision_config`, or a vision encoder-decoder's
    `encoder`); or ({}, why) when cudaload cannot build them: a valid model must never fail on cudaload's
    own check, so what cudaload is unsure of is skipped with the reason (`AppliedPlan.verify_note`).

    The same inputs, deterministic, for every load of the same model: the corpus tests compare the
    logits of `load()` with bare from_pretrained's on them.
    """
    import torch

    config = model.config
    main = str(getattr(model, "main_input_name", "input_ids"))
    generator = torch.Generator().manual_seed(0)
    inputs: dict[str, Any] = {}
    text = _text_config(config)
    vocab = int(getattr(text, "vocab_size", 0) or 0) if text is not None else 0
    parameters = _forward_parameters(model)
    required = _required_parameters(model)
    if main == "input_ids":
        if vocab < 8:
            return {}, f"its vocabulary has {vocab} token ids, fewer than the 8 of the test forward"
        inputs["input_ids"] = _tokens(vocab)
    elif main == "pixel_values" and "input_ids" in parameters and vocab >= 8:  # BLIP-2: the text beside the image
        inputs["input_ids"] = _tokens(vocab)
    if main == "input_ids":
        vision = getattr(config, "vision_config", None)
        if vision is not None and "pixel_values" in parameters and not _has_image_token(config):
            inputs["pixel_values"] = _pixels(vision, generator)
    elif main == "pixel_values":
        inputs["pixel_values"] = _pixels(_vision_config(config), generator)
        image = _image_token(config)
        queries = getattr(config, "num_query_tokens", None)
        if "input_ids" in inputs and image is not None and isinstance(queries, int) and 0 <= image < vocab:
            # BLIP-2 / InstructBLIP: the text holds one image token per query token, where the Q-Former's
            # outputs go (transformers 5.22 and 5.25 Blip2ForConditionalGeneration.get_placeholder_mask).
            text_ids = inputs["input_ids"]
            text_ids = torch.where(text_ids == image, (image + 1) % vocab, text_ids)
            inputs["input_ids"] = torch.cat((torch.full((1, queries), image), text_ids), dim=1).long()
    elif main == "input_features":  # Whisper-like: (batch, mel bins, 2 x the encoder's positions)
        bins = int(getattr(config, "num_mel_bins", 0) or 0)
        frames = 2 * int(getattr(config, "max_source_positions", 0) or 0)
        if not bins or not frames:
            return {}, "its config has no num_mel_bins / max_source_positions to shape input_features by"
        inputs["input_features"] = torch.randn(1, bins, frames, generator=generator)
    elif main == "input_values":  # raw audio: one tenth of a second at 16 kHz
        inputs["input_values"] = torch.randn(1, 1600, generator=generator)
    else:
        return {}, f"its main input is {main!r}, which cudaload does not know how to build"
    if (
        "lang_ids" in parameters
        and getattr(config, "default_language", "") is None
        and getattr(config, "languages", None)
    ):
        # X-MOD runs a language's adapters: without a default language (`set_default_language`) its forward
        # raises unless lang_ids names one (transformers 5.22 and 5.25 XmodModel.forward): the first one here.
        inputs["lang_ids"] = torch.zeros(1, dtype=torch.long)
    if "qformer_input_ids" in required:  # InstructBLIP: the instruction, in the Q-Former's own vocabulary
        qformer_vocab = int(getattr(getattr(config, "qformer_config", None), "vocab_size", 0) or 0)
        if qformer_vocab < 8:
            return {}, f"its Q-Former's vocabulary has {qformer_vocab} token ids, fewer than the 8 of the test forward"
        inputs["qformer_input_ids"] = _tokens(qformer_vocab)
    if getattr(config, "is_encoder_decoder", False):
        decoder = getattr(config, "decoder", None) or text or config
        # transformers' shift_tokens_right starts from decoder_start_token_id; T5 names none and starts
        # from its pad token (transformers 5.25 T5PreTrainedModel._shift_right).
        names = ("decoder_start_token_id", "pad_token_id")
        found = (getattr(c, n, None) for n in names for c in (config, decoder))
        start = next((value for value in found if value is not None), None)
        decoder_vocab = int(getattr(decoder, "vocab_size", 0) or vocab)
        if start is None or decoder_vocab < _DECODER_TOKENS:
            return {}, "it is an encoder-decoder whose config names no decoder_start_token_id or pad_token_id"
        steps = torch.arange(1, _DECODER_TOKENS) % decoder_vocab
        row = torch.cat((torch.tensor([int(start)]), steps)).unsqueeze(0).long()
        # An audio decoder over codebooks (musicgen) takes one row per codebook: (batch x codebooks, steps).
        codebooks = getattr(decoder, "num_codebooks", None)
        inputs["decoder_input_ids"] = row.repeat(codebooks, 1) if isinstance(codebooks, int) and codebooks > 1 else row
    unbuilt = [name for name in required if name not in inputs]
    if unbuilt:
        return {}, f"its forward requires {', '.join(unbuilt)}, which cudaload does not know how to build"
    device = input_device(model)
    dtype = getattr(model, "dtype", torch.float32)
    return {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}, ""


def _tokens(vocab: int) -> Any:
    import torch

    return (torch.arange(1, 9).unsqueeze(0) % vocab).long()


def _vision_config(config: Any) -> Any:
    """Where the images' size is said: `vision_config`, a vision encoder-decoder's `encoder` (its ViT, 32 or
    384 px), else the config itself."""
    for name in ("vision_config", "encoder"):
        part = getattr(config, name, None)
        if part is not None and getattr(part, "image_size", None) is not None:
            return part
    return config


def _required_parameters(model: Any) -> tuple[str, ...]:
    """The forward's parameters without a default (an input the forward cannot run without)."""
    import inspect

    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(n for n, p in signature.parameters.items() if p.default is p.empty and p.kind in kinds)


def _text_config(config: Any) -> Any:
    """The decoder's text config (transformers' `get_text_config(decoder=True)`), None when it is ambiguous."""
    try:
        return config.get_text_config(decoder=True)
    except ValueError:  # several text configs (e.g. musicgen's text encoder and decoder)
        return None


def _forward_parameters(model: Any) -> tuple[str, ...]:
    import inspect

    try:
        return tuple(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return ()


def _has_image_token(config: Any) -> bool:
    """Whether images enter through placeholder tokens in input_ids (LLaVA, Qwen2-VL): then a text-only
    forward is a valid one, and pixels without their tokens are an error."""
    return _image_token(config) is not None


def _image_token(config: Any) -> int | None:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _pixels(vision: Any, generator: Any) -> Any:
    import torch

    size = getattr(vision, "image_size", 224)
    height, width = (size, size) if isinstance(size, int) else tuple(size)[:2]
    channels = int(getattr(vision, "num_channels", 3) or 3)
    return torch.randn(1, channels, int(height), int(width), generator=generator)


def verify_forward(model: Any, training: bool) -> _Verification:
    """A short forward of the model's main input (`check_inputs`: 8 token ids, or features, or
    pixels, with the decoder's start for an encoder-decoder), and whether its logits are finite.

    For a model about to be trained the forward runs in train mode under no_grad: an
    eval-mode inference forward lets bitsandbytes (0.50, AVX512-BF16 CPUs) repack 4-bit
    weights into an inference-only layout with no backward, after which no gradient flows
    through the base layers (found here: layer-0 LoRA gradients were all zero).
    """
    import torch

    if any(hasattr(p, "ds_id") for p in model.parameters()):  # deepspeed marks each partitioned parameter
        return _skipped(
            "skipped: DeepSpeed ZeRO-3 partitioned the weights at load (each rank holds its share); only its engine "
            "(Trainer's) gathers them for a forward"
        )
    if not getattr(model, "hf_device_map", None) and all(p.is_meta for p in model.parameters()):
        # loaders/fsdp_loading.py's model: every weight on meta and none dispatched (accelerate's disk offload
        # leaves weights on meta too, with a device map and hooks that load them for the forward).
        return _skipped(SKELETON_NOTE)
    inputs, why = check_inputs(model)
    if not inputs:
        return _skipped(f"skipped: {why}")
    model.train(training)
    try:
        with torch.no_grad() if training else torch.inference_mode():
            out = model(**inputs)
    except Exception as exc:  # any failure in the forward is a verification failure
        return _Verification("failed", describe_error(exc), exc)
    logits = checked_output(out)
    if logits is None:
        return _skipped(f"skipped: {type(model).__name__} returns no logits to check")
    if not torch.isfinite(logits).all():
        return _Verification("failed", NON_FINITE)
    return _PASSED


def checked_output(out: Any) -> Any:
    """The tensor a test forward checks (`_CHECKED_OUTPUTS`), None when the output has none."""
    for name in _CHECKED_OUTPUTS:
        value = getattr(out, name, None)
        if value is not None:
            return value
    return None
