"""The checks load() runs after from_pretrained, one rule per test: the test forward's inputs and verdict
(loaders/verify.py) and what the loading report and device map say of the weights (loaders/weights.py).

A mutation sample (issue 41 item 7, `tools/mutate.py`) killed no mutant of these two modules: the tests that
reach them load a model (slow) or run in a subprocess. These call the functions on tiny in-memory models and
on real transformers configs, so each rule is checked in milliseconds."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch
from transformers import (
    CLIPConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    LlavaConfig,
    PretrainedConfig,
    T5Config,
    ViTConfig,
    Wav2Vec2Config,
    WhisperConfig,
)
from transformers.utils.loading_report import LoadStateDictInfo

import cudaload
from cudaload import LoadFailedError, Machine
from cudaload.loaders.verify import NON_FINITE, check_inputs, checked_output, verify_forward
from cudaload.loaders.weights import WeightsReport, check_weights, offload_warning, offloaded_modules

TINY_LLAMA = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
)


class _Shell:
    """What check_inputs reads of a model: its config, its main input, its forward's parameters, where its
    inputs go and its dtype. A real config, no weights: building the inputs needs nothing else."""

    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, config: Any, main: str = "input_ids", takes_pixels: bool = False) -> None:
        self.config = config
        self.main_input_name = main
        self.forward = self._text_and_images if takes_pixels else self._text

    def _text(self, input_ids: Any = None, attention_mask: Any = None) -> None:
        raise AssertionError("check_inputs never runs the forward")

    def _text_and_images(self, input_ids: Any = None, pixel_values: Any = None) -> None:
        raise AssertionError("check_inputs never runs the forward")


def _llama(**values: Any) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **values})).eval()


# ---- the test forward's inputs (check_inputs) ----------------------------------------------------


def test_a_language_model_gets_one_row_of_eight_valid_token_ids() -> None:
    """input_ids: one batch row of 8 ids, each a valid id of the vocabulary (8 ids, wrapped at its size)."""
    for vocab in (8, 32, 50_000):
        inputs, why = check_inputs(_Shell(LlamaConfig(**{**TINY_LLAMA, "vocab_size": vocab})))
        assert why == ""
        assert sorted(inputs) == ["input_ids"]
        ids = inputs["input_ids"]
        assert tuple(ids.shape) == (1, 8) and ids.dtype == torch.long
        assert int(ids.min()) >= 0 and int(ids.max()) < vocab
        assert len(set(ids[0].tolist())) == 8  # eight different tokens, not one repeated


def test_the_inputs_are_the_same_for_every_load_of_a_model() -> None:
    """The corpus tests compare load()'s logits with bare from_pretrained's on these inputs: two calls agree."""
    whisper = _Shell(WhisperConfig(num_mel_bins=4, max_source_positions=6, vocab_size=16), main="input_features")
    first, _ = check_inputs(whisper)
    second, _ = check_inputs(whisper)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_vocabulary_of_fewer_than_eight_ids_is_skipped_and_says_how_many() -> None:
    inputs, why = check_inputs(_Shell(LlamaConfig(**{**TINY_LLAMA, "vocab_size": 7})))
    assert inputs == {}
    assert why == "its vocabulary has 7 token ids, fewer than the 8 of the test forward"


@pytest.mark.parametrize("vocab_size", [None, "absent"])
def test_a_config_that_gives_no_vocabulary_size_is_skipped_as_zero_ids(vocab_size: Any) -> None:
    config = PretrainedConfig() if vocab_size == "absent" else PretrainedConfig(vocab_size=vocab_size)
    assert vocab_size != "absent" or not hasattr(config, "vocab_size")
    inputs, why = check_inputs(_Shell(config))
    assert inputs == {}
    assert why.startswith("its vocabulary has 0 token ids")


def test_a_config_with_several_text_configs_is_skipped_as_zero_ids() -> None:
    """transformers' get_text_config(decoder=True) raises ValueError when several text configs qualify
    (musicgen): no vocabulary to draw ids from."""

    class Ambiguous(PretrainedConfig):
        def get_text_config(self, decoder: bool = False, encoder: bool = False) -> Any:
            raise ValueError("several text configs")

    inputs, why = check_inputs(_Shell(Ambiguous(vocab_size=32)))
    assert inputs == {} and why.startswith("its vocabulary has 0 token ids")


def test_a_dual_encoder_gets_pixels_beside_its_token_ids() -> None:
    """CLIP's forward needs both: pixel_values shaped by its vision config (channels, image size)."""
    config = CLIPConfig(vision_config={"image_size": 16, "num_channels": 1, "patch_size": 8})
    inputs, why = check_inputs(_Shell(config, takes_pixels=True))
    assert why == ""
    assert sorted(inputs) == ["input_ids", "pixel_values"]
    assert tuple(inputs["pixel_values"].shape) == (1, 1, 16, 16)
    assert inputs["pixel_values"].dtype == torch.float32


