"""Facts about the installed transformers and peft that applying a plan depends on (capability/transformers_api.py):
read in capability, once, and followed by the code that applies the plan, which probes nothing itself."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import FinetuneConfigError, Machine
from cudaload.capability import transformers_api
from cudaload.plans import ApplyFacts, FinetunePlan, Plan


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
def test_checkpointing_follows_the_plan_s_fact_about_transformers_not_the_model(name: str) -> None:
    from cudaload.finetune import _prepare

    model = _Model()
    section = FinetunePlan(
        lora={},
        training_arguments={},
        memory_estimate={},
        gradient_checkpointing=True,
        checkpointing_kwargs={"use_reentrant": False},
    )
    _prepare(model, section, name)
    assert model.calls == [(f"{name}_enable", {f"{name}_kwargs": {"use_reentrant": False}})]
    assert model.config.use_cache is False
    _prepare(without := _Model(), section, None)  # a plan without the planner's facts: the name every 5.x has
    assert without.calls == [
        ("gradient_checkpointing_enable", {"gradient_checkpointing_kwargs": {"use_reentrant": False}})
    ]


def test_the_planner_reads_the_facts_apply_needs(tiny_models: dict[str, Path]) -> None:
    a100 = Machine.simulated("A100")
    finetune = cudaload.plan(str(tiny_models["llama"]), machine=a100, finetune=True)
    assert finetune.apply_facts is not None
    assert finetune.apply_facts.checkpointing_method == transformers_api.checkpointing_method()
    assert finetune.apply_facts.tensor_parallel_argument is None  # no tp_plan: nothing read
    # A machine you pass is not this process's: no description of it, none of its cached kernels.
    assert finetune.apply_facts.machine_here is None and finetune.apply_facts.cached_kernels == frozenset()
    inference = cudaload.plan(str(tiny_models["llama"]), machine=a100)
    here = cudaload.plan(str(tiny_models["llama"]), probe=False)  # planned for this machine: its facts
    assert here.apply_facts is not None and here.apply_facts.machine_here == cudaload.detect().usable().describe()
    assert here.apply_facts.cached_kernels == {k.repo for k in cudaload.detect().hub.kernels if k.cached}
    # Not part of the plan's value, not in its JSON; a pickled plan keeps them (what its process read).
    assert replace(here, apply_facts=None) == here and "apply_facts" not in here.to_json()
    assert pickle.loads(pickle.dumps(here)).apply_facts == here.apply_facts
    assert inference.apply_facts is not None and inference.apply_facts.checkpointing_method is None


def test_the_checkpointing_fact_is_the_installed_transformers() -> None:
    from transformers import PreTrainedModel

    renamed = hasattr(PreTrainedModel, "activation_checkpointing_enable")
    assert transformers_api.checkpointing_method() == (
        "activation_checkpointing" if renamed else "gradient_checkpointing"
    )


def _tp_plan(argument: str | None) -> Plan:
    return Plan(
        model="m",
        machine="x",
        kwargs={"dtype": "bfloat16", "tp_plan": "auto"},
        attention_chain=("sdpa",),
        decisions=(),
        apply_facts=ApplyFacts(tensor_parallel_argument=argument),
    )


def test_tensor_parallelism_is_passed_the_way_the_installed_transformers_takes_it() -> None:
    from cudaload.loaders import from_pretrained_kwargs

    try:
        from transformers.distributed import DistributedConfig  # type: ignore[attr-defined]
    except ImportError:
        DistributedConfig = None
    assert transformers_api.tensor_parallel_argument() == (
        "tp_plan" if DistributedConfig is None else "distributed_config"
    )
    # The loader follows the plan's fact (ApplyFacts), read by the planner: it asks transformers nothing.
    assert from_pretrained_kwargs(_tp_plan("tp_plan")) == {"dtype": "bfloat16", "tp_plan": "auto"}
    assert from_pretrained_kwargs(_tp_plan(None)) == {"dtype": "bfloat16", "tp_plan": "auto"}
    if DistributedConfig is not None:
        kwargs = from_pretrained_kwargs(_tp_plan("distributed_config"))
        assert "tp_plan" not in kwargs and isinstance(kwargs["distributed_config"], DistributedConfig)
    from cudaload.facts.model import reference_model

    planned = cudaload.plan(reference_model(), machine=Machine.simulated("A100"), tp_plan="auto")
    assert planned.apply_facts is not None
    assert planned.apply_facts.tensor_parallel_argument == transformers_api.tensor_parallel_argument()
