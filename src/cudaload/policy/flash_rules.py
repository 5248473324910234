"""The FlashAttention rules: every reason a FlashAttention version cannot run a model here, in the order of
the rules in docs/decisions.md (GPU generation, dtype, model support, package version, head dims, sinks)."""

from __future__ import annotations

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

__all__ = ["FA4_SINK_MAJORS", "flash_blockers"]


def flash_blockers(
    machine: Machine, model: ModelFacts, dtype: str, name: str, installed: str | None
) -> tuple[str, ...]:
    """Every reason FlashAttention `name` cannot run this model here, in the order of the rules in
    docs/decisions.md. `installed` is the package version, or None for the Hub kernel."""
    gpu = machine.weakest_gpu
    found = (
        _generation_blocker(gpu, name, installed) if gpu is not None else "needs a CUDA GPU",
        "FlashAttention runs only in fp16/bf16; the dtype is float32" if dtype == "float32" else None,
        None if model.supports_flash else f"{model.model_class} does not support FlashAttention",
        *_version_blockers(model, name, installed),
        _head_dim_blocker(gpu, model, name, installed),
        *(_sinks_blockers(gpu, dtype, name, installed) if model.attention_sinks else ()),
    )
    return tuple(reason for reason in found if reason)


# Majors whose FlashAttention-4 forward takes learnable sinks: FlashAttentionForwardSm80 asserts "Learnable sink is
# not supported in this kernel" (flash_attn/cute/flash_fwd.py, flash-attn-4 4.0.0b40), and the sm120 forward is
# built on it; the sm90 and sm100 forwards take them, and the backward takes them on sm90-sm110 only.
FA4_SINK_MAJORS = frozenset({9, 10, 11})


def _sinks_blockers(gpu: Gpu | None, dtype: str, name: str, installed: str | None) -> tuple[str, ...]:
    """Why FlashAttention `name` cannot run a model with learnable attention sinks (gpt-oss) here."""
    if gpu is None or dtype == "float32":
        return ()  # already blocked: no GPU, or fp32
    found: list[str] = []
    major = gpu.capability[0]
    if name == "flash_attention_2":
        found.append(
            "the model has attention sinks and FlashAttention-2 takes neither `s_aux` nor `learnable_sink`: "
            "transformers would drop them silently (modeling_flash_attention_utils.py:705-709)"
        )
    elif name == "flash_attention_3" and installed is None and major != 9:
        found.append(
            f"the model has attention sinks and {FLASH_OPTIONS[name].hub_repo} takes them only on Hopper: "
            f'{gpu.name} is {gpu.sm} (flash_api_stable.cpp: "S aux is currently only supported for Hopper GPUs")'
        )
    elif name == "flash_attention_4" and major not in FA4_SINK_MAJORS:
        found.append(
            f"the model has attention sinks and FlashAttention-4 takes them only on sm90-sm110: {gpu.name} is "
            f'{gpu.sm} (flash_attn/cute/flash_fwd.py: "Learnable sink is not supported in this kernel")'
        )
    if dtype != "bfloat16" and name in ("flash_attention_3", "flash_attention_4"):
        # transformers casts the sinks to the query dtype (integrations/flash_attention.py:103, `s_aux.to(...)`).
        found.append(
            f"the model has attention sinks and the sink kernels take only bf16 sinks; the dtype is {dtype} "
            '(flash_api_stable.cpp: "We only support bf16 dtype for S aux"; FA4 interface.py: '
            '"learnable_sink must be bfloat16")'
        )
    return tuple(found)


def _generation_blocker(gpu: Gpu, name: str, installed: str | None) -> str | None:
    """Why FlashAttention `name` has no kernels for this GPU generation; None when it has."""
    option = FLASH_OPTIONS[name]
    major = gpu.capability[0]
    fa4_wide = name == "flash_attention_4" and installed is not None and version_at_least(installed, FA4_WIDE_VERSION)
    majors = option.hub_majors if installed is None else FA4_MAJORS_WIDE if fa4_wide else option.majors
    if major in majors:
        return None
    hub_fa4 = name == "flash_attention_4" and installed is None
    if (fa4_wide or hub_fa4) and major == 8:
        # transformers would not stop it: the major >= 9 check is only in its error path (upstream.py).
        which = f"flash-attn-4 {installed}" if installed else f"{option.hub_repo} (4.0.0.beta8)"
        return (
            f"{which} runs only its forward on {gpu.sm} ({gpu.name}; backward needs sm90+), "
            "and FlashAttention-2 is the Ampere kernel (vLLM's choice below sm90)"
        )
    note = ""
    if name == "flash_attention_4" and installed is not None and major in FA4_MAJORS_WIDE:
        note = f" before flash-attn-4 {FA4_WIDE_VERSION} (installed: {installed})"
    elif installed is None and major in option.majors:
        note = f" in the Hub build {option.hub_repo}"  # the package would have them
    return f"no {name} kernels for {gpu.sm} ({gpu.name}){note}"


def _version_blockers(model: ModelFacts, name: str, installed: str | None) -> tuple[str, ...]:
    """An installed flash-attn (FA2) too old for transformers, or for this model's softcapping."""
    if name != "flash_attention_2" or installed is None:
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


def _head_dim_blocker(gpu: Gpu | None, model: ModelFacts, name: str, installed: str | None) -> str | None:
    """A head dim the kernel lacks: over 256 for any FlashAttention, else FA4's narrower set on
    sm100/sm110 (checked only within the general limit, so one head dim gives one reason)."""
    too_big = [d for d in model.head_dims if d > FLASH_MAX_HEAD_DIM]
    if too_big:
        return f"head_dim {max(too_big)}: FlashAttention supports head dims up to {FLASH_MAX_HEAD_DIM}"
    if name != "flash_attention_4" or gpu is None or gpu.capability[0] not in (10, 11):
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