def test_a_model_whose_images_enter_through_image_tokens_gets_text_only() -> None:
    """LLaVA places images at image_token_id in input_ids: pixels without those tokens are an error, a
    text-only forward is a valid one."""
    config = LlavaConfig(text_config=dict(TINY_LLAMA), image_token_id=3)
    inputs, why = check_inputs(_Shell(config, takes_pixels=True))
    assert why == "" and sorted(inputs) == ["input_ids"]


def test_a_vision_config_whose_model_takes_no_pixels_gets_text_only() -> None:
    inputs, _ = check_inputs(_Shell(CLIPConfig(), takes_pixels=False))
    assert sorted(inputs) == ["input_ids"]


def test_an_image_model_gets_pixels_of_its_own_size_and_channels() -> None:
    inputs, why = check_inputs(_Shell(ViTConfig(image_size=32, num_channels=1), main="pixel_values"))
    assert why == "" and sorted(inputs) == ["pixel_values"]
    assert tuple(inputs["pixel_values"].shape) == (1, 1, 32, 32)


def test_a_rectangular_image_size_gives_rectangular_pixels() -> None:
    config = ViTConfig(num_channels=2)
    config.image_size = (24, 40)  # (height, width), as some vision configs give it
    inputs, _ = check_inputs(_Shell(config, main="pixel_values"))
    assert tuple(inputs["pixel_values"].shape) == (1, 2, 24, 40)


@pytest.mark.parametrize("how", ["None", "absent"])
def test_a_vision_config_without_sizes_gets_rgb_pixels_of_224(how: str) -> None:
    """A vision config that gives no image_size or num_channels gets the RGB 224 x 224 image of ViT's and
    CLIP's defaults (ViTConfig, CLIPVisionConfig), not an empty or one-channel one."""
    config = PretrainedConfig(num_channels=None) if how == "None" else PretrainedConfig()
    inputs, why = check_inputs(_Shell(config, main="pixel_values"))
    assert why == "" and tuple(inputs["pixel_values"].shape) == (1, 3, 224, 224)


def test_speech_features_are_shaped_by_the_mel_bins_and_twice_the_encoder_positions() -> None:
    """Whisper: input_features (batch, mel bins, 2 x max_source_positions; its convolution halves the
    frames), and the decoder starts from decoder_start_token_id."""
    config = WhisperConfig(num_mel_bins=5, max_source_positions=6, vocab_size=16, decoder_start_token_id=9)
    inputs, why = check_inputs(_Shell(config, main="input_features"))
    assert why == ""
    assert sorted(inputs) == ["decoder_input_ids", "input_features"]
    assert tuple(inputs["input_features"].shape) == (1, 5, 12)
    assert inputs["decoder_input_ids"].tolist() == [[9, 1, 2, 3]]


@pytest.mark.parametrize("missing", ["num_mel_bins", "max_source_positions"])
@pytest.mark.parametrize("how", ["None", "absent"])
def test_speech_features_without_their_sizes_are_skipped(missing: str, how: str) -> None:
    values = {"num_mel_bins": 4, "max_source_positions": 6, "vocab_size": 16}
    if how == "None":
        values[missing] = None  # type: ignore[assignment]
    else:
        del values[missing]
    inputs, why = check_inputs(_Shell(PretrainedConfig(**values), main="input_features"))
    assert inputs == {}
    assert why == "its config has no num_mel_bins / max_source_positions to shape input_features by"


