"""attn_implementation: an ordered fallback chain for this machine and model.

FlashAttention by GPU generation (FA3 on sm90, FA4 on sm100, FA2 elsewhere, as vLLM),
from the installed package or else the `kernels-community` Hub kernel, then SDPA, then
eager. Never FlashAttention in fp32, for a model without support, or on a generation
upstream does not build for. Several GPUs: the weakest decides.
"""

from __future__ import annotations

import re
from typing import Literal

from ..errors import AttentionUnavailableError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
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
from .kernels import kernels_status

__all__ = ["AttentionKind", "attention_kind", "decide_attention", "is_flash_attention"]

AttentionKind = Literal["flash", "hub_kernel", "sdpa", "flex", "eager", "other"]
"""What an `attn_implementation` string is to transformers."""

# transformers' own test for a Hub-kernel attn_implementation ("org/repo[@revision][:function]"):
# integrations/hub_kernels.py, `is_kernel`.
_HUB_KERNEL = re.compile(r"^[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?$")


def attention_kind(implementation: str) -> AttentionKind:
    """Classify an `attn_implementation` as transformers does: a FlashAttention package name
    ("flash_attention_2"...), a Hub kernel repository (its `is_kernel` pattern), "sdpa",
    "flex_attention", "eager", or another registered name ("other")."""
    if implementation in FLASH_OPTIONS:
        return "flash"
    if _HUB_KERNEL.match(implementation):
        return "hub_kernel"
    named: dict[str, AttentionKind] = {"sdpa": "sdpa", "flex_attention": "flex", "eager": "eager"}
    return named.get(implementation, "other")


def is_flash_attention(implementation: str) -> bool:
    """FlashAttention from its package or a Hub kernel of it (`kernels-community/flash-attn3`,
    `.../vllm-flash-attn3`): attention that takes no padding mask (varlen / unpadded inputs)."""
    kind = attention_kind(implementation)
    return kind == "flash" or (kind == "hub_kernel" and "flash-attn" in implementation.split("/", 1)[1])


def flash_preference(major: int) -> tuple[str, ...]:
    """FlashAttention versions in order of preference for a GPU generation (vLLM's order)."""
    order: tuple[int, ...]
    if major == 9:
        order = (3, 4, 2)
    elif major == 10:
        order = (4, 2)
    else:
        order = (2, 3, 4)
    return tuple(f"flash_attention_{v}" for v in order)


def _hub_kernel(machine: Machine, repo: str) -> tuple[bool, str]:
    usable, why = kernels_status(machine)
    if not usable:
        return False, why
    kernel = machine.hub.kernel(repo)
    if kernel is not None and kernel.cached:
        if machine.hub.offline:
            return True, f"Hub kernel {repo} ({kernel.detail})"
        # kernels (hf_hub.py `_check_trust_remote_code`) verifies the publisher on the Hub unless
        # HF_HUB_OFFLINE is set, even for a cached kernel: without network that load fails.
        return True, (
            f"Hub kernel {repo} ({kernel.detail}; online mode: `kernels` still asks the Hub to verify its "
            "publisher, so without network it fails and the next link is used; HF_HUB_OFFLINE=1 uses the cache alone)"
        )
    detail = kernel.detail if kernel is not None else "not in the local cache"
    if machine.hub.offline:
        return False, f"HF_HUB_OFFLINE is set and Hub kernel {repo} is {detail}"
    return True, f"Hub kernel {repo} (not cached: downloaded on first use)"


