"""One fit judgement (policy/fit.py) for placement and quantize="auto": both look at the same GPU,
on mixed machines in either index order, equal GPUs, no GPU, and per rank under torchrun."""

from __future__ import annotations

import re

import pytest

from cudaload import Launch, Machine, PlacementError
from cudaload.facts.machine import GiB
from cudaload.plans import Plan
from cudaload.policy import Request, decide_plan
from cudaload.policy.fit import HEADROOM, TRAINING_SHARE, judge_fit, percent, pinned_gpu
from cudaload.policy.memory import estimate_training_memory
from cudaload.policy.quantization import decide_quantization
from cudaload.request import TrainingRequest
from model_shapes import llama

BNB = {"bitsandbytes": "0.50.2", "peft": "0.21.2"}


def _ddp(rank: int, world: int = 2) -> Launch:
    return Launch("torchrun", rank=rank, local_rank=rank, world_size=world, local_world_size=world, strategy="ddp")


def finetune(machine: Machine, billions: float) -> Plan:
    return decide_plan(machine, llama(billions), Request(training=TrainingRequest(quantize="auto")))


def _index(machine: Machine, name: str) -> int:
    return next(g.index for g in machine.gpus if name in g.name)


def _judged_index(reason: str) -> int:
    """The cuda:<i> the quantize reason says it judged on."""
    found = re.findall(r"usable on [^(]+\(cuda:(\d+),", reason)
    assert len(found) == 1, reason
    return int(found[0])


# --- mixed machines: quantize="auto" and placement judge the same GPU ------------------------------


@pytest.mark.parametrize("gpus", [["A100", "T4"], ["T4", "A100"]])
def test_a_model_that_fits_the_big_gpu_is_not_quantized_and_goes_there(gpus: list[str]) -> None:
    # 8B fp16 LoRA needs ~20 GiB: more than a T4's 90% (13.5 GiB), far less than an A100's (72 GiB).
    machine = Machine.simulated(gpus, packages=BNB)
    a100 = _index(machine, "A100")
    plan = finetune(machine, 8)
    quantize = plan.decision("quantize")
    assert quantize.value is None, quantize.reason
    assert "quantization_config" not in plan.kwargs
    assert "A100" in quantize.reason and "T4" not in quantize.reason
    assert _judged_index(quantize.reason) == a100
    assert plan.kwargs["device_map"] == f"cuda:{a100}"
    assert f"(cuda:{a100}," in plan.decision("device_map").reason
    assert not plan.warnings
    # The estimate, by hand (bf16 on the A100, 2048 tokens): weights 8,029,995,008 x 2 B = 14.96 GiB;
    # LoRA 41,943,040 parameters x 16 B (fp32 weight, grad, AdamW) = 0.625 GiB; activations 32 x 2048
    # x 4096 x 2 B of checkpointed inputs (0.5 GiB) + logits 12 B x 2048 x 128256 (2.94 GiB) = 3.44 GiB;
    # + 1 GiB CUDA overhead = 20.02 GiB.
    assert "estimated 20.0 GiB" in quantize.reason
    assert "(weights 15.0 GiB, LoRA+Adam 0.6 GiB, activations 3.4 GiB)" in quantize.reason