def test_raw_audio_gets_a_tenth_of_a_second_at_16_khz() -> None:
    """wav2vec2-like models take input_values: one row of 1600 samples (its feature extractor's 16 kHz)."""
    inputs, why = check_inputs(_Shell(Wav2Vec2Config(), main="input_values"))
    assert why == "" and sorted(inputs) == ["input_values"]
    assert tuple(inputs["input_values"].shape) == (1, 1600)


def test_an_unknown_main_input_is_skipped_and_named() -> None:
    inputs, why = check_inputs(_Shell(LlamaConfig(**TINY_LLAMA), main="inputs_embeds"))
    assert inputs == {}
    assert why == "its main input is 'inputs_embeds', which cudaload does not know how to build"


def test_an_encoder_decoder_without_a_start_token_starts_from_its_pad_token() -> None:
    """T5 names no decoder_start_token_id; transformers' T5PreTrainedModel._shift_right starts from its pad
    token. The decoder then takes 4 ids: the start and 1, 2, 3 (valid ids of a 4-id vocabulary too)."""
    config = T5Config(vocab_size=32, pad_token_id=5, decoder_start_token_id=None)
    inputs, why = check_inputs(_Shell(config))
    assert why == ""
    assert inputs["decoder_input_ids"].tolist() == [[5, 1, 2, 3]]
    small = WhisperConfig(num_mel_bins=4, max_source_positions=6, vocab_size=4, decoder_start_token_id=0)
    inputs, why = check_inputs(_Shell(small, main="input_features"))
    assert why == "" and inputs["decoder_input_ids"].tolist() == [[0, 1, 2, 3]]


def test_an_encoder_decoder_with_neither_start_nor_pad_token_is_skipped() -> None:
    config = T5Config(vocab_size=32, pad_token_id=None, decoder_start_token_id=None)
    inputs, why = check_inputs(_Shell(config))
    assert inputs == {}
    assert why == "it is an encoder-decoder whose config names no decoder_start_token_id or pad_token_id"


def test_inputs_go_to_the_first_device_of_a_dispatched_model_in_its_dtype() -> None:
    """A model accelerate dispatched over "cpu" and "disk" takes its inputs on the CPU; floating inputs
    take the model's dtype, token ids stay integers."""
    shell = _Shell(WhisperConfig(num_mel_bins=4, max_source_positions=6, vocab_size=16), main="input_features")
    shell.hf_device_map = {"model.encoder": "cpu", "model.decoder": "disk"}  # type: ignore[attr-defined]
    shell.dtype = torch.bfloat16
    inputs, _ = check_inputs(shell)
    assert inputs["input_features"].dtype == torch.bfloat16 and inputs["input_features"].device.type == "cpu"
    assert inputs["decoder_input_ids"].dtype == torch.long


# ---- the test forward's verdict (_verify) ----------------------------------------------------------


def test_a_model_with_finite_logits_passes_and_attributes_no_failure() -> None:
    verification = verify_forward(_llama(), training=False)
    assert verification.status == "passed" and verification.verified is True
    assert verification.failure is None


def test_non_finite_logits_fail_the_verify_phase() -> None:
    model = _llama()
    with torch.no_grad():
        model.lm_head.weight.fill_(math.nan)
    verification = verify_forward(model, training=False)
    assert verification.status == "failed" and verification.verified is False
    assert verification.problem == NON_FINITE and verification.error is None
    failure = verification.failure
    assert failure is not None and failure.phase == "verify" and failure.problem == NON_FINITE


def test_a_forward_that_raises_fails_with_what_it_raised() -> None:
    model = _llama()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("kernel not built for this GPU")

    model.forward = broken  # type: ignore[method-assign]
    verification = verify_forward(model, training=False)
    assert verification.status == "failed"
    assert isinstance(verification.error, RuntimeError) and "kernel not built" in verification.problem
    assert verification.failure is not None and verification.failure.error is verification.error


