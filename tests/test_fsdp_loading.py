"""An FSDP2 plan's ranks other than rank 0 read no weights (loaders/fsdp_loading.py): load_for_finetune builds their
model on the meta device, with the dtype, attention, class and computed buffers rank 0 loads, and accelerate's
`fsdp2_prepare_model` fills their shards from rank 0. The real runs (2 "nodes" x 2 ranks, accelerate's own
preparation, the losses of one process, each rank's RSS while loading) are in tests/test_launch_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import cudaload
from cudaload.loaders.fsdp_loading import SKELETON_NOTE, build_skeleton, skeleton_kwargs, skeleton_rank

RANK_1 = {"WORLD_SIZE": "2", "RANK": "1"}
RANK_0 = {"WORLD_SIZE": "2", "RANK": "0"}


def _machine() -> cudaload.Machine:
    """Rank 1 of 2 "nodes" x 2 ranks under torchrun (whose "ddp" is a default: the plan names the engine)."""
    from importlib.metadata import version

    launch = cudaload.Launch(
        launcher="torchrun", rank=1, local_rank=1, world_size=4, local_world_size=2, strategy="ddp"
    )
    packages = {name: version(name) for name in ("peft", "accelerate")}
    return cudaload.Machine.simulated("H100", count=2, launch=launch, packages=packages)


def _plan(model: Path, strategy: str = "fsdp", **kwargs: object) -> cudaload.Plan:
    return cudaload.plan(str(model), machine=_machine(), finetune=True, parallelism=strategy, quantize=None, **kwargs)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp-hybrid"])
def test_only_rank_0_of_an_fsdp2_plan_reads_the_weights(tiny_models: dict[str, Path], strategy: str) -> None:
    plan = _plan(tiny_models["llama"], strategy)
    assert plan.finetune.training_arguments["fsdp_config"]["cpu_ram_efficient_loading"] is True
    assert skeleton_rank(plan, RANK_1) and skeleton_rank(plan, {"WORLD_SIZE": "4", "RANK": "3"})
    assert not skeleton_rank(plan, RANK_0)
    assert not skeleton_rank(plan, {})  # one process: no rank 0 to broadcast from


@pytest.mark.parametrize("strategy", ["ddp", "deepspeed-zero2", "deepspeed-zero3"])
def test_other_strategies_read_their_weights_on_every_rank(tiny_models: dict[str, Path], strategy: str) -> None:
    assert not skeleton_rank(_plan(tiny_models["llama"], strategy), RANK_1)


def test_no_skeleton_without_cpu_ram_efficient_loading_or_for_a_quantized_model(tiny_models: dict[str, Path]) -> None:
    from dataclasses import replace

    plan = _plan(tiny_models["llama"])
    arguments = dict(plan.finetune.training_arguments)
    arguments["fsdp_config"] = {**arguments["fsdp_config"], "cpu_ram_efficient_loading": False}
    off = replace(plan, finetune=replace(plan.finetune, training_arguments=arguments))
    assert not skeleton_rank(off, RANK_1)
    # accelerate 1.16 `fsdp2_prepare_model` never moves Params4bit to meta: a QLoRA rank loads its own.
    quantized = replace(plan, kwargs={**plan.kwargs, "quantization_config": {"load_in_4bit": True}})
    assert not skeleton_rank(quantized, RANK_1)


def test_skeleton_kwargs_take_only_what_a_model_built_from_its_config_applies() -> None:
    split = skeleton_kwargs(
        {"dtype": "bfloat16", "attn_implementation": "sdpa", "use_kernels": False, "trust_remote_code": False}
    )
    assert split is not None
    where, model = split
    assert where == {"trust_remote_code": False}
    assert model == {"dtype": "bfloat16", "attn_implementation": "sdpa", "trust_remote_code": False}
    assert skeleton_kwargs({"dtype": "bfloat16", "use_kernels": True}) is None  # kernels swapped in at load
    assert skeleton_kwargs({"dtype": "bfloat16", "device_map": "auto"}) is None
    assert skeleton_kwargs({"dtype": "auto"}) is None  # the weights' own dtype: only reading them tells


def test_the_skeleton_is_what_from_pretrained_builds_without_its_weights(tiny_models: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = str(tiny_models["llama"])
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype="bfloat16", attn_implementation="eager")
    skeleton = build_skeleton(AutoModelForCausalLM, path, {}, {"dtype": "bfloat16", "attn_implementation": "eager"})
    assert type(skeleton) is type(loaded) and skeleton.config._attn_implementation == "eager"
    assert all(p.is_meta for p in skeleton.parameters())
    shapes = {name: (p.shape, p.dtype) for name, p in skeleton.named_parameters()}
    assert shapes == {name: (p.shape, p.dtype) for name, p in loaded.named_parameters()}
    # Non-persistent buffers (rotary inv_freq) are in no state dict: accelerate keeps each rank's own, so they must
    # be the values from_pretrained computes.
    buffers = dict(skeleton.named_buffers())
    assert buffers.keys() == dict(loaded.named_buffers()).keys() and buffers
    for name, buffer in loaded.named_buffers():
        assert not buffers[name].is_meta and torch.equal(buffers[name], buffer), name


@pytest.mark.parametrize("train", ["lora", "full"])
def test_load_for_finetune_on_rank_1_reads_no_weights_and_says_why_it_skips_the_check(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, train: str
) -> None:
    plan = _plan(tiny_models["llama"], dtype="float32", gradient_checkpointing=False, train=train)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    model = cudaload.load_for_finetune(plan)
    applied = model.cudaload_plan
    assert all(p.is_meta for p in model.parameters())  # the base (and LoRA adapters): rank 0's, by broadcast
    assert applied.device == "meta" and applied.verified is None and applied.verify_note == SKELETON_NOTE
    assert applied.attn_implementation == "sdpa" and applied.dtype == "float32"
    assert applied.plan.finetune.trainable_parameters > 0
    monkeypatch.setenv("RANK", "0")
    rank_0 = cudaload.load_for_finetune(plan)
    assert not any(p.is_meta for p in rank_0.parameters()) and rank_0.cudaload_plan.verified is True
    trained = {n for n, p in rank_0.named_parameters() if p.requires_grad}
    assert trained == {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n: p.shape for n, p in rank_0.named_parameters()} == {n: p.shape for n, p in model.named_parameters()}