@pytest.mark.parametrize("gpus", [["A100", "T4"], ["T4", "A100"]])
def test_a_model_that_fits_no_gpu_is_quantized_judged_on_the_big_gpu_and_placed_there(gpus: list[str]) -> None:
    # 70B: ~130 GiB in 16-bit LoRA (fits neither), ~43 GiB as QLoRA (fits the A100).
    machine = Machine.simulated(gpus, packages=BNB)
    a100 = _index(machine, "A100")
    plan = finetune(machine, 70)
    quantize = plan.decision("quantize")
    assert quantize.value == "4bit"
    assert plan.kwargs["quantization_config"]["load_in_4bit"] is True
    assert "usable on NVIDIA A100" in quantize.reason and "T4" not in quantize.reason
    assert _judged_index(quantize.reason) == a100
    assert plan.kwargs["device_map"] == f"cuda:{a100}"
    assert not any("Even 4-bit" in w for w in plan.warnings)
    # By hand: llama(70) is 280 layers of the 8B's: 61,069,066,240 projection weights + 1,050,673,152
    # in the embeddings; 16-bit: x 2 B = 115.71 GiB; LoRA 367,001,600 x 16 B = 5.47 GiB; activations
    # 280 x 2048 x 4096 x 2 B + 12 x 2048 x 128256 B = 7.31 GiB; + 1 GiB = 129.49 GiB.
    assert "(weights 115.7 GiB, LoRA+Adam 5.5 GiB, activations 7.3 GiB)" in quantize.reason
    # QLoRA: nf4 61,069,066,240 x (1/2 + 1/64 + 4/16384) B = 31,503,646,720 + the rest x 2 B = 31.30 GiB;
    # LoRA with paged 8-bit AdamW 367,001,600 x (8 + 2 + 8/256) B = 3.43 GiB; same activations 7.31
    # GiB; + 1 GiB = 43.04 GiB.
    assert "QLoRA needs ~43.0 GiB" in quantize.reason


def test_even_4bit_too_big_is_refused_before_it_would_offload_a_quantized_base() -> None:
    # Placement would spread it over both GPUs and the CPU for the rest, but transformers' bitsandbytes
    # quantizer refuses CPU-dispatched modules unless llm_int8_enable_fp32_cpu_offload is set (and they would
    # then train unquantized in fp32 on the CPU): refused when planned, not when from_pretrained raises.
    machine = Machine.simulated(["T4", "A100"], packages=BNB)
    with pytest.raises(PlacementError) as refused:
        finetune(machine, 300)  # ~165 GiB even as QLoRA
    # By hand: 1200 layers of the 8B's: nf4 projections 261,724,569,600 x (1/2 + 1/64 + 4/16384) B
    # = 135,015,628,800 + embeddings 2 x 1,050,673,152 B = 127.70 GiB of weights.
    message = str(refused.value)
    assert "~127.7 GiB of weights (quantized) exceed all GPU memory together" in message
    assert "llm_int8_enable_fp32_cpu_offload" in message


def test_two_equal_gpus_are_judged_and_used_at_the_first() -> None:
    machine = Machine.simulated("A100", count=2, packages=BNB)
    fit = judge_fit(machine, GiB, HEADROOM)
    assert fit.gpu is not None and fit.gpu.index == 0 and fit.devices == (0,)
    assert fit.budget == 64 * GiB  # 80% of the first A100's 80 GiB
    plan = finetune(machine, 8)
    assert plan.decision("quantize").value is None
    assert _judged_index(plan.decision("quantize").reason) == 0
    assert plan.kwargs["device_map"] == "cuda:0"


def test_cpu_only_neither_quantizes_nor_judges_a_gpu() -> None:
    machine = Machine.simulated(packages=BNB)
    plan = finetune(machine, 8)
    assert plan.decision("quantize").value is None
    assert plan.decision("quantize").reason.startswith("no GPU")
    assert plan.kwargs["device_map"] == "cpu"


# --- torchrun: every rank holds a copy on its own GPU --------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_ranks_on_a_mixed_node_agree_judged_on_the_smallest_gpu(rank: int) -> None:
    # Rank 0 has the A100, but rank 1's copy must fit the T4: both ranks quantize, each on its own GPU.
    machine = Machine.simulated(["A100", "T4"], launch=_ddp(rank), packages=BNB)
    plan = finetune(machine, 8)
    quantize = plan.decision("quantize")
    assert quantize.value == "4bit"
    assert "Tesla T4 (cuda:1, the smallest of 2 GPUs" in quantize.reason
    assert plan.kwargs["device_map"] == {"": rank}


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_on_two_equal_gpus_each_rank_keeps_16bit_on_its_own_gpu(rank: int) -> None:
    machine = Machine.simulated("A100", count=2, launch=_ddp(rank), packages=BNB)
    plan = finetune(machine, 8)
    assert plan.decision("quantize").value is None
    assert plan.kwargs["device_map"] == {"": rank}
    fit = judge_fit(machine, 20 * GiB, TRAINING_SHARE)
    assert fit.per_rank and fit.fits and fit.gpu is not None and fit.gpu.index == 0
    assert fit.budget == 72 * GiB  # 90% of 80 GiB: a rank's whole copy is not divided


