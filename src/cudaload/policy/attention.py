"""attn_implementation: an ordered fallback chain for this machine and model.

FlashAttention by GPU generation (FA3 on sm90, FA4 on sm100, FA2 elsewhere, as vLLM),
from the installed package or else the `kernels-community` Hub kernel, then SDPA, then
eager. Never FlashAttention in fp32, for a model without support, or on a generation
upstream does not build for. Several GPUs: the weakest decides.
"""

from __future__ import annotations

from ..capability.facts import Machine
from ..errors import AttentionUnavailableError
from ..model_facts import ModelFacts
from ..plans import Decision, Rejected
from ..upstream import FLASH_OPTIONS, flash_preference
from .kernels import kernels_status

__all__ = ["decide_attention"]


def _hub_kernel(machine: Machine, repo: str) -> tuple[bool, str]:
    usable, why = kernels_status(machine)
    if not usable:
        return False, why
    kernel = machine.hub.kernel(repo)
    if kernel is not None and kernel.cached:
        return True, f"Hub kernel {repo} ({kernel.detail})"
    detail = kernel.detail if kernel is not None else "not in the local cache"
    if machine.hub.offline:
        return False, f"HF_HUB_OFFLINE is set and Hub kernel {repo} is {detail}"
    return True, f"Hub kernel {repo} (not cached: downloaded on first use)"


def _flash(machine: Machine, model: ModelFacts, dtype: str, name: str) -> tuple[str | None, str]:
    """(implementation to pass or None, reason) for one FlashAttention version."""
    option = FLASH_OPTIONS[name]
    gpu = machine.weakest_gpu
    if gpu is None:
        return None, "needs a CUDA GPU"
    if gpu.capability[0] not in option.majors:
        return None, f"no {name} kernels for {gpu.sm} ({gpu.name})"
    if dtype == "float32":
        return None, "FlashAttention runs only in fp16/bf16; the dtype is float32"
    if not model.supports_flash:
        return None, f"{model.model_class} does not support FlashAttention"
    if model.softcap and name != "flash_attention_2":
        # transformers passes softcap only to kernels whose signature has it and raises otherwise;
        # FA2 (2.6+) is the one known to apply it in forward and backward.
        return None, f"attn_logit_softcapping={model.softcap}: only FlashAttention-2 is known to apply it"
    if machine.software.has(option.distribution):
        return name, f"{option.distribution} {machine.software.version(option.distribution)} installed"
    ok, why = _hub_kernel(machine, option.hub_repo)
    if ok:
        return option.hub_repo, f"{option.distribution} not installed; {why}"
    return None, f"{option.distribution} not installed and its Hub kernel is unusable: {why}"


def _sdpa(model: ModelFacts) -> tuple[bool, str]:
    if not model.supports_sdpa:
        return False, f"{model.model_class} does not support SDPA"
    if model.softcap:
        return False, f"SDPA ignores attn_logit_softcapping={model.softcap}; eager applies it"
    return True, "torch SDPA: fused attention on every device"


def _explicit(machine: Machine, model: ModelFacts, dtype: str, requested: str) -> Decision:
    def refuse(why: str) -> AttentionUnavailableError:
        return AttentionUnavailableError(
            f"attn_implementation={requested!r} was asked, but {why}. Use another implementation "
            "(e.g. 'sdpa') or leave attn_implementation unset to let cudaload choose."
        )

    if requested in FLASH_OPTIONS:
        impl, why = _flash(machine, model, dtype, requested)
        if impl is None:
            raise refuse(why)
        return Decision("attn_implementation", requested, f"your choice ({why})", source="user")
    if requested.startswith("kernels-community/"):
        ok, why = _hub_kernel(machine, requested)
        if not ok:
            raise refuse(why)
        if not machine.gpus:
            raise refuse("Hub attention kernels are built for CUDA and there is no GPU here")
        return Decision("attn_implementation", requested, f"your choice ({why})", source="user")
    if requested == "sdpa":
        ok, why = _sdpa(model)
        if not model.supports_sdpa:
            raise refuse(why)
        return Decision("attn_implementation", requested, f"your choice ({why})", source="user")
    return Decision("attn_implementation", requested, "your choice (passed to transformers as is)", source="user")


def decide_attention(
    machine: Machine, model: ModelFacts, dtype: str, requested: str | None
) -> tuple[Decision, tuple[str, ...]]:
    """The attention decision and its fallback chain (the first link is the choice)."""
    if requested is not None:
        decision = _explicit(machine, model, dtype, requested)
        return decision, (requested,)

    gpu = machine.weakest_gpu
    order = flash_preference(gpu.capability[0]) if gpu else flash_preference(0)
    chain: list[str] = []
    reasons: dict[str, str] = {}
    rejected: list[Rejected] = []
    for name in order:
        impl, why = _flash(machine, model, dtype, name)
        if impl is None:
            rejected.append(Rejected(name, why))
        else:
            chain.append(impl)
            reasons[impl] = why
    ok, why = _sdpa(model)
    if ok:
        chain.append("sdpa")
        reasons["sdpa"] = why
    else:
        rejected.append(Rejected("sdpa", why))
    chain.append("eager")
    reasons["eager"] = "the reference implementation: works everywhere, slowest"

    choice = chain[0]
    if choice.startswith(("flash_attention", "kernels-community/")):
        where = f"{gpu.name} ({gpu.sm})" if gpu else ""
        reason = f"fastest supported on {where}: {reasons[choice]}"
    else:
        reason = reasons[choice]
    # Options that are in the chain but not chosen are listed as fallbacks, not rejections.
    return Decision("attn_implementation", choice, reason, tuple(rejected)), tuple(chain)
