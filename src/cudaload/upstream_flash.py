"""FlashAttention as transformers and the flash-attention packages see it, kept as data so tests can hold it
against the installed transformers: each version's distribution, module, Hub kernel and the architectures its
builds run on (`FLASH_OPTIONS`), the rules each version adds (versions, head dims, attention sinks), and what
an `attn_implementation` string is to transformers (`attention_kind`).

Sources: transformers `modeling_flash_attention_utils` (FLASH_ATTENTION_COMPATIBILITY_MATRIX,
FLASH_ATTN_KERNEL_FALLBACK), `integrations/hub_kernels.py`; flash-attention's README and setup for architectures;
vLLM's backend preference (FA3 on sm90, FA4 on sm100, FA2 elsewhere).

This module imports nothing of cudaload but upstream.py, not even for an annotation: every layer reads these
tables, facts/model.py and the GPU vendor records (facts/platform_*.py) among them, so naming their types here
would close a cycle. The rules below take a `FlashGpu` and a `FlashModel` instead, the few attributes of a GPU
and of a model they read, which `Gpu` (facts/hardware.py) and `ModelFacts` (facts/model.py) have as they stand
(mypy checks it where policy/flash_rules.py calls the rules with them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import field
from typing import Literal, Protocol

from .frozen import frozen
from .upstream import version_at_least

__all__ = [
    "FA4_HD256_VERSION",
    "FA4_MAJORS_WIDE",
    "FA4_SINK_MAJORS",
    "FA4_WIDE_VERSION",
    "FLASH_ATTN_2_MIN_VERSION",
    "FLASH_ATTN_2_SOFTCAP_MIN_VERSION",
    "FLASH_DISTRIBUTIONS",
    "FLASH_MAX_HEAD_DIM",
    "FLASH_OPTIONS",
    "AttentionKind",
    "FlashGpu",
    "FlashModel",
    "FlashOption",
    "FlashVendor",
    "attention_kind",
    "cuda_major",
    "fa4_head_dims_ok",
    "flash_received_head_dims",
]


class FlashVendor(Protocol):
    """A GPU vendor's record (facts/platform.py `Platform`) as the FlashAttention rules read it."""

    @property
    def flash_arch_rules(self) -> bool:
        """The records' CUDA architecture rules apply to this vendor's GPUs."""
        ...


class FlashGpu(Protocol):
    """A GPU as the FlashAttention rules read it; facts/hardware.py `Gpu` is one."""

    @property
    def name(self) -> str:
        """The device name ("NVIDIA H100 80GB HBM3")."""
        ...

    @property
    def capability(self) -> tuple[int, int]:
        """CUDA compute capability (major, minor)."""
        ...

    @property
    def sm(self) -> str:
        """The architecture as messages show it ("sm_90")."""
        ...

    @property
    def platform(self) -> FlashVendor:
        """Its vendor's record."""
        ...


class FlashModel(Protocol):
    """A model as the FlashAttention rules read it; facts/model.py `ModelFacts` is one."""

    @property
    def softcap(self) -> float | None:
        """`attn_logit_softcapping`, None when the model has none."""
        ...

    @property
    def head_dims(self) -> tuple[int, ...]:
        """Every attention head dimension the config declares."""
        ...

    @property
    def qk_v_head_dims(self) -> tuple[int, int] | None:
        """(query-key, value) head dims when they differ (MLA); else None."""
        ...


@frozen
class FlashOption:
    """One FlashAttention version: how it is installed and found, and the rules it adds to the ones every version
    shares (policy/flash_rules.py `flash_blockers`). Which GPU architectures run it is the vendor's answer
    (facts/platform_cuda.py reads `majors` and `hub_majors`; facts/platform_rocm.py its own table).

    Attributes:
        implementation: The `attn_implementation` string transformers accepts.
        distribution: The PyPI distribution (which tells FA2 from FA4: both are module `flash_attn`).
        module: The module it is imported as.
        hub_repo: The `kernels-community` repository transformers falls back to without the package (on CUDA; on
            ROCm transformers takes another, which AMD's record names).
        majors: CUDA compute-capability majors the released package's kernels are built for.
        hub_majors: CUDA compute-capability majors the `kernels-community` Hub build runs on.
        versions: (model, installed version or None) -> why the installed package is too old (for
            transformers, or the model).
        head_dims: (GPU or None, model, installed) -> a head dim it lacks within FlashAttention's general limit.
        sinks: (GPU, dtype, installed) -> why it cannot run a model with learnable attention sinks.
    """

    implementation: str
    distribution: str
    module: str
    hub_repo: str
    majors: frozenset[int]
    hub_majors: frozenset[int]
    versions: Callable[[FlashModel, str | None], tuple[str, ...]] = field(default=lambda model, installed: ())
    head_dims: Callable[[FlashGpu | None, FlashModel, str | None], str | None] = field(
        default=lambda gpu, model, installed: None
    )
    sinks: Callable[[FlashGpu, str, str | None], tuple[str, ...]] = field(default=lambda gpu, dtype, installed: ())


