"""One fit judgement for placement and quantize="auto": both look at the same GPU."""

from __future__ import annotations

import pytest

from cudaload import Launch, Machine
from cudaload.facts.machine import GiB
from cudaload.policy import Request, decide_plan
from cudaload.policy.fit import HEADROOM, TRAINING_SHARE, fit_one_gpu
from model_shapes import llama

BNB = {"bitsandbytes": "0.50.2", "peft": "0.21.2"}
DDP2 = Launch("torchrun", rank=1, local_rank=1, world_size=2, local_world_size=2, strategy="ddp")


def finetune(machine: Machine, billions: float):
    return decide_plan(machine, llama(billions), Request(training=True, quantize="auto"))


def _index(machine: Machine, name: str) -> int:
    return next(g.index for g in machine.gpus if name in g.name)


@pytest.mark.parametrize("gpus", [["A100", "T4"], ["T4", "A100"]])
def test_a_model_that_fits_the_big_gpu_is_not_quantized_and_goes_there(gpus: list[str]) -> None:
    # 8B bf16 LoRA needs ~20 GiB: more than a T4's 90%, far less than an A100's.
    machine = Machine.simulated(gpus, packages=BNB)
    plan = finetune(machine, 8)
    quantize = plan.decision("quantize")
    assert quantize.value is None, quantize.reason
    assert "A100" in quantize.reason and "T4" not in quantize.reason
    assert plan.kwargs["device_map"] == f"cuda:{_index(machine, 'A100')}"
    assert "quantization_config" not in plan.kwargs


def test_a_model_that_fits_no_gpu_is_quantized_judged_on_the_big_gpu() -> None:
    machine = Machine.simulated(["T4", "A100"], packages=BNB)
    plan = finetune(machine, 70)  # ~140 GiB of bf16 weights
    quantize = plan.decision("quantize")
    assert quantize.value == "4bit"
    assert "usable on NVIDIA A100" in quantize.reason


def test_data_parallel_ranks_are_judged_on_the_smallest_gpu() -> None:
    # Each rank holds a whole copy on its own GPU: the T4 rank must fit too.
    machine = Machine.simulated(["A100", "T4"], launch=DDP2, packages=BNB)
    fit = fit_one_gpu(machine, 20 * GiB, TRAINING_SHARE)
    assert fit.per_rank and "T4" in fit.gpu.name and not fit.fits
    quantize = finetune(machine, 8).decision("quantize")
    assert quantize.value == "4bit" and "T4" in quantize.reason


def test_two_equal_gpus_pick_the_first() -> None:
    machine = Machine.simulated("A100", count=2)
    fit = fit_one_gpu(machine, GiB, HEADROOM)
    assert fit.gpu.index == 0 and fit.fits


def test_exactly_the_budget_fits_one_byte_more_does_not() -> None:
    machine = Machine.simulated("T4")
    budget = int(machine.gpus[0].usable_memory * HEADROOM)
    assert fit_one_gpu(machine, budget, HEADROOM).fits
    assert not fit_one_gpu(machine, budget + 1, HEADROOM).fits
    assert fit_one_gpu(machine, budget, HEADROOM).budget == budget


def test_without_a_gpu_nothing_fits_a_gpu() -> None:
    fit = fit_one_gpu(Machine.simulated(), 1, HEADROOM)
    assert fit.gpu is None and not fit.fits and fit.describe() == "no GPU"
