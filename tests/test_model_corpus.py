"""Every family of the corpus (tests/model_corpus.py) loads through cudaload as bare from_pretrained does
with the plan's kwargs, or is refused by a cudaload error that says why (issue 39, items 1-3).

One load per family: `load()` once, bare `from_pretrained(path, **from_pretrained_kwargs(plan))` once,
then every check in `model_corpus.CHECKS` looks at the pair, so one run says every family's every
problem. The corpus's size and time: tests/model_corpus.py.
"""

from __future__ import annotations

import pytest

from model_corpus import CHECKS, HAND_WRITTEN, REFUSED, Corpus, build_corpus, run_corpus


@pytest.fixture(scope="session")
def model_corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
def test_every_family_of_the_corpus_loads_as_bare_from_pretrained(model_corpus: Corpus) -> None:
    problems, passed = run_corpus(model_corpus, CHECKS)
    report = "\n".join(f"  {name}: {problem}" for name, problem in sorted(problems.items()))
    assert not problems, f"{len(problems)} of {len(model_corpus.saved)} families:\n{report}"
    assert len(passed) + len(REFUSED) == len(model_corpus.saved)
    print(f"\n{len(passed)} of {len(model_corpus.saved)} families load like bare; left out: {model_corpus.left_out}")


@pytest.mark.slow
def test_the_hand_written_families_load_as_bare_from_pretrained(tmp_path) -> None:
    """The families a shrunk default config does not give (issue 49 item 2): hybrid Mamba/attention (bamba,
    jamba), MLA + MoE (deepseek_v2), linear attention (kimi_linear), X-MOD with its default language, BLIP-2 and
    InstructBLIP (token ids beside images, the Q-Former's own), vision encoder-decoders at 32 and 384 px, and
    musicgen (two text configs, an EnCodec without SDPA): each builds, and loads through cudaload as bare
    from_pretrained does, its check forward passed or skipped with the reason."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    here = tuple(f for f in HAND_WRITTEN if f.model_type in CONFIG_MAPPING)
    assert {"bamba", "jamba", "deepseek_v2", "xmod-default-language", "blip2-image-text", "ved-32px"} <= {
        f.name for f in here
    }
    corpus = build_corpus(tmp_path, here)
    assert corpus.left_out == {}
    problems, passed = run_corpus(corpus, CHECKS)
    assert problems == {}
    assert sorted(passed) == sorted(f.name for f in here)