# transformers' `is_flash_attn_2_available()` (utils/import_utils.py) accepts flash-attn >= 2.3.3 only;
# `attn_logit_softcapping` reaches the kernel from flash-attn 2.6.0 (the `softcap` argument).
FLASH_ATTN_2_MIN_VERSION = "2.3.3"
FLASH_ATTN_2_SOFTCAP_MIN_VERSION = "2.6.0"

# FlashAttention-4 builds by version (flash_attn/cute/interface.py): from 4.0.0b5 forward runs on
# sm80-sm120 and backward on sm90-sm120; earlier betas on sm90/sm100 only. transformers does NOT gate
# an installed flash-attn-4 by GPU: FLASH_ATTENTION_COMPATIBILITY_MATRIX[4]["cuda_min_major_version"] = 9
# is read only inside `_flash_attn_import_error` (modeling_utils.py, 5.22.2 and 5.25.0), after
# `is_flash_attn_4_available()` said False, which with the package installed and CUDA up it never says.
# cudaload still leaves sm80 out (FA4_MAJORS_WIDE): there FA4's backward does not run and FA2 is
# the Ampere kernel (vLLM picks FA2 below sm90).
FA4_WIDE_VERSION = "4.0.0b5"
FA4_MAJORS_WIDE = frozenset({9, 10, 11, 12})

# Head dimensions: FA2 and FA3 support head_dim <= 256 (flash-attention README; a 512 head fails at
# the first forward, flash-attention issue 2427). FA4 on sm100 and sm110 (`_validate_head_dims`:
# `compute_capability in [10, 11]`) takes 8-128, and 256 only from
# flash-attn-4 4.0.0b11 (the sm100 hd256 kernels, flash_attn/cute/sm100_hd256_2cta_fmha_forward.py);
# its (qk 192, v 128) DeepSeek shape is never reached from transformers, which pads V up to the QK
# head dim before any FlashAttention call (integrations/flash_attention.py: "FlashAttention requires
# the query and value to share a head dim; pad `value` up to the query head dim (e.g. MLA ...)",
# 5.22.2 and 5.25.0), so DeepSeek-V3 MLA arrives as (192, 192), which FA4 on sm100 asserts on.
FLASH_MAX_HEAD_DIM = 256
FA4_HD256_VERSION = "4.0.0b11"


def flash_received_head_dims(head_dims: tuple[int, ...], qk_v: tuple[int, int] | None) -> tuple[int, ...]:
    """The head dims a FlashAttention kernel receives from transformers: with different query-key and
    value dims (MLA), V padded up to the query-key dim, so the value dim never reaches the kernel."""
    if qk_v is None or qk_v[0] == qk_v[1]:
        return tuple(sorted(set(head_dims)))
    return tuple(sorted({d for d in head_dims if d != qk_v[1]} | {qk_v[0]}))


def fa4_head_dims_ok(head_dims: tuple[int, ...], qk_v: tuple[int, int] | None, installed: str | None = None) -> bool:
    """Whether FlashAttention-4 on sm100 runs every head dim the kernel receives; `installed` is the
    flash-attn-4 version (None: the Hub kernel, whose FA4 build is not known to have hd256)."""
    hd256 = installed is not None and version_at_least(installed, FA4_HD256_VERSION)
    return all(8 <= d <= 128 or (d == 256 and hd256) for d in flash_received_head_dims(head_dims, qk_v))


# --- what each FlashAttention version adds to the shared rules (FlashOption.versions / head_dims / sinks) ---
# The architecture rules here are CUDA's: they read `cuda_major`, None on a vendor whose record says
# `flash_arch_rules=False` (FA3 and FA4 are not planned there at all).


def cuda_major(gpu: FlashGpu) -> int | None:
    """The GPU's compute-capability major where the FlashAttention records' CUDA architecture rules apply."""
    return gpu.capability[0] if gpu.platform.flash_arch_rules else None


def _fa2_versions(model: FlashModel, installed: str | None) -> tuple[str, ...]:
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


def _fa2_sinks(gpu: FlashGpu, dtype: str, installed: str | None) -> tuple[str, ...]:
    return (
        "the model has attention sinks and FlashAttention-2 takes neither `s_aux` nor `learnable_sink`: transformers "
        "would drop them silently (5.22-5.25 modeling_flash_attention_utils.py: _process_flash_attention_kwargs)",
    )


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


def _fa3_sinks(gpu: FlashGpu, dtype: str, installed: str | None) -> tuple[str, ...]:
    found: tuple[str, ...] = ()
    if installed is None and cuda_major(gpu) not in (9, None):
        found = (
            f"the model has attention sinks and {FLASH_OPTIONS['flash_attention_3'].hub_repo} takes them only on "
            f'Hopper: {gpu.name} is {gpu.sm} (flash_api_stable.cpp: "S aux is currently only supported for Hopper '
            'GPUs")',
        )
    return found + _bf16_sinks(dtype)


