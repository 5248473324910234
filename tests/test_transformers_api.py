"""Facts about the installed transformers and peft that applying a plan depends on (capability/transformers_api.py):
read in capability, once, and followed by the code that applies the plan, which probes nothing itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import FinetuneConfigError, Machine
from cudaload.capability import transformers_api
from cudaload.plans import FinetunePlan, Plan


def test_lora_settings_peft_refuses_fail_at_plan_time(tiny_models: dict[str, Path]) -> None:
    # plan() itself asks peft (it used to be asked only by load_for_finetune, after planning).
    with pytest.raises(FinetuneConfigError, match=r"LoraConfig refuses these LoRA settings \(\{'bogus': 1\}.*bogus"):
        cudaload.plan(str(tiny_models["llama"]), machine=Machine.simulated("A100"), finetune=True, lora={"bogus": 1})
    assert transformers_api.lora_refusal({"r": 8}) is None
    assert (transformers_api.lora_refusal({"r": 8, "bogus": 1}) or "").startswith("TypeError: ")


class _Model:
    """A model with both checkpointing switches, recording which one was used."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.config = type("Config", (), {"use_cache": True})()

    def parameters(self) -> list[Any]:
        return []

    def activation_checkpointing_enable(self, **kwargs: Any) -> None:
        self.calls.append(("activation_checkpointing_enable", kwargs))

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.calls.append(("gradient_checkpointing_enable", kwargs))

    def enable_input_require_grads(self) -> None:
        pass


@pytest.mark.parametrize("name", ["gradient_checkpointing", "activation_checkpointing"])
def test_checkpointing_follows_the_fact_about_transformers_not_the_model(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudaload.finetune import _prepare

    monkeypatch.setattr(transformers_api, "checkpointing_method", lambda: name)
    model = _Model()
    section = FinetunePlan(
        lora={},
        training_arguments={},
        memory_estimate={},
        gradient_checkpointing=True,
        checkpointing_kwargs={"use_reentrant": False},
    )
    _prepare(model, section)
    assert model.calls == [(f"{name}_enable", {f"{name}_kwargs": {"use_reentrant": False}})]
    assert model.config.use_cache is False


def test_the_checkpointing_fact_is_the_installed_transformers() -> None:
    from transformers import PreTrainedModel

    renamed = hasattr(PreTrainedModel, "activation_checkpointing_enable")
    assert transformers_api.checkpointing_method() == (
        "activation_checkpointing" if renamed else "gradient_checkpointing"
    )


def _tp_plan() -> Plan:
    return Plan(
        model="m", machine="x", kwargs={"dtype": "bfloat16", "tp_plan": "auto"}, attention_chain=("sdpa",), decisions=()
    )


def test_tensor_parallelism_is_passed_the_way_the_installed_transformers_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cudaload.loaders import from_pretrained_kwargs

    try:
        from transformers.distributed import DistributedConfig  # type: ignore[attr-defined]
    except ImportError:
        DistributedConfig = None
    assert transformers_api.tensor_parallel_argument() == (
        "tp_plan" if DistributedConfig is None else "distributed_config"
    )
    monkeypatch.setattr(transformers_api, "tensor_parallel_argument", lambda: "tp_plan")
    assert from_pretrained_kwargs(_tp_plan()) == {"dtype": "bfloat16", "tp_plan": "auto"}
    if DistributedConfig is not None:
        monkeypatch.setattr(transformers_api, "tensor_parallel_argument", lambda: "distributed_config")
        kwargs = from_pretrained_kwargs(_tp_plan())
        assert "tp_plan" not in kwargs and isinstance(kwargs["distributed_config"], DistributedConfig)
