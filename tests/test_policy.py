"""Policy tables over simulated machines. No mocks: every fact is passed in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cudaload import (
    AttentionUnavailableError,
    DtypeUnsupportedError,
    Machine,
    MissingPackageError,
    PlacementError,
    SettingError,
)
from cudaload.facts.catalog import KNOWN_GPUS
from cudaload.facts.machine import Launch
from cudaload.facts.model import ModelFacts, any_model
from cudaload.policy import Request, decide_plan

LLAMA_8B = replace(
    any_model(),
    source="llama-8b",
    model_class="LlamaForCausalLM",
    parameters=8_030_000_000,
    checkpoint_dtype="bfloat16",
    head_dim=128,
    num_layers=32,
    hidden_size=4096,
)
FA2 = {"flash-attn": "2.8.3"}
FA3 = {"flash-attn-3": "3.0.0"}
FA4 = {"flash-attn-4": "4.0.0b1"}
KERNELS = {"kernels": "0.17.2"}


def plan_for(machine: Machine, model: ModelFacts = LLAMA_8B, **request):
    return decide_plan(machine, model, Request(**request))


# (gpu, packages, cached hub kernels, offline) -> attention chain, dtype
ATTENTION_TABLE = [
    ("V100", FA2, (), False, ("sdpa", "eager"), "float16"),
    ("T4", {**FA2, **KERNELS}, (), False, ("sdpa", "eager"), "float16"),
    ("A10G", FA2, (), False, ("flash_attention_2", "sdpa", "eager"), "bfloat16"),
    ("A100", {}, (), False, ("sdpa", "eager"), "bfloat16"),
    ("A100", {**FA2, **FA3}, (), False, ("flash_attention_2", "flash_attention_3", "sdpa", "eager"), "bfloat16"),
    ("L4", KERNELS, (), False, ("sdpa", "eager"), "bfloat16"),  # online, nothing cached, no consent to fetch
    ("RTX4090", KERNELS, (), True, ("sdpa", "eager"), "bfloat16"),  # offline, nothing cached
    (
        "RTX4090",
        KERNELS,
        ("kernels-community/flash-attn2",),
        True,
        ("kernels-community/flash-attn2", "sdpa", "eager"),
        "bfloat16",
    ),
    (
        "H100",
        {**FA2, **FA3, **FA4},
        (),
        False,
        ("flash_attention_3", "flash_attention_4", "flash_attention_2", "sdpa", "eager"),
        "bfloat16",
    ),
    ("H100", {**FA3, **KERNELS}, (), True, ("flash_attention_3", "sdpa", "eager"), "bfloat16"),
    ("H200", FA2, (), False, ("flash_attention_2", "sdpa", "eager"), "bfloat16"),
    ("B200", {**FA2, **FA3, **FA4}, (), False, ("flash_attention_4", "flash_attention_2", "sdpa", "eager"), "bfloat16"),
    ("RTX5090", {**FA2, **FA3, **FA4}, (), False, ("flash_attention_2", "sdpa", "eager"), "bfloat16"),  # sm120
    ("jetson-orin", FA2, (), False, ("flash_attention_2", "sdpa", "eager"), "bfloat16"),
    ("RTX3090", {"kernels": "0.19.1"}, (), False, ("sdpa", "eager"), "bfloat16"),  # transformers rejects it
]


@pytest.mark.parametrize(("gpu", "packages", "cached", "offline", "chain", "dtype"), ATTENTION_TABLE)
def test_attention_and_dtype_table(gpu, packages, cached, offline, chain, dtype) -> None:
    machine = Machine.simulated(gpu, packages=packages, cached_kernels=cached, offline=offline)
    plan = plan_for(machine)
    assert plan.attention_chain == chain
    assert plan.kwargs["attn_implementation"] == chain[0]
    assert plan.kwargs["dtype"] == dtype


def test_hub_code_is_fetched_only_with_consent() -> None:
    # One rule for every kind of Hub code: cached (fetched before) or an explicit opt-in.
    l4 = Machine.simulated("L4", packages=KERNELS)
    without = plan_for(l4)
    rejected = {r.value: r.reason for r in without.decision("attn_implementation").rejected}
    assert "pass hub_kernels=True" in rejected["kernels-community/flash-attn2"]
    hub_chain = ("kernels-community/flash-attn2", "kernels-community/vllm-flash-attn3", "sdpa", "eager")
    assert plan_for(l4, hub_kernels=True).attention_chain == hub_chain
    assert plan_for(l4, use_kernels=True).attention_chain == hub_chain  # use_kernels is Hub code already
    cached = Machine.simulated("L4", packages=KERNELS, cached_kernels=["kernels-community/flash-attn2"])
    assert plan_for(cached).attention_chain == ("kernels-community/flash-attn2", "sdpa", "eager")
    named = plan_for(l4, attn_implementation="kernels-community/flash-attn2")  # naming it is consent
    assert named.attention_chain == ("kernels-community/flash-attn2",)


@pytest.mark.parametrize("catalog_gpu", KNOWN_GPUS, ids=lambda g: g.aliases[0])
def test_every_catalog_gpu_gets_a_valid_plan(catalog_gpu) -> None:
    plan = plan_for(Machine.simulated(catalog_gpu.aliases[0], packages={**FA2, **FA3, **FA4}))
    first = plan.attention_chain[0]
    assert plan.attention_chain[-1] == "eager"
    if catalog_gpu.capability < (8, 0):
        assert not first.startswith("flash") and plan.dtype == "float16"
    else:
        assert first.startswith("flash") and plan.dtype == "bfloat16"
    if catalog_gpu.capability[0] == 12:
        assert "flash_attention_4" not in plan.attention_chain  # sm120 is not sm100


def test_rejections_say_why() -> None:
    plan = plan_for(Machine.simulated("T4", packages=FA2))
    rejected = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}
    assert "sm_75" in rejected["flash_attention_2"]
    bf16 = {r.value: r.reason for r in plan.decision("dtype").rejected}["bfloat16"]
    assert "sm80" in bf16


def test_kernels_version_mismatch_is_reported() -> None:
    plan = plan_for(Machine.simulated("A100", packages={"kernels": "0.19.1"}))
    reasons = " ".join(r.reason for r in plan.decision("attn_implementation").rejected)
    assert "kernels 0.19.1 is installed but transformers 5.22.2 accepts only [0.17.2, 0.18.0)" in reasons
    newer = Machine.simulated("A100", packages={"kernels": "0.17.2", "transformers": "5.24.0"})
    reasons = " ".join(r.reason for r in plan_for(newer).decision("attn_implementation").rejected)
    assert "kernels 0.17.2 is installed but transformers 5.24.0 accepts only [0.18.2, 0.19.0)" in reasons


def test_mixed_gpus_plan_for_the_weakest() -> None:
    # Spread over both GPUs (pinned by your device_map="auto"), the T4 decides; placed on the A100
    # alone, the A100 does (tests/test_upstream_round3.py).
    plan = plan_for(Machine.simulated(["A100", "T4"], packages=FA2), device_map="auto")
    assert plan.dtype == "float16"
    assert plan.attention_chain == ("sdpa", "eager")


def test_fp32_never_gets_flash_attention() -> None:
    plan = plan_for(Machine.simulated("H100", packages=FA3), dtype="float32")
    assert plan.attention_chain == ("sdpa", "eager")
    assert any("float32" in r.reason for r in plan.decision("attn_implementation").rejected)


def test_model_without_flash_support_never_gets_it() -> None:
    model = replace(LLAMA_8B, supports_flash=False, supports_sdpa=False, supports_flex=False)
    plan = plan_for(Machine.simulated("H100", packages=FA3), model)
    assert plan.attention_chain == ("eager",)


def test_softcapping_models_skip_sdpa_and_get_every_kernel_that_softcaps() -> None:
    # FA2 >= 2.6, FA3 (hopper/ applies softcap forward and backward) and FA4 take `softcap`; SDPA
    # cannot, and Gemma 2's class says so (`_supports_sdpa = False`); flex_attention can
    # (transformers: "Try using `eager` or `flex_attention`").
    gemma2 = replace(LLAMA_8B, model_type="gemma2", softcap=50.0, supports_sdpa=False)
    assert plan_for(Machine.simulated("T4"), gemma2).attention_chain == ("flex_attention", "eager")
    assert plan_for(Machine.simulated("A100", packages=FA2), gemma2).attention_chain == (
        "flash_attention_2",
        "flex_attention",
        "eager",
    )
    hopper = plan_for(Machine.simulated("H100", packages={**FA2, **FA3, **FA4}), gemma2)
    assert hopper.attention_chain == (
        "flash_attention_3",
        "flash_attention_4",
        "flash_attention_2",
        "flex_attention",
        "eager",
    )
    old = plan_for(Machine.simulated("A100", packages={"flash-attn": "2.5.9"}), gemma2)
    assert old.attention_chain == ("flex_attention", "eager")
    reason = {r.value: r.reason for r in old.decision("attn_implementation").rejected}["flash_attention_2"]
    assert "needs flash-attn >= 2.6.0 (installed: 2.5.9)" in reason
    no_flex = plan_for(Machine.simulated("T4"), replace(gemma2, supports_flex=False))
    assert no_flex.attention_chain == ("eager",)
    on_cpu = plan_for(Machine.simulated(None), gemma2)
    assert on_cpu.attention_chain == ("eager",)
    assert "flex_attention" in {r.value for r in on_cpu.decision("attn_implementation").rejected}


def test_flash_attn_older_than_transformers_accepts_is_rejected() -> None:
    plan = plan_for(Machine.simulated("A100", packages={"flash-attn": "2.3.2"}))
    assert plan.attention_chain[0] != "flash_attention_2"
    reason = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}["flash_attention_2"]
    assert "older than 2.3.3" in reason
    assert (
        plan_for(Machine.simulated("A100", packages={"flash-attn": "2.3.3"})).attention_chain[0] == "flash_attention_2"
    )


@pytest.mark.parametrize(
    ("gpu", "head_dims", "qk_v", "expected"),
    [
        ("A100", (512,), None, ("sdpa", "eager")),  # FA2/FA3 stop at 256
        ("A100", (256,), None, ("flash_attention_2", "flash_attention_3", "sdpa", "eager")),
        ("H100", (256, 512), None, ("sdpa", "eager")),  # a 512 global head anywhere rules FA out
        ("B200", (192,), None, ("flash_attention_2", "sdpa", "eager")),  # FA4 on sm100: 8-128, 256, 192/128
        # MLA: transformers pads V to 192, so FA4 on sm100 would get (192, 192): FA2 (tests/test_upstream_round3.py)
        ("B200", (128, 192), (192, 128), ("flash_attention_2", "sdpa", "eager")),
        ("B200", (64,), None, ("flash_attention_4", "flash_attention_2", "sdpa", "eager")),
        ("H100", (192,), None, ("flash_attention_3", "flash_attention_4", "flash_attention_2", "sdpa", "eager")),
    ],
)
def test_flash_attention_head_dim_limits(gpu, head_dims, qk_v, expected) -> None:
    model = replace(LLAMA_8B, head_dims=head_dims, qk_v_head_dims=qk_v)
    plan = plan_for(Machine.simulated(gpu, packages={**FA2, **FA3, **FA4}), model)
    assert plan.attention_chain == expected


@pytest.mark.parametrize(
    ("fa4", "expected"),
    [
        ("4.0.0b1", ("flash_attention_2", "sdpa", "eager")),
        ("4.0.0b5", ("flash_attention_2", "flash_attention_4", "sdpa", "eager")),
        ("4.0.1", ("flash_attention_2", "flash_attention_4", "sdpa", "eager")),
    ],
)
def test_fa4_reaches_sm120_from_4_0_0b5(fa4, expected) -> None:
    plan = plan_for(Machine.simulated("RTX5090", packages={**FA2, "flash-attn-4": fa4}))
    assert plan.attention_chain == expected
    if fa4 == "4.0.0b1":
        reason = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}["flash_attention_4"]
        assert "before flash-attn-4 4.0.0b5 (installed: 4.0.0b1)" in reason
    # transformers gates FA4 at major >= 9: never on Ampere, whatever the version.
    ampere = plan_for(Machine.simulated("A100", packages={"flash-attn-4": "4.0.1"}))
    assert "flash_attention_4" not in ampere.attention_chain


GPT_OSS = replace(
    LLAMA_8B,
    model_type="gpt_oss",
    model_class="GptOssForCausalLM",
    compatible_flash=(
        "kernels-community/vllm-flash-attn3",
        "flash_attention_4",
        "kernels-community/metal-flash-sdpa",
        "kernels-community/aiter-flash-attn",
    ),
)


def test_models_transformers_redirects_get_only_what_they_accept() -> None:
    hopper = Machine.simulated("H100", packages={**FA2, **FA3, **FA4, **KERNELS})
    plan = plan_for(hopper, GPT_OSS, hub_kernels=True)
    assert plan.attention_chain == ("kernels-community/vllm-flash-attn3", "flash_attention_4", "sdpa", "eager")
    rejected = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}
    assert "transformers would replace flash_attention_2" in rejected["flash_attention_2"]
    assert "cannot check" in rejected["kernels-community/metal-flash-sdpa"]
    # Offline with nothing cached, the Hub kernel is out and FA4 (installed) leads.
    offline = Machine.simulated("H100", packages={**FA4, **KERNELS}, offline=True)
    assert plan_for(offline, GPT_OSS).attention_chain == ("flash_attention_4", "sdpa", "eager")
    with pytest.raises(AttentionUnavailableError, match="accepts only"):
        plan_for(hopper, GPT_OSS, attn_implementation="flash_attention_2")
    assert plan_for(hopper, GPT_OSS, attn_implementation="flash_attention_4").attn_implementation == "flash_attention_4"


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        (("avx2",), "float32"),
        (("avx2", "avx512f", "avx512_bf16"), "float32"),
        (("avx2", "avx512_bf16", "amx_tile", "amx_bf16"), "bfloat16"),
    ],
)
def test_cpu_dtype_follows_amx(flags, dtype) -> None:
    plan = plan_for(Machine.simulated(None, cpu_flags=flags))
    assert plan.dtype == dtype
    assert plan.attention_chain == ("sdpa", "eager")
    assert plan.kwargs["device_map"] == "cpu"


@pytest.mark.parametrize(("ckpt", "dtype"), [("float32", "bfloat16"), ("float16", "float16"), ("bfloat16", "bfloat16")])
def test_checkpoint_dtype_on_ampere(ckpt, dtype) -> None:
    plan = plan_for(Machine.simulated("A100"), replace(LLAMA_8B, checkpoint_dtype=ckpt))
    assert plan.dtype == dtype
    if ckpt == "float32":
        assert "downcast" in plan.decision("dtype").reason


def test_fp16_fragile_family_with_an_fp16_checkpoint_gets_bf16_on_ampere() -> None:
    # vLLM drops fp16 for these families on every GPU; an fp16 checkpoint is loaded as bf16.
    gemma2 = replace(LLAMA_8B, model_type="gemma2", checkpoint_dtype="float16")
    decision = plan_for(Machine.simulated("A100"), gemma2).decision("dtype")
    assert decision.value == "bfloat16" and "fp16 checkpoint is loaded as bf16" in decision.reason
    plain = replace(LLAMA_8B, checkpoint_dtype="float16")
    assert plan_for(Machine.simulated("A100"), plain).dtype == "float16"  # other families keep their fp16


def test_fp16_fragile_families_are_exactly_vllms() -> None:
    from cudaload.upstream import FP16_FRAGILE_FAMILIES

    # vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (vLLM is not installed here to import it).
    assert {"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"} == FP16_FRAGILE_FAMILIES


def test_fp16_fragile_family_on_turing_is_kept_in_fp32_and_warned() -> None:
    gemma3 = replace(LLAMA_8B, model_type="gemma3_text")
    plan = plan_for(Machine.simulated("T4"), gemma3)
    assert plan.dtype == "float32"
    assert any("overflow in fp16" in w for w in plan.warnings)
    forced = plan_for(Machine.simulated("T4"), gemma3, dtype="float16")
    assert forced.dtype == "float16" and any("overflow" in w for w in forced.warnings)


def test_explicit_bf16_on_turing_raises_with_the_fix() -> None:
    with pytest.raises(DtypeUnsupportedError, match=r"Tesla T4 .* has 7\.5\. Use dtype='float16'"):
        plan_for(Machine.simulated("T4"), dtype="bfloat16")


@pytest.mark.parametrize(
    ("gpu", "packages", "request_attn", "match"),
    [
        ("T4", FA2, "flash_attention_2", "no flash_attention_2 kernels for sm_75"),
        (None, FA2, "flash_attention_2", "needs a CUDA GPU"),
        ("A100", {}, "flash_attention_2", "kernels"),
        ("B200", FA4, "flash_attention_3", "sm_100"),
        ("A100", KERNELS, "kernels-community/flash-attn2", None),
    ],
)
def test_explicit_attention_is_validated_never_replaced(gpu, packages, request_attn, match) -> None:
    machine = Machine.simulated(gpu, packages=packages, offline=True)
    if match is None:
        with pytest.raises(AttentionUnavailableError, match="HF_HUB_OFFLINE"):
            plan_for(machine, attn_implementation=request_attn)
        online = Machine.simulated(gpu, packages=packages)
        plan = plan_for(online, attn_implementation=request_attn)
        assert plan.attention_chain == (request_attn,) and "attn_implementation" in plan.explicit
    else:
        with pytest.raises(AttentionUnavailableError, match=match):
            plan_for(machine, attn_implementation=request_attn)


def test_explicit_settings_win_and_are_marked() -> None:
    plan = plan_for(
        Machine.simulated("A100", packages=FA2),
        attn_implementation="eager",
        dtype="float16",
        device_map="auto",
        passthrough={"revision": "main"},
    )
    assert plan.kwargs == {
        "dtype": "float16",
        "attn_implementation": "eager",
        "device_map": "auto",
        "use_kernels": False,
        "revision": "main",
    }
    assert {"dtype", "attn_implementation", "device_map", "revision"} <= plan.explicit
    assert plan.attention_chain == ("eager",)


def test_use_kernels_is_validated() -> None:
    with pytest.raises(MissingPackageError, match="kernels"):
        plan_for(Machine.simulated("A100"), use_kernels=True)
    plan = plan_for(Machine.simulated("A100", packages=KERNELS), use_kernels=True)
    assert plan.kwargs["use_kernels"] is True
    # Not asked: passed as False all the same, since transformers 5.25 turns it on when it is not passed.
    assert plan_for(Machine.simulated("A100", packages=KERNELS)).kwargs["use_kernels"] is False


@pytest.mark.parametrize(
    ("gpu", "count", "params", "device_map", "spread"),
    [
        ("A100", 1, 8e9, "cuda:0", False),  # 16 GB bf16 on 80 GB
        ("T4", 1, 8e9, "auto", False),  # 16 GB fp16 on 15 GB: offload
        ("A100-40GB", 4, 30e9, "auto", True),  # 60 GB over 4x40 GB
        ("H100", 8, 1e9, "cuda:0", False),  # small model on one of eight GPUs
    ],
)
def test_placement(gpu, count, params, device_map, spread) -> None:
    plan = plan_for(Machine.simulated(gpu, count=count), replace(LLAMA_8B, parameters=int(params)))
    assert plan.kwargs["device_map"] == device_map
    if device_map == "auto":
        assert set(plan.kwargs["max_memory"]) >= set(range(count))
        offloads = "cpu" in plan.kwargs["max_memory"]
        assert offloads == (not spread)
        assert offloads == any("offloaded to CPU" in w for w in plan.warnings)


@pytest.mark.parametrize(
    ("launch", "gpu", "count", "device_map"),
    [
        (
            Launch("torchrun", rank=3, local_rank=3, world_size=8, local_world_size=8, strategy="ddp"),
            "A100",
            8,
            {"": 3},
        ),
        (
            Launch("torchrun", rank=11, local_rank=3, world_size=16, local_world_size=8, strategy="ddp"),
            "A100",
            8,
            {"": 3},
        ),  # multi-node: the local rank, not the global one
        (Launch("torchrun", rank=5, local_rank=5, world_size=8, strategy="ddp"), "A100", 1, {"": 0}),
        (Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="fsdp"), "A100", 2, None),
        (Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="deepspeed", zero_stage=3), "A100", 2, None),
        (
            Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="deepspeed", zero_stage=2),
            "A100",
            2,
            {"": 1},
        ),
        (Launch("torchrun", rank=1, local_rank=1, world_size=2, strategy="ddp"), None, 1, "cpu"),
    ],
)
def test_placement_under_a_launcher(launch, gpu, count, device_map) -> None:
    plan = plan_for(Machine.simulated(gpu, count=count, launch=launch))
    assert plan.kwargs.get("device_map") == device_map


def test_auto_device_map_under_ddp_raises() -> None:
    launch = Launch("torchrun", rank=0, world_size=2, strategy="ddp")
    with pytest.raises(PlacementError, match="distributed"):
        plan_for(Machine.simulated("A100", count=2, launch=launch), device_map="auto")


def test_explicit_cuda_placement_without_gpu_raises() -> None:
    with pytest.raises(PlacementError, match="no CUDA GPU"):
        plan_for(Machine.simulated(None), device_map="cuda:0")


def test_plan_to_dict_has_the_stable_keys() -> None:
    d = plan_for(Machine.simulated("H100", packages=FA3)).to_dict()
    assert d["kwargs"]["attn_implementation"] == "flash_attention_3" and d["kwargs"]["dtype"] == "bfloat16"
    assert d["attention_chain"][0] == "flash_attention_3"
    assert {"setting", "value", "reason", "rejected", "source"} <= set(d["decisions"][0])


def test_explain_names_every_decision() -> None:
    text = plan_for(Machine.simulated("T4", packages=FA2)).explain()
    for setting in ("dtype", "attn_implementation", "device_map", "use_kernels"):
        assert setting in text
    assert "x flash_attention_2" in text


@pytest.mark.parametrize("bad", ["int8", "fp8", "float64"])
def test_an_unknown_dtype_is_refused(bad) -> None:
    with pytest.raises(DtypeUnsupportedError, match="Use 'bfloat16', 'float16', 'float32'"):
        plan_for(Machine.simulated("A100"), dtype=bad)


def test_torch_dtypes_and_aliases_are_accepted() -> None:
    import torch

    assert plan_for(Machine.simulated("A100"), dtype=torch.float16).dtype == "float16"
    assert plan_for(Machine.simulated("A100"), dtype="bf16").dtype == "bfloat16"
    assert plan_for(Machine.simulated("A100"), dtype="auto").dtype == "bfloat16"  # the checkpoint's


def test_dtype_and_torch_dtype_together_are_refused() -> None:
    from cudaload.planner import split_overrides

    with pytest.raises(DtypeUnsupportedError, match="pass only dtype="):
        split_overrides({"dtype": "float16", "torch_dtype": "float16"})
    assert split_overrides({"torch_dtype": "float16"}).dtype == "float16"


def test_more_ranks_than_visible_gpus_is_a_clear_error() -> None:
    launch = Launch("torchrun", rank=3, local_rank=3, world_size=4, strategy="ddp")
    with pytest.raises(PlacementError, match=r"LOCAL_RANK=3 but this process sees 2 GPU\(s\)"):
        plan_for(Machine.simulated("A100", count=2, launch=launch))


def test_use_kernels_without_a_gpu_follows_the_installed_transformers() -> None:
    # 5.25's Hub layer mapping has no CPU entry: refused. 5.22 maps gpt-oss's MegaBlocksMoeMLP to a CPU kernel.
    new = {"kernels": "0.19.1", "transformers": "5.25.0"}
    with pytest.raises(MissingPackageError, match=r"no CUDA GPU.*transformers 5\.25\.0 maps no layer"):
        plan_for(Machine.simulated(None, packages=new), use_kernels=True)
    old = plan_for(Machine.simulated(None, packages={"kernels": "0.17.2", "transformers": "5.22.2"}), use_kernels=True)
    assert old.kwargs["use_kernels"] is True


def test_use_hub_kernels_off_is_a_fact_the_plan_follows() -> None:
    a100 = Machine.simulated("A100", packages=KERNELS)
    disabled = replace(a100, hub=replace(a100.hub, layer_kernels_disabled="USE_HUB_KERNELS=NO"))
    decision = plan_for(disabled).decision("use_kernels")
    assert decision.value is False and "USE_HUB_KERNELS=NO" in decision.rejected[0].reason
    # Asked for anyway: transformers would drop it with a log line; cudaload says so before loading.
    with pytest.raises(SettingError, match="USE_HUB_KERNELS=NO turns Hub layer kernels off"):
        plan_for(disabled, use_kernels=True)
    from cudaload.capability.software import layer_kernels_disabled

    assert [layer_kernels_disabled(env) for env in ({}, {"USE_HUB_KERNELS": "yes"}, {"USE_HUB_KERNELS": "0"})] == [
        None,
        None,
        "USE_HUB_KERNELS=0",
    ]


def test_kernel_config_and_kernels_mode_ask_for_hub_layer_kernels() -> None:
    from cudaload.planner.arguments import split_overrides

    assert split_overrides({"kernel_config": object()}).use_kernels is True
    with pytest.raises(SettingError, match="kernel_config was given with use_kernels=False"):
        split_overrides({"kernel_config": object(), "use_kernels": False})
