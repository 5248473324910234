"""The plan's consent to Hub code, checked before transformers is asked to fetch any."""

from __future__ import annotations

import re

from ..plans import ApplyFacts, Plan
from ..upstream_flash import attention_kind
from .applied import Failure, Phase

__all__ = ["unasked_hub_code"]  # used by apply.py


def _hub_code_allowed(plan: Plan, option: str) -> bool:
    """The plan's consent to Hub code: hub_kernels=True or use_kernels=True when it was made, or `option` is
    the Hub kernel you named as attn_implementation (naming one is consent for it). A plan rebuilt without
    `hub_code` (e.g. from JSON) carries no consent beyond its kwargs."""
    if plan.kwargs.get("use_kernels") is True or plan.hub_code:
        return True
    return "attn_implementation" in plan.explicit and plan.decision("attn_implementation").value == option


def _hub_repo_here(option: str) -> str | None:
    """The Hub repository transformers in this process would fetch code from for attention `option`: a Hub
    kernel named as such, or a FlashAttention whose package is not usable here while `kernels` is, which
    transformers swaps for its kernels-community build (modeling_utils.py `_check_and_adjust_attn_implementation`:
    `FLASH_ATTENTION_COMPATIBILITY_MATRIX[v]["general_availability_check"]`, then FLASH_ATTN_KERNEL_FALLBACK when
    `is_kernels_available()`); None when it fetches nothing."""
    kind = attention_kind(option)
    if kind == "hub_kernel":
        return re.split("[@:]", option, maxsplit=1)[0]
    if kind != "flash":
        return None
    from transformers.modeling_flash_attention_utils import (
        FLASH_ATTENTION_COMPATIBILITY_MATRIX,
        FLASH_ATTN_KERNEL_FALLBACK,
    )
    from transformers.utils.import_utils import is_kernels_available

    entry = FLASH_ATTENTION_COMPATIBILITY_MATRIX.get(int(option.rsplit("_", 1)[1]))
    if entry is None or entry["general_availability_check"]() or not is_kernels_available():
        return None
    return FLASH_ATTN_KERNEL_FALLBACK.get(option)


def unasked_hub_code(plan: Plan, option: str, phase: Phase) -> Failure | None:
    """A failure, before transformers is asked, when `option` would make it download and run Hub code here that
    the plan did not allow (a plan made for another machine, where the package was installed or the kernel
    cached); None when it fetches nothing, Hub code was allowed, or the kernel is in this machine's cache as the
    planner found it (`ApplyFacts.cached_kernels`: none for a plan made for a machine you passed, whose cache
    is not this one's)."""
    if _hub_code_allowed(plan, option):
        return None
    repo = _hub_repo_here(option)
    if repo is None:
        return None
    facts = plan.apply_facts or ApplyFacts()
    if repo in facts.cached_kernels:
        return None  # fetched before: the same rule as the plan's (policy/attention.py `_consent_needed`)
    return Failure(
        phase,
        f"transformers would download and run {repo} from the Hub here, and this plan does not allow Hub code "
        "(pass hub_kernels=True to plan() or load() to allow it)",
    )
