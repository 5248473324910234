"""Each attention option owns its checks: `check_attention` lists every reason an option cannot serve
(blockers) or serves at a loss (costs), and an explicit choice and the automatic chain both use it.

Expected reasons are written out by hand from the rules (docs/decisions.md), not recomputed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cudaload import AttentionUnavailableError, Machine
from cudaload.facts.model import ModelFacts, any_model
from cudaload.plans import Rejected
from cudaload.policy import Request, decide_plan
from cudaload.policy.attention import NO_CONSENT, check_attention, decide_attention

MODEL = replace(any_model(), model_class="DemoForCausalLM", head_dim=128)
# Gemma 2's class passes `softcap` to its attention and so declares `_supports_sdpa = False`.
SOFTCAPPED = replace(MODEL, model_type="gemma2", softcap=50.0, supports_sdpa=False)
FA2 = {"flash-attn": "2.8.3"}
KERNELS = {"kernels": "0.17.2"}
NO_KERNELS = "the `kernels` package is not installed (pip install 'kernels>=0.17.2,<0.18.0')"
SDPA_SOFTCAP = "DemoForCausalLM does not support SDPA"


def plan_for(machine: Machine, model: ModelFacts, **request):
    return decide_plan(machine, model, Request(**request))


def rejected(plan) -> dict[str, str]:
    return {r.value: r.reason for r in plan.decision("attn_implementation").rejected}


# --- SDPA on a softcapping model: refused on both paths, with the same text -----------------------


def test_explicit_sdpa_on_a_softcapping_model_is_refused_as_the_chain_refuses_it() -> None:
    # It used to be accepted without a word while the chain rejected it ("SDPA ignores softcapping",
    # which was not even true: transformers' sdpa_attention_forward raises on `softcap`).
    with pytest.raises(AttentionUnavailableError) as raised:
        plan_for(Machine.simulated("A100"), SOFTCAPPED, attn_implementation="sdpa")
    assert str(raised.value).startswith(f"attn_implementation='sdpa' was asked, but {SDPA_SOFTCAP}.")


def test_softcapping_in_the_config_of_a_class_that_supports_sdpa_does_not_refuse_it() -> None:
    # Gemma 3 has attn_logit_softcapping in its config and never passes it: SDPA is what it runs.
    gemma3 = replace(MODEL, model_type="gemma3", softcap=50.0)
    assert check_attention("sdpa", Machine.simulated("A100"), gemma3, "bfloat16").reasons == ()
    assert plan_for(Machine.simulated("A100"), gemma3).attention_chain[0] == "sdpa"


def test_the_automatic_chain_rejects_sdpa_there_with_the_same_reason() -> None:
    plan = plan_for(Machine.simulated("A100"), SOFTCAPPED)
    assert plan.attention_chain == ("flex_attention", "eager")
    assert rejected(plan)["sdpa"] == SDPA_SOFTCAP
    assert not any("attn_implementation" in w for w in plan.warnings)  # the automatic path warns of nothing


def test_a_choice_without_costs_gives_no_warning() -> None:
    for choice in ("sdpa", "eager", "flash_attention_2"):
        plan = plan_for(Machine.simulated("A100", packages=FA2), MODEL, attn_implementation=choice)
        assert not any("attn_implementation" in w for w in plan.warnings), choice


# --- every reason, for each option ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "gpu", "packages", "offline", "model", "dtype", "blockers", "costs"),
    [
        pytest.param(
            "flash_attention_2",
            "T4",
            FA2,
            False,
            MODEL,
            "float32",
            (
                "no flash_attention_2 kernels for sm_75 (Tesla T4)",
                "FlashAttention runs only in fp16/bf16; the dtype is float32",
            ),
            (),
            id="fa2-package-generation-and-fp32",
        ),
        pytest.param(
            "flash_attention_2",
            "A100",
            {"flash-attn": "2.3.2"},
            False,
            SOFTCAPPED,
            "bfloat16",
            (
                "flash-attn 2.3.2 is older than 2.3.3, the oldest transformers accepts",
                "attn_logit_softcapping=50.0 needs flash-attn >= 2.6.0 (installed: 2.3.2)",
            ),
            (),
            id="fa2-package-two-version-limits",
        ),
        pytest.param(
            "flash_attention_3",
            "B200",
            {"flash-attn-3": "3.0.0"},
            False,
            replace(MODEL, head_dims=(512,)),
            "bfloat16",
            (
                "no flash_attention_3 kernels for sm_100 (NVIDIA B200)",
                "head_dim 512: FlashAttention supports head dims up to 256",
            ),
            (),
            id="fa3-package-generation-and-head-dim",
        ),
        pytest.param(
            "flash_attention_4",
            "RTX5090",
            {"flash-attn-4": "4.0.0b1"},
            False,
            replace(MODEL, supports_flash=False),
            "bfloat16",
            (
                "no flash_attention_4 kernels for sm_120 (NVIDIA GeForce RTX 5090) before flash-attn-4 4.0.0b5 "
                "(installed: 4.0.0b1)",
                "DemoForCausalLM does not support FlashAttention",
            ),
            (),
            id="fa4-package-version-and-model",
        ),
        pytest.param(
            "flash_attention_2",
            "A100",
            KERNELS,
            True,
            MODEL,
            "float32",
            (
                "FlashAttention runs only in fp16/bf16; the dtype is float32",
                "flash-attn not installed; its Hub kernel is unusable: HF_HUB_OFFLINE is set and Hub kernel "
                "kernels-community/flash-attn2 is not in the local cache",
            ),
            (),
            id="fa2-hub-kernel-fp32-and-offline",
        ),
        pytest.param(
            "kernels-community/vllm-flash-attn3",
            "T4",
            {},
            False,
            MODEL,
            "float16",
            ("no flash_attention_3 kernels for sm_75 (Tesla T4)", f"its Hub kernel is unusable: {NO_KERNELS}"),
            (),
            id="named-fa3-hub-kernel-generation-and-kernels-missing",
        ),
        pytest.param(
            "my-org/flash-attn-custom",
            None,
            {},
            False,
            MODEL,
            "float32",
            (NO_KERNELS, "FlashAttention Hub kernels are built for CUDA and there is no GPU here"),
            (),
            id="other-hub-kernel-kernels-missing-and-no-gpu",
        ),
        pytest.param(
            "sdpa",
            "A100",
            {},
            False,
            SOFTCAPPED,
            "bfloat16",
            ("DemoForCausalLM does not support SDPA",),
            (),
            id="sdpa-unsupported",
        ),
        pytest.param(
            "flex_attention",
            None,
            {},
            False,
            replace(MODEL, supports_flex=False),
            "float32",
            ("DemoForCausalLM does not support flex_attention",),
            ("not planned on a CPU: it needs torch.compile there (unverified)",),
            id="flex-unsupported-and-cpu",
        ),
        pytest.param("eager", None, {}, False, SOFTCAPPED, "float32", (), (), id="eager-always"),
    ],
)
def test_every_reason_is_listed(option, gpu, packages, offline, model, dtype, blockers, costs) -> None:
    machine = Machine.simulated(gpu, packages=packages, offline=offline)
    check = check_attention(option, machine, model, dtype)
    assert check.blockers == blockers
    assert check.costs == costs
    assert check.reasons == blockers + costs


def test_an_explicit_choice_with_a_blocker_names_every_reason() -> None:
    t4 = Machine.simulated("T4", packages=FA2)
    with pytest.raises(AttentionUnavailableError) as raised:
        plan_for(t4, MODEL, attn_implementation="flash_attention_2", dtype="float32")
    message = str(raised.value)
    assert message.startswith("attn_implementation='flash_attention_2' was asked, but ")
    assert "no flash_attention_2 kernels for sm_75 (Tesla T4)" in message
    assert "FlashAttention runs only in fp16/bf16; the dtype is float32" in message


def test_an_explicit_choice_with_blockers_and_costs_names_both() -> None:
    no_flex = replace(MODEL, supports_flex=False)
    with pytest.raises(AttentionUnavailableError) as raised:
        plan_for(Machine.simulated(None), no_flex, attn_implementation="flex_attention")
    assert "DemoForCausalLM does not support flex_attention" in str(raised.value)
    assert "not planned on a CPU: it needs torch.compile there (unverified)" in str(raised.value)


# --- the two paths cannot disagree ---------------------------------------------------------------


def test_a_named_flash_hub_kernel_gets_the_checks_the_chain_gives_it() -> None:
    # Before, naming kernels-community/flash-attn2 only checked that `kernels` could fetch it, so a T4
    # (no FlashAttention-2 kernels for sm_75) was accepted while the chain rejected it.
    t4 = Machine.simulated("T4", packages=KERNELS)
    assert "kernels-community/flash-attn2" not in plan_for(t4, MODEL, hub_kernels=True).attention_chain
    with pytest.raises(AttentionUnavailableError, match=r"no flash_attention_2 kernels for sm_75 \(Tesla T4\)"):
        plan_for(t4, MODEL, attn_implementation="kernels-community/flash-attn2")
    l4 = Machine.simulated("L4", packages=KERNELS)
    assert plan_for(l4, MODEL, attn_implementation="kernels-community/flash-attn2").warnings == ()


def test_explicit_flex_attention_is_checked_like_the_chain_checks_it() -> None:
    no_flex = replace(SOFTCAPPED, supports_flex=False)
    assert rejected(plan_for(Machine.simulated("A100"), no_flex))["flex_attention"] == (
        "DemoForCausalLM does not support flex_attention"
    )
    with pytest.raises(AttentionUnavailableError, match="DemoForCausalLM does not support flex_attention"):
        plan_for(Machine.simulated("A100"), no_flex, attn_implementation="flex_attention")
    cpu = plan_for(Machine.simulated(None), SOFTCAPPED, attn_implementation="flex_attention")
    assert cpu.attention_chain == ("flex_attention",)
    assert any("needs torch.compile there (unverified)" in w for w in cpu.warnings)


MACHINES = [
    Machine.simulated(None),
    Machine.simulated("T4", packages=FA2),
    Machine.simulated("A100", packages={"flash-attn": "2.5.9", **KERNELS}),
    Machine.simulated("A100", packages={"flash-attn-4": "4.0.1"}),
    Machine.simulated("H100", packages={**KERNELS, "flash-attn-3": "3.0.0"}, offline=True),
    Machine.simulated("L4", packages=KERNELS, cached_kernels=["kernels-community/flash-attn2"]),
    Machine.simulated("B200", packages={**FA2, "flash-attn-4": "4.0.0b10"}),
]
MODELS = [
    MODEL,
    SOFTCAPPED,
    replace(MODEL, supports_flash=False, supports_sdpa=False),
    replace(SOFTCAPPED, supports_flex=False),
    replace(MODEL, head_dims=(256,)),
]


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.describe())
@pytest.mark.parametrize("model", MODELS, ids=range(len(MODELS)))
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_each_link_and_rejection_of_the_chain_is_what_an_explicit_choice_gets(machine, model, dtype) -> None:
    decision, chain, warnings = decide_attention(machine, model, dtype, None, hub_code=True)
    assert warnings == ()
    for link in chain:  # kept by the chain: an explicit choice of it is honoured without a warning
        _, _, explicit_warnings = decide_attention(machine, model, dtype, link)
        assert explicit_warnings == (), link
    for option in decision.rejected:  # rejected: refused with that reason, or honoured with it as a warning
        try:
            _, _, explicit_warnings = decide_attention(machine, model, dtype, option.value)
        except AttentionUnavailableError as refused:
            assert option.reason in str(refused), option
        else:
            assert len(explicit_warnings) == 1 and option.reason in explicit_warnings[0], option


# --- the trace -----------------------------------------------------------------------------------


def test_the_chain_is_the_accepted_entries_and_the_rejections_keep_their_order() -> None:
    a100 = Machine.simulated("A100", packages={**FA2, **KERNELS})
    decision, chain, warnings = decide_attention(a100, SOFTCAPPED, "bfloat16", None)
    # FA2 from the package; FA3 and FA4 only as Hub kernels, not cached, fetched without consent.
    assert chain == ("flash_attention_2", "flex_attention", "eager")
    assert decision.value == "flash_attention_2" and warnings == ()
    assert decision.reason == "fastest supported on NVIDIA A100-SXM4-80GB (sm_80): flash-attn 2.8.3 installed"
    assert [r.value for r in decision.rejected] == [
        "flash_attention_4",
        "kernels-community/vllm-flash-attn3",
        "sdpa",
    ]
    assert decision.rejected[1:] == (
        Rejected("kernels-community/vllm-flash-attn3", NO_CONSENT),
        Rejected("sdpa", SDPA_SOFTCAP),
    )
    assert decision.rejected[0].reason.startswith("kernels-community/flash-attn4 (4.0.0.beta8) runs only its forward")