def _cannot_run(machine: Machine, model: ModelFacts, dtype: str, name: str, installed: str | None) -> str | None:
    """Why FlashAttention `name` cannot run this model here (None when it can). `installed` is the
    package version, or None for the Hub kernel."""
    option = FLASH_OPTIONS[name]
    gpu = machine.weakest_gpu
    if gpu is None:
        return "needs a CUDA GPU"
    fa4_wide = name == "flash_attention_4" and installed is not None and version_at_least(installed, FA4_WIDE_VERSION)
    majors = option.hub_majors if installed is None else FA4_MAJORS_WIDE if fa4_wide else option.majors
    if gpu.capability[0] not in majors:
        note = ""
        if name == "flash_attention_4" and installed is not None and gpu.capability[0] in FA4_MAJORS_WIDE:
            note = f" before flash-attn-4 {FA4_WIDE_VERSION} (installed: {installed})"
        elif installed is None and gpu.capability[0] in option.majors:
            note = f" in the Hub build {option.hub_repo}"  # the package would have them
        hub_fa4 = name == "flash_attention_4" and installed is None
        if (fa4_wide or hub_fa4) and gpu.capability[0] == 8:
            # transformers would not stop it: the major >= 9 check is only in its error path (upstream.py).
            which = f"flash-attn-4 {installed}" if installed else f"{option.hub_repo} (4.0.0.beta8)"
            return (
                f"{which} runs only its forward on {gpu.sm} ({gpu.name}; backward needs sm90+), "
                "and FlashAttention-2 is the Ampere kernel (vLLM's choice below sm90)"
            )
        return f"no {name} kernels for {gpu.sm} ({gpu.name}){note}"
    if dtype == "float32":
        return "FlashAttention runs only in fp16/bf16; the dtype is float32"
    if not model.supports_flash:
        return f"{model.model_class} does not support FlashAttention"
    if (
        name == "flash_attention_2"
        and installed is not None
        and not version_at_least(installed, FLASH_ATTN_2_MIN_VERSION)
    ):
        return f"flash-attn {installed} is older than {FLASH_ATTN_2_MIN_VERSION}, the oldest transformers accepts"
    softcap_too_old = installed is not None and not version_at_least(installed, FLASH_ATTN_2_SOFTCAP_MIN_VERSION)
    if model.softcap and name == "flash_attention_2" and softcap_too_old:
        return (
            f"attn_logit_softcapping={model.softcap} needs flash-attn >= {FLASH_ATTN_2_SOFTCAP_MIN_VERSION} "
            f"(installed: {installed})"
        )
    too_big = [d for d in model.head_dims if d > FLASH_MAX_HEAD_DIM]
    if too_big:
        return f"head_dim {max(too_big)}: FlashAttention supports head dims up to {FLASH_MAX_HEAD_DIM}"
    if (
        name == "flash_attention_4"
        and gpu.capability[0] in (10, 11)
        and not fa4_head_dims_ok(model.head_dims, model.qk_v_head_dims, installed)
    ):
        received = list(flash_received_head_dims(model.head_dims, model.qk_v_head_dims))
        padded = ""
        if model.qk_v_head_dims is not None and model.qk_v_head_dims[0] != model.qk_v_head_dims[1]:
            qk, v = model.qk_v_head_dims
            padded = f" (transformers pads V {v} up to the query-key dim {qk}, so the kernel gets {qk}/{qk})"
        return (
            f"head dims {received}{padded}: FlashAttention-4 on {gpu.sm} takes 8-128, and 256 only from "
            f"flash-attn-4 {FA4_HD256_VERSION} (installed: {installed or 'none; the Hub kernel'})"
        )
    return None


def _flash(machine: Machine, model: ModelFacts, dtype: str, name: str) -> tuple[str | None, str]:
    """(implementation to pass or None, reason) for one FlashAttention version: the installed
    package, else its `kernels-community` Hub kernel."""
    option = FLASH_OPTIONS[name]
    installed = machine.software.version(option.distribution)
    if installed is not None:
        why = _cannot_run(machine, model, dtype, name, installed)
        return (None, why) if why else (name, f"{option.distribution} {installed} installed")
    return _flash_hub(machine, model, dtype, name, f"{option.distribution} not installed; ")


def _flash_hub(machine: Machine, model: ModelFacts, dtype: str, name: str, prefix: str = "") -> tuple[str | None, str]:
    """The Hub kernel of FlashAttention `name`, when it can run here and can be fetched."""
    repo = FLASH_OPTIONS[name].hub_repo
    why = _cannot_run(machine, model, dtype, name, None)
    if why:
        return None, why
    ok, detail = _hub_kernel(machine, repo)
    if ok:
        return repo, f"{prefix}{detail}"
    return None, f"{prefix}its Hub kernel is unusable: {detail}"


def _compatible_entry(machine: Machine, model: ModelFacts, dtype: str, entry: str) -> tuple[str | None, str]:
    """One entry of the model's `_compatible_flash_implementations`: a FlashAttention name or a
    Hub kernel repository."""
    if entry in FLASH_OPTIONS:
        return _flash(machine, model, dtype, entry)
    for name, option in FLASH_OPTIONS.items():
        if option.hub_repo == entry:
            return _flash_hub(machine, model, dtype, name, f"{model.model_class} asks for this Hub kernel; ")
    return None, "a Hub kernel cudaload cannot check for this GPU (not a CUDA FlashAttention build it knows)"


def _sdpa(model: ModelFacts) -> tuple[bool, str]:
    if not model.supports_sdpa:
        return False, f"{model.model_class} does not support SDPA"
    if model.softcap:
        return False, f"SDPA ignores attn_logit_softcapping={model.softcap}; eager applies it"
    return True, "torch SDPA: fused attention on every device"


def _redirected(model: ModelFacts, option: str) -> str:
    accepted = ", ".join(model.compatible_flash or ())
    return (
        f"{model.model_class} accepts only [{accepted}]: transformers would replace {option} with one of them "
        "(`_compatible_flash_implementations`)"
    )