def test_torchrun_spread_budgets_are_shared_by_the_nodes_ranks() -> None:
    machine = Machine.simulated(["A100", "T4"], launch=_ddp(1))
    fit = judge_fit(machine, 100 * GiB, HEADROOM)
    # 80% of each GPU's free memory (A100 80 GiB -> 64, T4 15 GiB -> 12), halved for the 2 ranks.
    assert fit.spread == {0: 32 * GiB, 1: 6 * GiB}
    single = judge_fit(Machine.simulated(["A100", "T4"]), 100 * GiB, HEADROOM)
    assert single.spread == {0: 64 * GiB, 1: 12 * GiB}


# --- a device_map you pin decides the GPU judged (single process) --------------------------------


def _estimates(billions: float):
    return {
        q: estimate_training_memory(
            llama(billions), dtype="float16", quantize=q, r=16, targets=("q_proj", "v_proj"), on_gpu=True
        )
        for q in (None, "4bit", "8bit")
    }


def test_a_device_map_pinned_to_the_small_gpu_is_judged_there() -> None:
    machine = Machine.simulated(["A100", "T4"], packages=BNB)
    estimates = _estimates(8)
    free = decide_quantization(machine, llama(8), "auto", "float16", estimates)[0]
    pinned = decide_quantization(machine, llama(8), "auto", "float16", estimates, device_map={"": "cuda:1"})[0]
    assert free.value is None and "A100" in free.reason
    assert pinned.value == "4bit" and "usable on Tesla T4" in pinned.reason and "A100" not in pinned.reason


def test_a_pinned_gpu_does_not_change_a_ranks_judgement() -> None:
    machine = Machine.simulated(["A100", "T4"], launch=_ddp(0))
    assert judge_fit(machine, GiB, HEADROOM, pinned=0).gpu == machine.gpus[1]


@pytest.mark.parametrize(
    ("device_map", "index"),
    [
        (1, 1),
        ("cuda:1", 1),
        ("cuda", 0),
        ({"": 0}, 0),
        ({"model": "cuda:1", "lm_head": 1}, 1),
        ({"model": 0, "lm_head": 1}, None),
        ("auto", None),
        ("cpu", None),
        ({"": "cpu"}, None),
        (None, None),
        (True, None),
    ],
)
def test_pinned_gpu(device_map: object, index: int | None) -> None:
    assert pinned_gpu(device_map) == index


# --- the fit function's own edges -----------------------------------------------------------------


def test_exactly_the_budget_fits_one_byte_more_does_not() -> None:
    machine = Machine.simulated("T4")
    budget = 12 * GiB  # 80% of the T4's 15 GiB
    at = judge_fit(machine, budget, HEADROOM)
    assert at.fits and at.budget == budget and at.devices == (0,)
    over = judge_fit(machine, budget + 1, HEADROOM)
    assert not over.fits and not over.fits_spread and over.devices == ()


def test_exactly_the_spread_fits_one_byte_more_does_not() -> None:
    machine = Machine.simulated(["T4", "A100"])
    total = 76 * GiB  # 80% of 15 GiB + 80% of 80 GiB = 12 + 64 GiB
    at = judge_fit(machine, total, HEADROOM)
    assert at.spread == {0: 12 * GiB, 1: 64 * GiB}
    assert not at.fits and at.fits_spread and at.devices == (0, 1)
    assert not judge_fit(machine, total + 1, HEADROOM).fits_spread


