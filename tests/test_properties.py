"""Properties of the policy over random simulated machines, models and user settings (hypothesis):
whatever the input, the plan is valid for the machine and honours what the user set, or raises a
cudaload error; never a foreign exception."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cudaload import CudaloadError, Machine
from cudaload.facts.catalog import KNOWN_GPUS
from cudaload.facts.machine import Launch
from cudaload.facts.model import any_model
from cudaload.policy import Request, decide_plan
from cudaload.request import TrainingRequest
from cudaload.upstream_flash import FLASH_OPTIONS
from model_shapes import llama

GPUS = [g.name for g in KNOWN_GPUS]
PACKAGES = {
    "flash-attn": ["2.3.2", "2.5.9", "2.8.3"],
    "flash-attn-3": ["3.0.0"],
    "flash-attn-4": ["4.0.0b1", "4.0.0b5"],
    "kernels": ["0.17.2", "0.19.1"],
    "bitsandbytes": ["0.50.2"],
    "peft": ["0.21.2"],
}
HUB_REPOS = [o.hub_repo for o in FLASH_OPTIONS.values()]


@st.composite
def machines(draw: st.DrawFn, worlds: tuple[int, ...] = (1, 1, 2, 4), required: tuple[str, ...] = ()) -> Machine:
    gpu = draw(st.none() | st.sampled_from(GPUS))
    chosen = set(draw(st.lists(st.sampled_from(sorted(PACKAGES)), unique=True))) | set(required)
    packages = {name: draw(st.sampled_from(PACKAGES[name])) for name in sorted(chosen)}
    world = draw(st.sampled_from(worlds))
    launch = (
        Launch(
            launcher="torchrun",
            world_size=world,
            local_world_size=world,
            local_rank=draw(st.integers(0, world - 1)),
            strategy=draw(st.sampled_from(["ddp", "fsdp"])),
        )
        if world > 1
        else None
    )
    return Machine.simulated(
        gpu,
        # one GPU (the kind each rank has), or a count of at least the launch's ranks (fewer is refused)
        count=draw(st.sampled_from([1, *range(max(world, 2), 5)])) if gpu else 1,
        packages=packages,
        offline=draw(st.booleans()),
        cached_kernels=draw(st.lists(st.sampled_from(HUB_REPOS), unique=True)),
        cpu_flags=draw(st.sampled_from([("avx2",), ("avx2", "avx512_bf16", "amx_bf16")])),
        launch=launch,
    )


@st.composite
def models(draw: st.DrawFn):
    return replace(
        any_model(),
        model_type=draw(st.sampled_from(["llama", "gemma2", "glm4", "qwen3"])),
        supports_flash=draw(st.booleans()),
        supports_sdpa=draw(st.booleans()),
        supports_flex=draw(st.booleans()),
        softcap=draw(st.none() | st.just(30.0)),
        checkpoint_dtype=draw(st.sampled_from([None, "float32", "float16", "bfloat16"])),
        head_dims=draw(st.sampled_from([(), (64,), (128,), (192,), (256,), (512,)])),
        parameters=draw(st.integers(10**6, 10**11)),
        hidden_size=4096,
        num_layers=32,
        vocab_size=32000,
    )


@st.composite
def trainable_models(draw: st.DrawFn):
    """models() with the linear layers LoRA wraps, of a real size: any_model() has none, so every
    training plan of a models() draw is refused ("no linear layers for LoRA to wrap")."""
    shape = llama(draw(st.sampled_from([1, 8, 70])))
    return replace(
        draw(models()),
        parameters=shape.parameters,
        num_layers=shape.num_layers,
        linear_names=shape.linear_names,
        linear_shapes=shape.linear_shapes,
        vocab_size=shape.vocab_size,
    )


@st.composite
def requests(draw: st.DrawFn) -> Request:
    return Request(
        dtype=draw(st.sampled_from([None, None, "float16", "bfloat16", "float32", "auto"])),
        attn_implementation=draw(
            st.sampled_from([None, None, "sdpa", "eager", "flash_attention_2", "flash_attention_3"])
        ),
        device_map=draw(st.sampled_from([None, None, "cpu", "auto", 0, "cuda:3", {"": 0}])),
    )


def _plan(machine: Machine, model, request: Request):
    try:
        return decide_plan(machine, model, request)
    except CudaloadError:
        return None  # refused with our own error: allowed; anything else fails the test


@settings(max_examples=300, deadline=None)
@given(machines(), models(), requests())
def test_plans_are_valid_for_the_machine_or_refused_with_a_cudaload_error(machine, model, request) -> None:
    plan = _plan(machine, model, request)
    # A refusal passes, but is not a checked example: a planner that refused everything fails
    # Hypothesis' health check instead of passing without one assertion run.
    assume(plan is not None)
    assert plan is not None
    gpu = machine.weakest_gpu
    # Never bf16 below sm80 (T4/V100 emulate it), whoever asked.
    if gpu is not None and gpu.capability < (8, 0):
        assert plan.dtype != "bfloat16"
    # Never FlashAttention in fp32, for a model without it, or below its upstream minimum.
    for link in plan.attention_chain:
        if link.startswith("flash_attention") or link.startswith("kernels-community/"):
            assert gpu is not None and plan.dtype != "float32" and model.supports_flash
            assert gpu.capability[0] >= 8
            assert all(d <= 256 for d in model.head_dims)
    # The chain ends with a link that runs everywhere, unless you chose the attention.
    if request.attn_implementation is None:
        assert plan.attention_chain[-1] == "eager"
        if not model.supports_sdpa:  # the class's flag decides, softcapping included (its classes declare False)
            assert "sdpa" not in plan.attention_chain
    # What you set is what you get.
    if request.attn_implementation is not None:
        assert plan.attention_chain == (request.attn_implementation,)
    if request.dtype not in (None, "auto"):
        assert plan.dtype == request.dtype
    if request.device_map is not None:
        assert plan.kwargs["device_map"] == request.device_map
    # Deterministic.
    assert decide_plan(machine, model, request) == plan


@settings(max_examples=100, deadline=None)
@given(
    machines(worlds=(2, 4), required=("bitsandbytes", "peft")),
    trainable_models(),
    st.sampled_from(["4bit", "8bit", None, "auto"]),
)
def test_a_quantized_model_under_ddp_is_never_spread_with_auto(machine, model, quantize) -> None:
    # Launches of several ranks, with what QLoRA needs installed, and models LoRA can wrap: before,
    # models() had no linear layers and every draw was refused, so nothing below ever ran.
    plan = _plan(machine, model, Request(training=TrainingRequest(quantize=quantize)))
    assume(plan is not None)
    assert plan is not None and machine.launch.distributed
    assert plan.kwargs.get("device_map") != "auto"
    if machine.launch.strategy == "fsdp":
        assert "device_map" not in plan.kwargs