def _explicit(machine: Machine, model: ModelFacts, dtype: str, requested: str) -> Decision:
    def refuse(why: str) -> AttentionUnavailableError:
        return AttentionUnavailableError(
            f"attn_implementation={requested!r} was asked, but {why}. Use another implementation "
            "(e.g. 'sdpa') or leave attn_implementation unset to let cudaload choose."
        )

    compatible = model.compatible_flash
    if compatible is not None and requested not in compatible and attention_kind(requested) in ("flash", "hub_kernel"):
        raise refuse(_redirected(model, requested))
    if requested in FLASH_OPTIONS:
        impl, why = _flash(machine, model, dtype, requested)
        if impl is None:
            raise refuse(why)
        return Decision("attn_implementation", requested, f"your choice ({why})", source="user")
    if compatible is not None and requested in compatible:
        impl, why = _compatible_entry(machine, model, dtype, requested)
        if impl is None:
            raise refuse(why)
        return Decision("attn_implementation", requested, f"your choice ({why})", source="user")
    if attention_kind(requested) == "hub_kernel":
        ok, why = _hub_kernel(machine, requested)
        if not ok:
            raise refuse(why)
        if not machine.gpus and is_flash_attention(requested):
            raise refuse("FlashAttention Hub kernels are built for CUDA and there is no GPU here")
        return Decision("attn_implementation", requested, f"your choice ({why})", source="user")
    if requested == "sdpa":
        ok, why = _sdpa(model)
        if not model.supports_sdpa:
            raise refuse(why)
        return Decision("attn_implementation", requested, f"your choice ({why})", source="user")
    return Decision("attn_implementation", requested, "your choice (passed to transformers as is)", source="user")


def _consent_needed(machine: Machine, link: str) -> bool:
    """A Hub-kernel link whose code is not in the local cache: using it downloads and runs code."""
    if attention_kind(link) != "hub_kernel":
        return False
    kernel = machine.hub.kernel(link)
    return kernel is None or not kernel.cached


NO_CONSENT = (
    "not in the local cache, and fetching it downloads and runs code from the Hub: pass hub_kernels=True "
    "(or use_kernels=True) to allow Hub code"
)


def decide_attention(
    machine: Machine, model: ModelFacts, dtype: str, requested: str | None, hub_code: bool = False
) -> tuple[Decision, tuple[str, ...]]:
    """The attention decision and its fallback chain (the first link is the choice).

    Hub code runs only with consent: a Hub kernel is planned when it is already cached (it was
    fetched before) or `hub_code` is True (hub_kernels=True or use_kernels=True), as `use_kernels`
    itself is opt-in. Naming a Hub kernel as `attn_implementation` is consent for that kernel.
    """
    if requested is not None:
        decision = _explicit(machine, model, dtype, requested)
        return decision, (requested,)

    gpu = machine.weakest_gpu
    order = flash_preference(gpu.capability[0]) if gpu else flash_preference(0)
    chain: list[str] = []
    reasons: dict[str, str] = {}
    rejected: list[Rejected] = []

    def consider(option: str, impl: str | None, why: str) -> None:
        if impl is None:
            rejected.append(Rejected(option, why))
        else:
            chain.append(impl)
            reasons[impl] = why

    if model.compatible_flash is None:
        for name in order:
            consider(name, *_flash(machine, model, dtype, name))
    else:
        # transformers replaces any other FlashAttention request with one of these: plan only them,
        # in the model author's order (modeling_utils.py, `_compatible_flash_implementations`).
        for name in order:
            if name not in model.compatible_flash:
                rejected.append(Rejected(name, _redirected(model, name)))
        for entry in model.compatible_flash:
            consider(entry, *_compatible_entry(machine, model, dtype, entry))
    if not hub_code:
        for link in [link for link in chain if _consent_needed(machine, link)]:
            chain.remove(link)
            rejected.append(Rejected(link, NO_CONSENT))
    ok, why = _sdpa(model)
    if ok:
        chain.append("sdpa")
        reasons["sdpa"] = why
    else:
        rejected.append(Rejected("sdpa", why))
        # transformers' own advice when a kernel cannot softcap: "Try using `eager` or `flex_attention`".
        if model.supports_flex:
            if gpu is not None:
                consider("flex_attention", "flex_attention", "torch flex_attention: fused, applies what SDPA cannot")
            else:
                rejected.append(
                    Rejected("flex_attention", "not planned on a CPU: it needs torch.compile there (unverified)")
                )
    chain.append("eager")
    reasons["eager"] = "the reference implementation: works everywhere, slowest"

    choice = chain[0]
    if attention_kind(choice) in ("flash", "hub_kernel"):
        where = f"{gpu.name} ({gpu.sm})" if gpu else ""
        reason = f"fastest supported on {where}: {reasons[choice]}"
    else:
        reason = reasons[choice]
    # Options that are in the chain but not chosen are listed as fallbacks, not rejections.
    return Decision("attn_implementation", choice, reason, tuple(rejected)), tuple(chain)