def test_a_model_without_logits_or_inputs_is_skipped_and_says_why() -> None:
    torch.manual_seed(0)
    base = LlamaModel(LlamaConfig(**TINY_LLAMA))
    skipped = verify_forward(base, training=False)
    assert skipped.status == "skipped" and skipped.verified is None and skipped.failure is None
    assert skipped.problem == "skipped: LlamaModel returns no logits to check"
    no_inputs = verify_forward(_llama(vocab_size=4), training=False)
    assert no_inputs.status == "skipped"
    assert no_inputs.problem == "skipped: its vocabulary has 4 token ids, fewer than the 8 of the test forward"


@pytest.mark.parametrize("training", [True, False])
def test_the_forward_runs_in_the_mode_the_model_is_loaded_for(training: bool) -> None:
    model = _llama()
    assert verify_forward(model, training=training).status == "passed"
    assert model.training is training


def test_the_checked_output_is_the_logits_then_the_image_text_similarities() -> None:
    class Out:
        def __init__(self, **values: Any) -> None:
            self.__dict__.update(values)

    logits, similarities = torch.zeros(1), torch.ones(1)
    assert checked_output(Out(logits=logits, logits_per_image=similarities)) is logits
    assert checked_output(Out(logits=None, logits_per_image=similarities)) is similarities
    assert checked_output(Out(last_hidden_state=logits)) is None


# ---- the weights (weights.py) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory: pytest.TempPathFactory) -> cudaload.Plan:
    folder = tmp_path_factory.mktemp("config")
    LlamaConfig(**TINY_LLAMA).save_pretrained(folder)
    return cudaload.plan(str(folder), machine=Machine.simulated(), dtype="float32")


def _info(missing: set[str] = set(), unexpected: set[str] = set(), mismatched: Any = ()) -> dict[str, Any]:  # noqa: B006
    """transformers' own loading report (`output_loading_info=True`: LoadStateDictInfo.to_dict())."""
    fields = inspect.signature(LoadStateDictInfo).parameters
    values = {"missing_keys": missing, "unexpected_keys": unexpected, "mismatched_keys": set(mismatched)}
    values |= {"error_msgs": [], "conversion_errors": {}, "skipped_pp_keys": set()}
    return LoadStateDictInfo(**{k: v for k, v in values.items() if k in fields}).to_dict()


def test_the_report_counts_mismatched_shapes_as_missing_weights() -> None:
    """A weight of another shape is re-initialized by from_pretrained, like a missing one; the report names
    its key, not its shapes."""
    report = WeightsReport.read(
        _info(missing={"b.weight"}, unexpected={"z.bias", "y.bias"}, mismatched={("a.weight", (2, 2), (3, 3))})
    )
    assert report.missing == ("a.weight", "b.weight")
    assert report.unexpected == ("y.bias", "z.bias")
    assert WeightsReport.read(_info(mismatched={("a.weight", (2, 2), (3, 3))})).missing == ("a.weight",)
    assert WeightsReport.read(_info(unexpected={"z.bias"})) == WeightsReport((), ("z.bias",))
    assert WeightsReport.read({}) == WeightsReport()


def test_missing_weights_raise_unless_allowed_and_then_warn(tiny_plan: cudaload.Plan) -> None:
    model = _llama()
    report = WeightsReport(missing=("lm_head.weight",))
    with pytest.raises(LoadFailedError, match=r"lacks 1 of the model's weights.*allow_missing_weights=True"):
        check_weights(tiny_plan, model, report, allow_missing=False)
    (note,) = check_weights(tiny_plan, model, report, allow_missing=True)
    assert "1 weights are not in the checkpoint" in note and "lm_head.weight" in note
    assert check_weights(tiny_plan, model, WeightsReport(), allow_missing=False) == ()