def test_the_share_sets_the_budget() -> None:
    machine = Machine.simulated("T4")
    # The T4's 15 GiB: 12 GiB at 80% (HEADROOM), 13.5 GiB at 90% (TRAINING_SHARE).
    assert judge_fit(machine, 12 * GiB, HEADROOM).fits
    assert not judge_fit(machine, 12 * GiB + 1, HEADROOM).fits
    assert judge_fit(machine, 12 * GiB + 1, TRAINING_SHARE).fits
    assert judge_fit(machine, 27 * GiB // 2, TRAINING_SHARE).fits
    assert not judge_fit(machine, 27 * GiB // 2 + 1, TRAINING_SHARE).fits


def test_without_a_gpu_nothing_fits_a_gpu() -> None:
    fit = judge_fit(Machine.simulated(), 1, HEADROOM)
    assert fit.gpu is None and fit.budget == 0 and fit.spread == {}
    assert not fit.fits and not fit.fits_spread and fit.devices == ()
    assert fit.where == "no GPU"


def test_zero_bytes_fit_any_gpu() -> None:
    assert judge_fit(Machine.simulated("T4"), 0, HEADROOM).fits


def test_the_reason_says_the_gpu_the_budget_and_the_share() -> None:
    machine = Machine.simulated(["T4", "A100"])
    fit = judge_fit(machine, 20 * GiB, TRAINING_SHARE)
    assert fit.reason == (
        "~20.0 GiB fit in 72.0 GiB usable on NVIDIA A100-SXM4-80GB (cuda:1, the most free memory of 2 GPUs) "
        "(90% of 80.0 GiB free)"
    )
    only = judge_fit(Machine.simulated("T4"), 20 * GiB, TRAINING_SHARE)
    assert only.reason == "~20.0 GiB do not fit in 13.5 GiB usable on Tesla T4 (90% of 15.0 GiB free)"


def test_reasons_write_the_shares_as_percentages() -> None:
    assert (percent(HEADROOM), percent(TRAINING_SHARE)) == ("80%", "90%")
    assert percent(0.85) == "85%"  # the text follows the share, whatever it is
    plan = decide_plan(Machine.simulated("T4", count=2), llama(8), Request())
    assert plan.kwargs["device_map"] == "auto"
    assert plan.kwargs["max_memory"] == {0: "12.0GiB", 1: "12.0GiB"}  # 80% of each T4's 15 GiB
    assert "(80% of each one's free memory)" in plan.decision("device_map").reason


def test_a_device_map_pinning_the_small_gpu_is_what_quantize_auto_judges() -> None:
    # Through decide_plan, as plan() calls it: the 8B LoRA fits the A100, not the T4 it is pinned to.
    machine = Machine.simulated(["A100", "T4"], packages=BNB)
    t4 = _index(machine, "T4")
    plan = decide_plan(machine, llama(8), Request(training=TrainingRequest(quantize="auto"), device_map=f"cuda:{t4}"))
    assert plan.decision("quantize").value == "4bit"
    assert "T4" in plan.decision("quantize").reason
    assert plan.kwargs["device_map"] == f"cuda:{t4}"


def test_a_plan_that_lands_on_one_gpu_of_a_mixed_machine_is_judged_on_that_gpu() -> None:
    # Llama-3-70B fits neither GPU of a T4 + A100 in 16 bits, so placement first judged both (the T4 decided
    # float16); the 4-bit copy then landed on the A100 alone, which runs bf16: that GPU decides.
    machine = Machine.simulated(["T4", "A100"], packages={"bitsandbytes": "0.50.2", "peft": "0.21.2"})
    plan = decide_plan(machine, llama(70), Request(training=TrainingRequest(quantize="auto")))
    assert plan.kwargs["device_map"] == "cuda:1" and plan.decision("quantize").value == "4bit"
    assert plan.dtype == "bfloat16" and "A100" in plan.decision("dtype").reason
    assert plan.kwargs["quantization_config"]["bnb_4bit_compute_dtype"] == "bfloat16"
