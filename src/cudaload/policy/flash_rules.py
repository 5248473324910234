"""The FlashAttention rules: every reason a FlashAttention version cannot run a model here, in the order of
the rules in docs/decisions.md (GPU generation, dtype, model support, package version, head dims, sinks).

The rules every version shares are `flash_blockers`'; what one version adds is its record in FLASH_RULES
(beside its data in upstream.FLASH_OPTIONS), and FLASH_ORDER says which version a GPU generation tries
first. A new FlashAttention version is a FlashOption there and a FlashRules here; nothing else names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..facts.machine import Gpu, Machine
from ..facts.model import ModelFacts
from ..upstream import (
    FA4_HD256_VERSION,
    FA4_MAJORS_WIDE,
    FA4_WIDE_VERSION,
    FLASH_ATTN_2_MIN_VERSION,
    FLASH_ATTN_2_SOFTCAP_MIN_VERSION,
    FLASH_MAX_HEAD_DIM,
    FLASH_OPTIONS,
    fa4_head_dims_ok,
    flash_received_head_dims,
    version_at_least,
)

__all__ = ["FA4_SINK_MAJORS", "FLASH_ORDER", "FLASH_RULES", "FlashRules", "flash_blockers", "flash_preference"]


def flash_blockers(
    machine: Machine, model: ModelFacts, dtype: str, name: str, installed: str | None
) -> tuple[str, ...]:
    """Every reason FlashAttention `name` cannot run this model here, in the order of the rules in
    docs/decisions.md. `installed` is the package version, or None for the Hub kernel."""
    rules = FLASH_RULES[name]
    gpu = machine.weakest_gpu
    found = (
        rules.generation(gpu, name, installed) if gpu is not None else "needs a CUDA GPU",
        "FlashAttention runs only in fp16/bf16; the dtype is float32" if dtype == "float32" else None,
        None if model.supports_flash else f"{model.model_class} does not support FlashAttention",
        *rules.versions(model, installed),
        _too_big(model) or rules.head_dims(gpu, model, installed),
        # No GPU, or fp32: already blocked, the sinks add nothing.
        *(rules.sinks(gpu, dtype, installed) if model.attention_sinks and gpu and dtype != "float32" else ()),
    )
    return tuple(reason for reason in found if reason)


def flash_preference(major: int) -> tuple[str, ...]:
    """FlashAttention versions in order of preference for a GPU generation (vLLM's order)."""
    return FLASH_ORDER.get(major, FLASH_ORDER[None])


@dataclass(frozen=True)
class FlashRules:
    """What one FlashAttention version checks beyond the rules every version shares.

    Attributes:
        generation: (weakest GPU, name, installed version or None for the Hub kernel) -> why it has no
            kernels for that GPU generation; None when it has.
        versions: (model, installed) -> why the installed package is too old (for transformers, or the model).
        head_dims: (GPU, model, installed) -> a head dim it lacks within FlashAttention's general limit.
        sinks: (GPU, dtype, installed) -> why it cannot run a model with learnable attention sinks.
    """

    generation: Callable[[Gpu, str, str | None], str | None]
    versions: Callable[[ModelFacts, str | None], tuple[str, ...]]
    head_dims: Callable[[Gpu | None, ModelFacts, str | None], str | None]
    sinks: Callable[[Gpu, str, str | None], tuple[str, ...]]


def _too_big(model: ModelFacts) -> str | None:
    """A head dim over 256: no FlashAttention has it (so one head dim gives one reason)."""
    too_big = [d for d in model.head_dims if d > FLASH_MAX_HEAD_DIM]
    if too_big:
        return f"head_dim {max(too_big)}: FlashAttention supports head dims up to {FLASH_MAX_HEAD_DIM}"
    return None


def _built_for(gpu: Gpu, name: str, installed: str | None) -> str | None:
    """The generation rule of a version with fixed builds: the package's or the Hub build's majors."""
    option = FLASH_OPTIONS[name]
    major = gpu.capability[0]
    if major in (option.hub_majors if installed is None else option.majors):
        return None
    # The Hub build lacks a generation the package has: say where the kernels are missing.
    note = f" in the Hub build {option.hub_repo}" if installed is None and major in option.majors else ""
    return f"no {name} kernels for {gpu.sm} ({gpu.name}){note}"


def _no_versions(model: ModelFacts, installed: str | None) -> tuple[str, ...]:
    return ()


def _no_head_dims(gpu: Gpu | None, model: ModelFacts, installed: str | None) -> str | None:
    return None


# --- FlashAttention-2 ------------------------------------------------------------------------------


def _fa2_versions(model: ModelFacts, installed: str | None) -> tuple[str, ...]:
    """An installed flash-attn (FA2) too old for transformers, or for this model's softcapping."""
    if installed is None:
        return ()
    found = []
    if not version_at_least(installed, FLASH_ATTN_2_MIN_VERSION):
        found.append(
            f"flash-attn {installed} is older than {FLASH_ATTN_2_MIN_VERSION}, the oldest transformers accepts"
        )
    if model.softcap and not version_at_least(installed, FLASH_ATTN_2_SOFTCAP_MIN_VERSION):
        found.append(
            f"attn_logit_softcapping={model.softcap} needs flash-attn >= {FLASH_ATTN_2_SOFTCAP_MIN_VERSION} "
            f"(installed: {installed})"
        )
    return tuple(found)


def _fa2_sinks(gpu: Gpu, dtype: str, installed: str | None) -> tuple[str, ...]:
    return (
        "the model has attention sinks and FlashAttention-2 takes neither `s_aux` nor `learnable_sink`: transformers "
        "would drop them silently (5.22-5.25 modeling_flash_attention_utils.py: _process_flash_attention_kwargs)",
    )


# --- FlashAttention-3 ------------------------------------------------------------------------------


def _bf16_sinks(dtype: str) -> tuple[str, ...]:
    if dtype == "bfloat16":
        return ()
    # transformers casts the sinks to the query dtype (transformers 5.22-5.25
    # integrations/flash_attention.py: flash_attention_forward, `s_aux.to(query.dtype)`).
    return (
        f"the model has attention sinks and the sink kernels take only bf16 sinks; the dtype is {dtype} "
        '(flash_api_stable.cpp: "We only support bf16 dtype for S aux"; FA4 interface.py: '
        '"learnable_sink must be bfloat16")',
    )


def _fa3_sinks(gpu: Gpu, dtype: str, installed: str | None) -> tuple[str, ...]:
    found: tuple[str, ...] = ()
    if installed is None and gpu.capability[0] != 9:
        found = (
            f"the model has attention sinks and {FLASH_OPTIONS['flash_attention_3'].hub_repo} takes them only on "
            f'Hopper: {gpu.name} is {gpu.sm} (flash_api_stable.cpp: "S aux is currently only supported for Hopper '
            'GPUs")',
        )
    return found + _bf16_sinks(dtype)


# --- FlashAttention-4 ------------------------------------------------------------------------------

# Majors whose FlashAttention-4 forward takes learnable sinks: FlashAttentionForwardSm80 asserts "Learnable sink is
# not supported in this kernel" (flash_attn/cute/flash_fwd.py, flash-attn-4 4.0.0b40), and the sm120 forward is
# built on it; the sm90 and sm100 forwards take them, and the backward takes them on sm90-sm110 only.
FA4_SINK_MAJORS = frozenset({9, 10, 11})


def _fa4_generation(gpu: Gpu, name: str, installed: str | None) -> str | None:
    """FA4's builds grew by version (FA4_WIDE_VERSION); the Hub build and a wide package run only the forward
    on sm80."""
    option = FLASH_OPTIONS[name]
    major = gpu.capability[0]
    wide = installed is not None and version_at_least(installed, FA4_WIDE_VERSION)
    majors = option.hub_majors if installed is None else FA4_MAJORS_WIDE if wide else option.majors
    if major in majors:
        return None
    if (wide or installed is None) and major == 8:
        # transformers would not stop it: the major >= 9 check is only in its error path (upstream.py).
        which = f"flash-attn-4 {installed}" if installed else f"{option.hub_repo} (4.0.0.beta8)"
        return (
            f"{which} runs only its forward on {gpu.sm} ({gpu.name}; backward needs sm90+), "
            "and FlashAttention-2 is the Ampere kernel (vLLM's choice below sm90)"
        )
    if installed is not None and major in FA4_MAJORS_WIDE:
        return (
            f"no {name} kernels for {gpu.sm} ({gpu.name}) before flash-attn-4 {FA4_WIDE_VERSION} "
            f"(installed: {installed})"
        )
    return _built_for(gpu, name, installed)


def _fa4_head_dims(gpu: Gpu | None, model: ModelFacts, installed: str | None) -> str | None:
    """FA4's narrower head dims on sm100/sm110."""
    if gpu is None or gpu.capability[0] not in (10, 11):
        return None
    if fa4_head_dims_ok(model.head_dims, model.qk_v_head_dims, installed):
        return None
    received = list(flash_received_head_dims(model.head_dims, model.qk_v_head_dims))
    padded = ""
    if model.qk_v_head_dims is not None and model.qk_v_head_dims[0] != model.qk_v_head_dims[1]:
        qk, v = model.qk_v_head_dims
        padded = f" (transformers pads V {v} up to the query-key dim {qk}, so the kernel gets {qk}/{qk})"
    return (
        f"head dims {received}{padded}: FlashAttention-4 on {gpu.sm} takes 8-128, and 256 only from "
        f"flash-attn-4 {FA4_HD256_VERSION} (installed: {installed or 'none; the Hub kernel'})"
    )


def _fa4_sinks(gpu: Gpu, dtype: str, installed: str | None) -> tuple[str, ...]:
    found: tuple[str, ...] = ()
    if gpu.capability[0] not in FA4_SINK_MAJORS:
        found = (
            f"the model has attention sinks and FlashAttention-4 takes them only on sm90-sm110: {gpu.name} is "
            f'{gpu.sm} (flash_attn/cute/flash_fwd.py: "Learnable sink is not supported in this kernel")',
        )
    return found + _bf16_sinks(dtype)


FLASH_RULES: dict[str, FlashRules] = {
    "flash_attention_2": FlashRules(_built_for, _fa2_versions, _no_head_dims, _fa2_sinks),
    "flash_attention_3": FlashRules(_built_for, _no_versions, _no_head_dims, _fa3_sinks),
    "flash_attention_4": FlashRules(_fa4_generation, _no_versions, _fa4_head_dims, _fa4_sinks),
}
"""What each FlashAttention version of upstream.FLASH_OPTIONS checks beyond the shared rules."""

FLASH_ORDER: dict[int | None, tuple[str, ...]] = {
    9: ("flash_attention_3", "flash_attention_4", "flash_attention_2"),
    10: ("flash_attention_4", "flash_attention_2"),
    None: ("flash_attention_2", "flash_attention_3", "flash_attention_4"),
}
"""FlashAttention versions in the order a GPU generation (compute-capability major) tries them, vLLM's
order; None: every other generation (and no GPU)."""