@pytest.mark.parametrize("architectures", [["LlamaForCausalLM"], ["LlamaForSequenceClassification"], None])
def test_unused_weights_raise_only_for_the_checkpoints_own_architecture(
    tiny_plan: cudaload.Plan, architectures: list[str] | None
) -> None:
    model = _llama()
    model.config.architectures = architectures
    report = WeightsReport(unexpected=("score.weight",))
    own = architectures == ["LlamaForCausalLM"]
    if own:
        with pytest.raises(LoadFailedError, match=r"its own architecture, but 1 checkpoint weights"):
            check_weights(tiny_plan, model, report, allow_missing=False)
    else:  # another class than the checkpoint's (a base model from one with a head): what you asked for
        assert check_weights(tiny_plan, model, report, allow_missing=False) == ()
    assert check_weights(tiny_plan, model, WeightsReport(), allow_missing=False) == ()


def test_offloaded_modules_are_those_off_the_fast_device() -> None:
    device_map = {"model.embed": 0, "model.layers.1": "cpu", "lm_head": "disk"}
    assert offloaded_modules(device_map, has_gpu=True) == ("model.layers.1 -> cpu", "lm_head -> disk")
    assert offloaded_modules(device_map, has_gpu=False) == ("lm_head -> disk",)
    assert offloaded_modules({"": "disk"}, has_gpu=False) == ("(whole model) -> disk",)
    assert offloaded_modules(None, has_gpu=True) == () and offloaded_modules({}, has_gpu=True) == ()


@pytest.mark.parametrize("count", [3, 4, 5, 9])
def test_the_offload_warning_shows_four_modules_and_counts_them_all(count: int) -> None:
    modules = tuple(f"model.layers.{i} -> cpu" for i in range(count))
    warning = offload_warning("org/model", modules)
    assert warning.startswith(f"org/model: device_map offloaded {count} module(s) (")
    shown = warning.split("(", 2)[2].split(")", 1)[0]
    assert shown.split(", ")[:4] == list(modules[:4])
    assert shown.endswith(", ...") is (count > 4)
    assert shown.count(" -> cpu") == min(count, 4)


@pytest.mark.parametrize("size", [32, 384])
def test_a_vision_encoder_decoder_gets_pixels_of_its_encoders_size(size: int) -> None:
    """A VisionEncoderDecoder has no vision_config: its ViT is `config.encoder` (32 or 384 px, not the 224 of a
    guess that fails its forward: "Input image size (224*224) doesn't match model")."""
    from transformers import GPT2Config, VisionEncoderDecoderConfig

    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        ViTConfig(image_size=size), GPT2Config(vocab_size=64)
    )
    config.decoder_start_token_id = 0
    shell = _Shell(config, main="pixel_values")

    def forward(pixel_values: Any, decoder_input_ids: Any = None) -> None:
        raise AssertionError("check_inputs never runs the forward")

    shell.forward = forward  # type: ignore[method-assign]
    inputs, why = check_inputs(shell)
    assert why == "" and sorted(inputs) == ["decoder_input_ids", "pixel_values"]
    assert tuple(inputs["pixel_values"].shape) == (1, 3, size, size)


def test_a_forward_requiring_an_input_cudaload_cannot_build_is_skipped_and_says_which() -> None:
    """A valid model must never fail on cudaload's own check: an input it does not know is a skip, with why."""
    shell = _Shell(LlamaConfig(**TINY_LLAMA))

    def forward(input_ids: Any, audio_codes: Any, attention_mask: Any = None) -> None:
        raise AssertionError("check_inputs never runs the forward")

    shell.forward = forward  # type: ignore[method-assign]
    assert check_inputs(shell) == ({}, "its forward requires audio_codes, which cudaload does not know how to build")


def test_xmod_without_a_default_language_gets_the_first_languages_ids() -> None:
    """X-MOD's forward raises "Input language unknown" without lang_ids or a default language."""
    from transformers import XmodConfig

    shell = _Shell(XmodConfig(vocab_size=64, languages=["en_XX", "de_DE"]))

    def forward(input_ids: Any = None, lang_ids: Any = None) -> None:
        raise AssertionError("check_inputs never runs the forward")

    shell.forward = forward  # type: ignore[method-assign]
    inputs, why = check_inputs(shell)
    assert why == "" and inputs["lang_ids"].tolist() == [0]
    shell.config.default_language = "de_DE"  # set_default_language: its forward needs no lang_ids
    assert "lang_ids" not in check_inputs(shell)[0]
