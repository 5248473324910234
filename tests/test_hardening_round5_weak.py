"""Issue 39 item 10, the weak cases of model shapes, fine-tuning and pipeline_kwargs: each is refused with
a true reason, warned about, or accepted as transformers and peft accept it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import ModelConfigError, SettingError

# --- model shapes ---------------------------------------------------------------------------------------


def _with_config(source: Path, tmp_path: Path, **values: Any) -> str:
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(values)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("factor", [-2, 0, "banana", "4"])
def test_a_rope_factor_that_is_no_positive_number_is_refused(tiny_models, tmp_path, factor) -> None:
    scaling = {"rope_type": "linear", "factor": factor, "rope_theta": 10000.0}
    folder = _with_config(tiny_models["llama"], tmp_path, rope_parameters=scaling)
    with pytest.raises(ModelConfigError, match=rf"RoPE scaling factor={factor!r} \(rope_type 'linear'\)"):
        cudaload.plan(folder)


def test_a_rope_factor_of_four_is_planned(tiny_models, tmp_path) -> None:
    scaling = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    folder = _with_config(tiny_models["llama"], tmp_path, rope_parameters=scaling)
    assert cudaload.plan(folder, dtype="float32").dtype == "float32"


def test_a_config_file_is_refused_alike_by_plan_and_load(tiny_models) -> None:
    config = str(tiny_models["llama"] / "config.json")
    messages = []
    for call in (cudaload.plan, cudaload.load):
        with pytest.raises(ModelConfigError, match="is a file, not a model folder") as caught:
            call(config)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


# --- pipeline_kwargs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "advice"),
    [
        ("model", "gpt2", "pass the model once"),
        ("tokenizer", "gpt2", "tokenizer_kwargs="),
        ("device", "cuda:0", "the plan places the model"),
        ("device_map", "auto", "pass device_map= as a keyword"),
        ("dtype", "float16", "pass dtype= as a keyword"),
        ("torch_dtype", "float16", "pass dtype= as a keyword"),
    ],
)
def test_a_load_setting_in_pipeline_kwargs_is_refused_before_loading(tmp_path, key, value, advice) -> None:
    # An empty folder: were the model loaded first, the error would be a ModelConfigError about it.
    with pytest.raises(SettingError, match=rf"pipeline_kwargs=\{{'{key}': '{value}'\}}.*{advice}"):
        cudaload.pipeline("text-generation", str(tmp_path), pipeline_kwargs={key: value})
