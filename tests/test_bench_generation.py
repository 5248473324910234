"""The bench's generation comparison: the plan's generate() settings against default generate()."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import cudaload
from cudaload.bench.generate_bench import (
    compare_generation,
    default_padding_side,
    generation_variants,
    prompt_lengths,
)
from cudaload.bench.harness import workload_for
from cudaload.bench.report import format_generation


def _rows(variants):
    return [(v.name, v.generate_kwargs, v.padding_side, v.is_plan, v.is_default) for v in variants]


def test_variants_on_a_gpu_plan_a_static_cache_against_default_and_each_rejected_cache(tiny_models) -> None:
    h100 = cudaload.Machine.simulated("H100")
    generation = cudaload.plan(
        str(tiny_models["qwen3"]), machine=h100, generate=True, workload="decode-heavy"
    ).generation
    assert generation.cache_implementation == "static"
    assert _rows(generation_variants(generation, "right")) == [
        ("plan", {"cache_implementation": "static"}, "left", True, False),
        ("default generate()", {}, "right", False, True),
        # The rejected dynamic cache, padded as planned: not the same call as default generate().
        ("dynamic cache", {"cache_implementation": "dynamic"}, "left", False, False),
        ("offloaded cache", {"cache_implementation": "offloaded"}, "left", False, False),
    ]


def test_a_plan_equal_to_default_generate_is_measured_once(tiny_models) -> None:
    cpu = cudaload.Machine.simulated()
    generation = cudaload.plan(str(tiny_models["qwen3"]), machine=cpu, generate=True).generation
    assert generation.generate_kwargs == {} and generation.padding_side == "left"
    # A tokenizer that already pads left: the plan is default generate(), one row carries both marks.
    assert _rows(generation_variants(generation, "left")) == [
        ("plan", {}, "left", True, True),
        ("static cache", {"cache_implementation": "static"}, "left", False, False),
    ]
    assert [v.name for v in generation_variants(generation, "right")] == [
        "plan",
        "default generate()",
        "static cache",
    ]


def test_default_padding_is_the_tokenizers_own_else_transformers_right(tiny_models, tmp_path: Path) -> None:
    assert default_padding_side(tmp_path) == "right"  # no tokenizer: PreTrainedTokenizerBase's default
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["qwen3"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": "left"}))
    assert default_padding_side(folder) == "left"


def test_prompts_of_a_batch_differ_in_length_so_padding_matters() -> None:
    assert prompt_lengths(256, 4) == [256, 224, 192, 160]
    assert prompt_lengths(64, 2) == [64, 48]
    assert prompt_lengths(7, 1) == [7]


def test_generation_batch_is_checked_like_the_other_workload_settings() -> None:
    assert workload_for(quick=True).generation_batch == 2 and workload_for(quick=False).generation_batch == 4
    assert workload_for(quick=False, generation_batch=3).generation_batch == 3
    with pytest.raises(cudaload.SettingError, match="generation_batch=0"):
        workload_for(quick=True, generation_batch=0)


@pytest.mark.slow
def test_the_comparison_measures_the_kv_cache_generate_really_holds(tiny_models) -> None:
    path = tiny_models["llama"]
    config = json.loads((path / "config.json").read_text())
    the_plan = cudaload.plan(str(path), machine=cudaload.Machine.simulated(), generate=True, dtype="float32")
    work = workload_for(quick=True, prompt_tokens=12, new_tokens=5)
    section = compare_generation(path, the_plan, work, 3, config["vocab_size"], on_cuda=False)

    assert section["prompt_lengths"] == [12, 10, 8] and section["batch"] == 3
    rows = {row["name"]: row for row in section["variants"]}
    assert set(rows) == {"plan", "default generate()", "static cache"}
    # By hand from config.json: layers x KV heads x head dim x (K + V) x 4 bytes (float32), for 3
    # sequences of the longest prompt + 5 new tokens - 1 (the last token is never fed back).
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    per_token = config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2 * 4
    expected = 3 * (12 + 5 - 1) * per_token
    assert section["kv_cache_bytes_planned"] == expected
    for row in rows.values():
        assert row["ok"], row["error"]
        assert row["kv_cache_bytes"] == expected, row["name"]
        assert row["decode_tokens_per_s"] > 0 and row["generate_s"] > 0
    # Left padding (the plan's) continues every prompt as it continues alone; right padding, what a
    # tokenizer does by default, makes the shorter prompts continue from pad tokens.
    assert rows["plan"]["padding_side"] == "left" and rows["plan"]["matches_unpadded"] == 3
    assert rows["default generate()"]["padding_side"] == "right"
    assert rows["default generate()"]["matches_unpadded"] < 3
    # Over default generate(), from the rows' own numbers: generate time default / row, decode rate
    # row / default (> 1: faster than default). The default row over itself is 1.0 whatever was
    # measured, so the other rows carry the check, both metrics, each in its direction.
    default = rows["default generate()"]
    assert default["speedup_over_default"] == {"generate": 1.0, "decode": 1.0}
    for name in ("plan", "static cache"):
        row = rows[name]
        assert row["speedup_over_default"] == {
            "generate": pytest.approx(default["generate_s"] / row["generate_s"], rel=1e-3, abs=1e-4),
            "decode": pytest.approx(row["decode_tokens_per_s"] / default["decode_tokens_per_s"], rel=1e-3, abs=1e-4),
        }, name

    table = format_generation(section)
    assert "* plan" in table and "default generate()" in table and f"{expected / 2**20:.2f} MiB" in table
    assert "3/3" in table
