"""Hardening round 5 (issue 39, items 1-5): model families beyond the causal LMs, per-layer config
values, attention per sub-model, the pipeline tasks the installed transformers has, and LoRA numbers.

The corpus-wide version of items 1-3 is tests/test_model_corpus.py (slow); these are the named cases,
each on a tiny model of tests/model_corpus.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import FinetuneConfigError, LoadFailedError, ModelConfigError, SettingError
from model_corpus import Corpus, Loaded, build_corpus, families, load_both, same_logits_as_bare

NAMED = ("t5-seq2seq", "bart-seq2seq", "whisper-speech", "clip-dual-encoder", "bert-encoder", "got_ocr2")


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    corpus: Corpus = build_corpus(tmp_path_factory.mktemp("named"), tuple(f for f in families() if f.name in NAMED))
    assert not corpus.left_out, corpus.left_out
    return {family.name: (family, path) for family, path in corpus.saved.items()}


def _loaded(named: dict[str, Any], name: str) -> Loaded:
    return load_both(*named[name])


# --- item 1: the check forward feeds the model's own inputs -----------------------------------------


@pytest.mark.parametrize("name", ["t5-seq2seq", "bart-seq2seq", "whisper-speech", "clip-dual-encoder"])
def test_encoder_decoders_speech_and_dual_encoders_are_verified_and_load_as_bare(named, name) -> None:
    loaded = _loaded(named, name)
    assert loaded.model.cudaload_plan.verified is True, loaded.model.cudaload_plan.verify_note
    assert same_logits_as_bare(loaded) == ""


def test_a_skipped_check_forward_says_why(named) -> None:
    applied = _loaded(named, "bert-encoder").model.cudaload_plan
    assert applied.verified is None
    assert "BertModel returns no logits to check" in applied.verify_note
    assert "verified: not run (skipped: BertModel returns no logits" in applied.explain()
    assert applied.to_dict()["verify_note"] == applied.verify_note


def test_the_check_inputs_follow_the_main_input_and_the_decoder(named) -> None:
    from cudaload.loaders.verify import check_inputs

    whisper = _loaded(named, "whisper-speech").model
    inputs, why = check_inputs(whisper)
    assert why == ""
    assert sorted(inputs) == ["decoder_input_ids", "input_features"]
    config = whisper.config
    assert tuple(inputs["input_features"].shape) == (1, config.num_mel_bins, 2 * config.max_source_positions)
    assert int(inputs["decoder_input_ids"][0, 0]) == config.decoder_start_token_id
    t5_inputs, _ = check_inputs(_loaded(named, "t5-seq2seq").model)
    assert int(t5_inputs["decoder_input_ids"][0, 0]) == 0  # T5 starts from its pad token
    clip_inputs, _ = check_inputs(_loaded(named, "clip-dual-encoder").model)
    assert sorted(clip_inputs) == ["input_ids", "pixel_values"]


# --- item 2: per-layer config values ------------------------------------------------------------------


def _config_folder(tmp_path: Path, model_type: str, **values: Any) -> str:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    CONFIG_MAPPING[model_type](**values).save_pretrained(tmp_path)
    return str(tmp_path)


def test_a_per_layer_head_dim_is_read_per_layer(tmp_path: Path) -> None:
    # Gemma 4's defaults give layers 5, 11, 17, 23 and 29 a head of 512 beside the others' 256 (a heterogeneous
    # config: reading config.head_dim raises transformers' AmbiguousGlobalPerLayerAttributeError).
    facts = cudaload.read_model_facts(_config_folder(tmp_path, "gemma4_text"))
    assert facts.head_dims == (256, 512)
    assert facts.head_dim == 512  # the largest bounds every layer's cache and kernel


def test_a_per_layer_size_must_be_valid_in_every_layer(tmp_path: Path) -> None:
    folder = _config_folder(tmp_path, "gemma4_text", num_hidden_layers=2, per_layer_config={"1": {"head_dim": 0}})
    with pytest.raises(ModelConfigError, match=r"head_dim=0"):
        cudaload.plan(folder)


def test_a_list_of_per_layer_intermediate_sizes_is_planned(tmp_path: Path) -> None:
    folder = _config_folder(tmp_path, "gemma3n_text")  # intermediate_size: one per layer
    assert cudaload.plan(folder, dtype="float32").dtype == "float32"


def test_xlnet_without_a_position_limit_is_planned(tmp_path: Path) -> None:
    folder = _config_folder(tmp_path, "xlnet")  # max_position_embeddings is -1 for every XLNet
    assert cudaload.plan(folder, dtype="float32").dtype == "float32"


# --- item 3: attention per sub-model ------------------------------------------------------------------


def test_a_sub_model_with_sdpa_keeps_it_when_the_top_class_has_none(named) -> None:
    import torch
    from transformers import AutoModelForImageTextToText

    from cudaload.loaders.verify import check_inputs

    _, path = named["got_ocr2"]
    model = cudaload.load(str(path))
    assert model.config.text_config._attn_implementation == "sdpa"
    assert model.config.vision_config._attn_implementation == "eager"
    decision = model.cudaload_plan.plan.decision("attn_implementation_per_sub_model")
    assert decision.value == "text_config=sdpa, vision_config=eager"
    # Bare from_pretrained, given nothing but the dtype, gives each part its own default: the same logits.
    bare = AutoModelForImageTextToText.from_pretrained(path, dtype=model.dtype)
    inputs, _ = check_inputs(model)
    with torch.inference_mode():
        assert torch.equal(model(**inputs).logits, bare(**inputs).logits)


def test_your_attention_choice_is_applied_to_every_sub_model(named) -> None:
    _, path = named["got_ocr2"]
    model = cudaload.load(str(path), attn_implementation="eager")
    assert model.config.text_config._attn_implementation == "eager"
    with pytest.raises(KeyError):
        model.cudaload_plan.plan.decision("attn_implementation_per_sub_model")


# --- item 4: pipeline tasks ---------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["summarization", "translation", "text2text-generation"])
def test_a_task_the_installed_transformers_removed_is_refused_before_loading(task) -> None:
    import transformers

    # A path that does not exist: a refusal after loading would be a ModelConfigError about it.
    with pytest.raises(SettingError, match=rf"transformers {transformers.__version__} has no such pipeline"):
        cudaload.pipeline(task, "/nonexistent/model")


def test_every_offered_task_is_one_transformers_pipeline_takes() -> None:
    from transformers.pipelines import check_task

    from cudaload.pipelines import offered_tasks

    offered = offered_tasks()
    assert "text-generation" in offered and "summarization" not in offered
    for task in offered:
        check_task(task)  # raises KeyError for a task transformers does not have


# --- item 5: LoRA numbers and the adapted model -------------------------------------------------------


@pytest.mark.parametrize(
    "lora", [{"lora_alpha": math.nan}, {"lora_alpha": math.inf}, {"alpha_pattern": {"q_proj": -math.inf}}]
)
def test_non_finite_lora_numbers_are_refused(tiny_models, lora) -> None:
    with pytest.raises(FinetuneConfigError, match="must be finite"):
        cudaload.plan(str(tiny_models["llama"]), finetune=True, lora=lora)


def test_the_adapted_model_is_verified(tiny_models) -> None:
    # Finite but overflowing: random B matrices (init_lora_weights=False) scaled by 1e38 / r give inf, then
    # NaN. The base passes its check forward; the adapted model that would be returned does not.
    lora = {"lora_alpha": 1e38, "init_lora_weights": False}
    with pytest.raises(LoadFailedError, match="after get_peft_model the adapted model's test forward failed"):
        cudaload.load_for_finetune(str(tiny_models["llama"]), lora=lora, dtype="float32")
