"""A quantization_config you pass is built as you meant it or refused when planning (capability/quant_config.py):
a dict is routed by its quant_method to transformers' own config class, never made 4-bit bitsandbytes; a dict
that names no method and is not bitsandbytes', a key its class does not take, or a string is refused before any
weight is read. And a bitsandbytes checkpoint is planned in the dtype its unquantized weights are applied in
(policy/stored_dtype.py), not warned about after loading."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload.errors import QuantizationError

BNB = cudaload.Machine.simulated("H100", packages={"bitsandbytes": "0.50.2"})


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"quant_type": "Int8WeightOnlyConfig"}, "names no quant_method"),
        ({"load_in_3bit": True}, "names no quant_method"),
        ({"quant_method": "bitsandbytes", "load_in_3bit": True}, "'load_in_3bit', which BitsAndBytesConfig"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_typ": "nf4"}, "'bnb_4bit_quant_typ'"),
        ({"quant_method": "banana", "bits": 4}, "quant_method='banana', which the installed transformers does not"),
        ({"quant_method": "bitsandbytes"}, "without load_in_4bit=True or load_in_8bit=True"),
        ("4bit", "'4bit' \\(str\\) is neither a transformers quantization config nor its dict"),
        (4, "is neither a transformers quantization config"),
    ],
)
def test_a_quantization_config_transformers_would_not_build_as_given_is_refused_when_planning(
    tiny_models: dict[str, Path], config: Any, said: str
) -> None:
    with pytest.raises(QuantizationError, match=said):
        cudaload.plan(tiny_models["llama"], machine=BNB, quantization_config=config)


def test_load_refuses_it_before_loading(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(QuantizationError, match="names no quant_method"):
        cudaload.load(tiny_models["llama"], quantization_config={"quant_type": "Int8WeightOnlyConfig"})
    with pytest.raises(QuantizationError, match="'4bit'"):
        cudaload.load(tiny_models["llama"], quantization_config="4bit")


@pytest.mark.parametrize(
    ("config", "built", "method"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "FineGrainedFP8Config", "fp8"),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "BitsAndBytesConfig", "bitsandbytes"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "BitsAndBytesConfig", "bitsandbytes"),
    ],
)
def test_a_dict_is_routed_by_its_quant_method(
    tiny_models: dict[str, Path], config: dict[str, Any], built: str, method: str
) -> None:
    plan = cudaload.plan(tiny_models["llama"], machine=BNB, quantization_config=config)
    quantization = cudaload.from_pretrained_kwargs(plan)["quantization_config"]
    assert type(quantization).__name__ == built
    assert str(getattr(quantization.quant_method, "value", quantization.quant_method)) == method
    assert plan.kwargs["quantization_config"] == config  # passed as you gave it
    if method == "fp8":
        assert "BitsAndBytesConfig" not in plan.explain()


def _bnb_checkpoint(tmp_path: Path, tiny_models: dict[str, Path]) -> Path:
    """A tiny Qwen3 quantized nf4 by bitsandbytes on this CPU and saved: packed uint8 linears, bf16 the rest."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_type="nf4")
    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen3"], quantization_config=config, dtype=torch.bfloat16)
    path = tmp_path / "bnb4"
    model.save_pretrained(path)
    return path


def test_a_bnb_4bit_checkpoint_planned_float32_says_the_dtype_it_is_applied_in(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    path = _bnb_checkpoint(tmp_path, tiny_models)
    plan = cudaload.plan(path, dtype="float32")
    assert plan.dtype == "bfloat16"
    assert "float32" in [r.value for r in plan.decision("dtype").rejected]
    assert any("dtype='float32' was asked" in w and "stored bfloat16" in w for w in plan.warnings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = cudaload.load(plan)
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "the loaded model holds" in m], said  # the read-back agrees with the plan
    assert model.cudaload_plan.dtype == "bfloat16"
