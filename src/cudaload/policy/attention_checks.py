"""The attention checks: every reason one `attn_implementation` option cannot serve a model here.

`check_attention(option, machine, model, dtype)` returns an `OptionCheck` with every blocker (it
cannot run) and cost (it runs, but cudaload would not plan it); policy/attention.py builds the explicit
choice and the automatic fallback chain from it (its docstring says how).

Two families are recognised by form, as transformers does: FlashAttention (upstream_flash.FLASH_OPTIONS, with
each version's rules in flash_rules.py) and Hub kernels ("org/repo"). Every other backend is a record of
BACKENDS (facts/attention_backends.py), which owns its check, its place in the automatic chain after
FlashAttention, its model-class flag and its run-time modules.
"""

from __future__ import annotations

from ..facts.attention_backends import BACKENDS, AttentionBackend, OptionCheck
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..upstream_flash import FLASH_OPTIONS, attention_kind
from .flash_rules import flash_blockers
from .kernels import kernels_status

__all__ = [
    "AS_IS",
    "BACKENDS",
    "AttentionBackend",
    "OptionCheck",
    "check_attention",
    "is_checked",
    "is_flash_attention",
]


def is_flash_attention(implementation: str) -> bool:
    """FlashAttention from its package or a Hub kernel of it (`kernels-community/flash-attn3`,
    `.../vllm-flash-attn3`): attention that takes no padding mask (varlen / unpadded inputs)."""
    kind = attention_kind(implementation)
    return kind == "flash" or (kind == "hub_kernel" and "flash-attn" in implementation.split("/", 1)[1])


# --- the checks: every reason against one option --------------------------------------------------


AS_IS = "passed to transformers as is"


def check_attention(option: str, machine: Machine, model: ModelFacts, dtype: str) -> OptionCheck:
    """Every reason `option` (an `attn_implementation` string) cannot serve `model` in `dtype` on
    `machine`: the one validation both an explicit choice and the automatic chain use."""
    kind = attention_kind(option)
    listed = model.compatible_flash
    if listed is not None and option in listed:
        return _compatible_entry(machine, model, dtype, option)
    if listed is not None and kind in ("flash", "hub_kernel"):
        # transformers would silently replace it with a listed one: the option asked is never what runs.
        return OptionCheck(option, "", (_redirected(model, option),))
    if kind == "flash":
        return _flash_package(machine, model, dtype, option)
    if kind == "hub_kernel":
        return _hub_repository(machine, model, dtype, option)
    backend = BACKENDS.get(option)
    if backend is not None:
        return backend.check(machine, model, dtype)
    # Another registered name is the caller's own code, which cudaload cannot judge.
    return OptionCheck(option, AS_IS)


def is_checked(option: str) -> bool:
    """cudaload judges `option` (FlashAttention, a Hub kernel, a backend with checks); False for eager and names
    it does not know, which are passed to transformers as they are."""
    backend = BACKENDS.get(option)
    return attention_kind(option) in ("flash", "hub_kernel") or (backend is not None and backend.checked)


def _flash_package(machine: Machine, model: ModelFacts, dtype: str, name: str) -> OptionCheck:
    """FlashAttention `name` from its installed package, else from its `kernels-community` Hub
    kernel (what transformers itself falls back to, `FLASH_ATTN_KERNEL_FALLBACK`)."""
    option = FLASH_OPTIONS[name]
    installed = machine.software.version(option.distribution)
    if installed is None:
        return _flash_hub(machine, model, dtype, name, f"{option.distribution} not installed; ")
    blockers = flash_blockers(machine, model, dtype, name, installed)
    gpu = machine.weakest_gpu
    note = gpu.platform.flash_note(gpu, name) if gpu is not None else ""  # e.g. which ROCm backend runs it
    return OptionCheck(name, f"{option.distribution} {installed} installed{note}", blockers)


def _flash_hub(machine: Machine, model: ModelFacts, dtype: str, name: str, prefix: str = "") -> OptionCheck:
    """The Hub kernel of FlashAttention `name`: it must run this model here and be fetchable."""
    repo = FLASH_OPTIONS[name].hub_repo
    blockers = flash_blockers(machine, model, dtype, name, None)
    usable, detail = _hub_kernel(machine, repo)
    if not usable:
        blockers += (f"{prefix}its Hub kernel is unusable: {detail}",)
    return OptionCheck(repo, f"{prefix}{detail}", blockers)


def _hub_kernel(machine: Machine, repo: str) -> tuple[bool, str]:
    """(usable, why) for fetching Hub kernel `repo` through `kernels` here."""
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


def _flash_of(repo: str) -> str | None:
    """The FlashAttention option whose `kernels-community` build `repo` is; None for another repo."""
    return next((name for name, option in FLASH_OPTIONS.items() if option.hub_repo == repo), None)


def _hub_repository(machine: Machine, model: ModelFacts, dtype: str, repo: str) -> OptionCheck:
    """A Hub kernel named as `attn_implementation`. The `kernels-community` build of a FlashAttention
    gets that FlashAttention's checks (it is the same kernel the automatic chain would judge)."""
    name = _flash_of(repo)
    if name is not None:
        return _flash_hub(machine, model, dtype, name)
    usable, detail = _hub_kernel(machine, repo)
    blockers: tuple[str, ...] = () if usable else (detail,)
    if not machine.gpus and is_flash_attention(repo):
        blockers += ("FlashAttention Hub kernels are built for CUDA and there is no GPU here",)
    return OptionCheck(repo, detail, blockers)


def _compatible_entry(machine: Machine, model: ModelFacts, dtype: str, entry: str) -> OptionCheck:
    """One entry of the model's `_compatible_flash_implementations`: a FlashAttention name or a
    Hub kernel repository."""
    if entry in FLASH_OPTIONS:
        return _flash_package(machine, model, dtype, entry)
    name = _flash_of(entry)
    if name is not None:
        return _flash_hub(machine, model, dtype, name, f"{model.model_class} asks for this Hub kernel; ")
    cannot = "a Hub kernel cudaload cannot check for this GPU (not a CUDA FlashAttention build it knows)"
    return OptionCheck(entry, "", (cannot,))


def _redirected(model: ModelFacts, option: str) -> str:
    accepted = ", ".join(model.compatible_flash or ())
    return (
        f"{model.model_class} accepts only [{accepted}]: transformers would replace {option} with one of them "
        "(`_compatible_flash_implementations`)"
    )
