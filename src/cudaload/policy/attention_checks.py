"""The attention checks: every reason one `attn_implementation` option cannot serve a model here.

`check_attention(option, machine, model, dtype)` returns an `OptionCheck` with every blocker (it
cannot run) and cost (it runs, but cudaload would not plan it); policy/attention.py builds the explicit
choice and the automatic fallback chain from it (its docstring says how).
"""

from __future__ import annotations

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
    attention_kind,
    fa4_head_dims_ok,
    flash_received_head_dims,
    version_at_least,
)
from .kernels import kernels_status

__all__ = ["AS_IS", "OptionCheck", "check_attention", "is_flash_attention"]


def is_flash_attention(implementation: str) -> bool:
    """FlashAttention from its package or a Hub kernel of it (`kernels-community/flash-attn3`,
    `.../vllm-flash-attn3`): attention that takes no padding mask (varlen / unpadded inputs)."""
    kind = attention_kind(implementation)
    return kind == "flash" or (kind == "hub_kernel" and "flash-attn" in implementation.split("/", 1)[1])


# --- the checks: every reason against one option --------------------------------------------------


@dataclass(frozen=True)
class OptionCheck:
    """What `check_attention` found for one attention option on this machine, model and dtype.

    Attributes:
        implementation: The string transformers is given for it: the option itself, or the Hub
            repository that serves a FlashAttention option whose package is not installed.
        detail: What serves it (e.g. "flash-attn 2.8.3 installed"); the reason when it is used.
        blockers: Every reason it cannot run here. An explicit choice with one is refused.
        costs: Every reason it runs but cudaload would not plan it (e.g. flex attention on a CPU). An explicit
            choice with only these is honoured with a warning; the automatic chain passes it over.
    """

    implementation: str
    detail: str
    blockers: tuple[str, ...] = ()
    costs: tuple[str, ...] = ()

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every reason against the option, blockers first."""
        return self.blockers + self.costs


_EAGER = "the reference implementation: works everywhere, slowest"
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
    if kind == "sdpa":
        return _sdpa(model)
    if kind == "flex":
        return _flex(machine, model)
    # eager runs everywhere; another registered name is the caller's own code, which cudaload cannot judge.
    return OptionCheck(option, _EAGER if kind == "eager" else AS_IS)


def _flash_package(machine: Machine, model: ModelFacts, dtype: str, name: str) -> OptionCheck:
    """FlashAttention `name` from its installed package, else from its `kernels-community` Hub
    kernel (what transformers itself falls back to, `FLASH_ATTN_KERNEL_FALLBACK`)."""
    option = FLASH_OPTIONS[name]
    installed = machine.software.version(option.distribution)
    if installed is None:
        return _flash_hub(machine, model, dtype, name, f"{option.distribution} not installed; ")
    blockers = _flash_blockers(machine, model, dtype, name, installed)
    return OptionCheck(name, f"{option.distribution} {installed} installed", blockers)


def _flash_hub(machine: Machine, model: ModelFacts, dtype: str, name: str, prefix: str = "") -> OptionCheck:
    """The Hub kernel of FlashAttention `name`: it must run this model here and be fetchable."""
    repo = FLASH_OPTIONS[name].hub_repo
    blockers = _flash_blockers(machine, model, dtype, name, None)
    usable, detail = _hub_kernel(machine, repo)
    if not usable:
        blockers += (f"{prefix}its Hub kernel is unusable: {detail}",)
    return OptionCheck(repo, f"{prefix}{detail}", blockers)


def _flash_blockers(
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


def _sdpa(model: ModelFacts) -> OptionCheck:
    # The class's own flag is the whole check, softcapping included: transformers' sdpa_attention_forward
    # raises on `softcap` (integrations/sdpa_attention.py, 5.22-5.25), and every class that passes it declares
    # `_supports_sdpa = False` ("sdpa does not support softcapping": gemma2, t5gemma, vaultgemma). A class that
    # supports SDPA with attn_logit_softcapping in its config (Gemma 3) never passes it: eager would not cap either.
    blockers = () if model.supports_sdpa else (f"{model.model_class} does not support SDPA",)
    return OptionCheck("sdpa", "torch SDPA: fused attention on every device", blockers)


def _flex(machine: Machine, model: ModelFacts) -> OptionCheck:
    # transformers raises for a class without `_supports_flex_attn` (`_flex_attn_can_dispatch`).
    blockers = () if model.supports_flex else (f"{model.model_class} does not support flex_attention",)
    # On a CPU flex_attention goes through torch.compile, which cudaload has not verified there: it may
    # run, so your choice is kept, but the automatic chain does not plan it.
    costs = (
        () if machine.weakest_gpu is not None else ("not planned on a CPU: it needs torch.compile there (unverified)",)
    )
    return OptionCheck("flex_attention", "torch flex_attention: fused, applies what SDPA cannot", blockers, costs)