# Majors whose FlashAttention-4 forward takes learnable sinks: FlashAttentionForwardSm80 asserts "Learnable sink is
# not supported in this kernel" (flash_attn/cute/flash_fwd.py, flash-attn-4 4.0.0b40), and the sm120 forward is
# built on it; the sm90 and sm100 forwards take them, and the backward takes them on sm90-sm110 only.
FA4_SINK_MAJORS = frozenset({9, 10, 11})


def _fa4_head_dims(gpu: FlashGpu | None, model: FlashModel, installed: str | None) -> str | None:
    """FA4's narrower head dims on sm100/sm110."""
    if gpu is None or cuda_major(gpu) not in (10, 11):
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


def _fa4_sinks(gpu: FlashGpu, dtype: str, installed: str | None) -> tuple[str, ...]:
    found: tuple[str, ...] = ()
    if cuda_major(gpu) not in (*FA4_SINK_MAJORS, None):
        found = (
            f"the model has attention sinks and FlashAttention-4 takes them only on sm90-sm110: {gpu.name} is "
            f'{gpu.sm} (flash_attn/cute/flash_fwd.py: "Learnable sink is not supported in this kernel")',
        )
    return found + _bf16_sinks(dtype)


FLASH_OPTIONS: dict[str, FlashOption] = {
    o.implementation: o
    for o in (
        # FA2: Ampere and newer (fails at the first forward on Turing/Volta, not at import). Released
        # flash-attn 2.8.3 builds sm80/90/100/120 SASS without PTX (setup.py: "80;90;100;120"), and the
        # Hub build the same (kernels-community flash-attn2/build.toml: cuda-capabilities 8.0, 9.0, 10.0,
        # 12.0; kernel-builder adds PTX only for a "+PTX" capability): each runs within its major
        # (8.0 covers 8.6/8.9), none on major 11 (sm110).
        FlashOption(
            "flash_attention_2",
            "flash-attn",
            "flash_attn",
            "kernels-community/flash-attn2",
            frozenset({8, 9, 10, 12}),
            frozenset({8, 9, 10, 12}),
            versions=_fa2_versions,
            sinks=_fa2_sinks,
        ),
        # FA3 (hopper/ in flash-attention): sm80 and sm90a builds; transformers' minimum major is 8. The
        # Hub build too (vllm-flash-attn3/build.toml: 8.0 and 9.0a), backward included.
        FlashOption(
            "flash_attention_3",
            "flash-attn-3",
            "flash_attn_interface",
            "kernels-community/vllm-flash-attn3",
            frozenset({8, 9}),
            frozenset({8, 9}),
            sinks=_fa3_sinks,
        ),
        # FA4 (CuTe DSL, compiled at first use): before 4.0.0b5 Hopper and datacenter Blackwell only
        # (`majors`; newer packages: FA4_MAJORS_WIDE). The Hub build (flash-attn4/build.toml: torch-noarch)
        # vendors 4.0.0.beta8 (torch-ext/flash_attn4/__init__.py): forward on majors 8-12, backward on
        # 9-12 (interface.py `assert arch // 10 in [9, 10, 11, 12]`); sm80 left out as for the package.
        FlashOption(
            "flash_attention_4",
            "flash-attn-4",
            "flash_attn",
            "kernels-community/flash-attn4",
            frozenset({9, 10}),
            frozenset({9, 10, 11, 12}),
            head_dims=_fa4_head_dims,
            sinks=_fa4_sinks,
        ),
    )
}


# (distribution, module) per implementation, for detection.
FLASH_DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    name: (o.distribution, o.module) for name, o in FLASH_OPTIONS.items()
}


AttentionKind = Literal["flash", "hub_kernel", "sdpa", "flex", "eager", "other"]
"""What an `attn_implementation` string is to transformers."""

# transformers' own test for a Hub-kernel attn_implementation ("org/repo[@revision][:function]"):
# integrations/hub_kernels.py, `is_kernel`. Compiled by `re` on first use: the common names never need it.
_HUB_KERNEL = r"^[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?$"
_NAMED: dict[str, AttentionKind] = {"sdpa": "sdpa", "flex_attention": "flex", "eager": "eager"}


def attention_kind(implementation: str) -> AttentionKind:
    """Classify an `attn_implementation` as transformers does: a FlashAttention package name
    ("flash_attention_2"...), a Hub kernel repository (its `is_kernel` pattern), "sdpa",
    "flex_attention", "eager", or another registered name ("other")."""
    if implementation in FLASH_OPTIONS:
        return "flash"
    if implementation in _NAMED:  # none has a "/": the Hub pattern could not match it
        return _NAMED[implementation]
    return "hub_kernel" if re.match(_HUB_KERNEL, implementation) else "other"
