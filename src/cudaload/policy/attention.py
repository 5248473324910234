"""attn_implementation: one check per attention option, and the fallback chain built from them.

FlashAttention by GPU generation (FA3 on sm90, FA4 on sm100, FA2 elsewhere, as vLLM),
from the installed package or else the `kernels-community` Hub kernel, then SDPA, then
eager. Never FlashAttention in fp32, for a model without support, or on a generation
upstream does not build for. Several GPUs: the weakest decides.

How it is built:

- **One check per option** (as vLLM's attention backends each answer `validate_configuration`
  with every reason they cannot be used): `check_attention(option, machine, model, dtype)` returns
  an `OptionCheck` listing *every* reason the option cannot serve, in two kinds. `blockers`: it
  cannot run (wrong GPU generation, fp32 with FlashAttention, head dim too large, package or Hub
  kernel missing, a class without support). `costs`: it runs but cudaload would not plan it (flex
  attention on a CPU, through an unverified torch.compile). The checks behind it (attention_checks.py): `_flash_package`
  / `_flash_hub` (`flash_blockers`, flash_rules.py, holds the FlashAttention rules of docs/decisions.md, in their
  order), `_compatible_entry` (models whose FlashAttention transformers redirects),
  `_hub_repository`, `_sdpa`, `_flex`.
- **Both paths call it**, so they cannot disagree. An explicit choice (`_explicit`) with a blocker
  raises AttentionUnavailableError naming every reason; with costs only it is honoured with a
  warning. The automatic chain keeps an option only when nothing is against it.
- **The automatic chain is a trace** (as huggingface/kernels resolves build variants): one
  `Accepted` or `Rejected` entry per option tried, in order (`_flash_trace`, `_with_consent`,
  `_portable_trace`); `_decision` turns it into the Decision (the first accepted is the choice,
  each rejection shown with its first reason, as explain() has one line per option) and the chain.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import AttentionUnavailableError
from ..facts.machine import Gpu, Machine
from ..facts.model import ModelFacts
from ..frozen import frozen
from ..plans import SUB_MODEL_ATTENTION, Decision, Rejected
from ..upstream_flash import attention_kind
from .attention_checks import AS_IS, BACKENDS, OptionCheck, check_attention, is_checked, is_flash_attention
from .flash_rules import flash_order

__all__ = [
    "Accepted",
    "OptionCheck",
    "TraceEntry",
    "check_attention",
    "decide_attention",
    "decide_sub_model_attention",
    "is_flash_attention",
]


# --- an explicit choice: the check decides, never replaced ----------------------------------------


def _explicit(
    machine: Machine, model: ModelFacts, dtype: str, requested: str, hub_code: bool
) -> tuple[Decision, tuple[str, ...]]:
    """Your `attn_implementation`: refused when anything blocks it (with every reason), else kept,
    with a warning for what it costs."""
    check = check_attention(requested, machine, model, dtype)
    fetched = check.implementation != requested and _consent_needed(machine, check.implementation)
    if not hub_code and fetched and not check.blockers:  # a blocked choice is refused for its blockers already
        # Naming "flash_attention_2" is not consent to Hub code: without the package transformers fetches its
        # kernels-community build (modeling_utils.py `_check_and_adjust_attn_implementation`,
        # FLASH_ATTN_KERNEL_FALLBACK).
        check = replace(check, blockers=(*check.blockers, f"its Hub kernel {check.implementation} is {NO_CONSENT}"))
    if check.blockers:
        raise AttentionUnavailableError(
            f"attn_implementation={requested!r} was asked, but {'; '.join(check.reasons)}. Use another "
            "implementation (e.g. 'sdpa') or leave attn_implementation unset to let cudaload choose."
        )
    costs = "; ".join(check.costs)
    warnings = (
        (f"attn_implementation={requested!r} is used as you asked, but cudaload would not choose it here: {costs}",)
        if costs
        else ()
    )
    # eager and names cudaload does not know have nothing checked: say that they are passed on as they are.
    detail = (costs or check.detail) if is_checked(requested) else AS_IS
    return Decision("attn_implementation", requested, f"your choice ({detail})", source="user"), warnings


# --- the automatic chain: a trace of what was tried -----------------------------------------------


@frozen
class Accepted:
    """A link the automatic chain keeps (the counterpart of `Rejected` in its trace).

    Attributes:
        value: The `attn_implementation` string to pass (e.g. "flash_attention_2", a Hub repo).
        reason: What serves it here.
    """

    value: str
    reason: str


TraceEntry = Accepted | Rejected
"""One option tried by the automatic chain, in the order tried."""


def _judge(option: str, check: OptionCheck) -> TraceEntry:
    # explain() shows one line per rejected option: the first reason, the decisive one in the order of
    # the rules (docs/decisions.md); an explicit choice's error lists them all.
    if check.reasons:
        return Rejected(option, check.reasons[0])
    return Accepted(check.implementation, check.detail)


def _flash_trace(machine: Machine, model: ModelFacts, dtype: str) -> list[TraceEntry]:
    options = flash_order(machine)
    if model.compatible_flash is not None:
        # transformers replaces any other FlashAttention request with one of these: the others are
        # rejected as redirected, and the listed ones tried in the model author's order
        # (modeling_utils.py, `_compatible_flash_implementations`).
        options = (*(o for o in options if o not in model.compatible_flash), *model.compatible_flash)
    return [_judge(option, check_attention(option, machine, model, dtype)) for option in options]


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


def _with_consent(trace: list[TraceEntry], machine: Machine, hub_code: bool) -> list[TraceEntry]:
    """The trace with every Hub kernel that would be fetched rejected, unless Hub code is allowed.
    Consent is not a property of the option (naming a kernel yourself is consent), so it is not a check."""
    if hub_code:
        return trace
    fetched = [e for e in trace if isinstance(e, Accepted) and _consent_needed(machine, e.value)]
    return [e for e in trace if e not in fetched] + [Rejected(e.value, NO_CONSENT) for e in fetched]


def _portable_trace(machine: Machine, model: ModelFacts, dtype: str) -> list[TraceEntry]:
    """The named backends in their table's order (facts/attention_backends.py: BACKENDS): SDPA, flex_attention when SDPA
    is out, and eager, which is always there."""
    trace: list[TraceEntry] = []
    for backend in BACKENDS.values():
        previous_rejected = bool(trace) and isinstance(trace[-1], Rejected)
        if backend.tried == "always" or (backend.tried == "if_previous_rejected" and previous_rejected):
            trace.append(_judge(backend.name, check_attention(backend.name, machine, model, dtype)))
    return trace


def _decision(trace: list[TraceEntry], gpu: Gpu | None) -> tuple[Decision, tuple[str, ...]]:
    """The Decision (the first accepted link is the choice) and the chain (every accepted link).
    Links kept but not chosen are fallbacks, not rejections."""
    accepted = [e for e in trace if isinstance(e, Accepted)]
    rejected = tuple(e for e in trace if isinstance(e, Rejected))
    choice = accepted[0]  # eager is never rejected
    reason = choice.reason
    if attention_kind(choice.value) in ("flash", "hub_kernel"):
        where = f"{gpu.name} ({gpu.sm})" if gpu else ""
        reason = f"fastest supported on {where}: {choice.reason}"
    return Decision("attn_implementation", choice.value, reason, rejected), tuple(e.value for e in accepted)


# transformers returns attention weights from eager alone: PretrainedConfig.output_attentions' setter and
# `validate_output_attentions` (5.22-5.25 configuration_utils.py) raise for any other attn_implementation.
OUTPUT_ATTENTIONS = "output_attentions=True: transformers returns attention weights only from eager"


def decide_attention(
    machine: Machine,
    model: ModelFacts,
    dtype: str,
    requested: str | None,
    hub_code: bool = False,
    output_attentions: bool = False,
) -> tuple[Decision, tuple[str, ...], tuple[str, ...]]:
    """The attention decision, its fallback chain (the first link is the choice) and warnings
    (what an explicit choice costs; the automatic chain passes such options over instead).
    `output_attentions` (from_pretrained's, passed through) leaves eager alone: no other returns the weights.

    Hub code runs only with consent: a Hub kernel is planned when it is already cached (it was
    fetched before) or `hub_code` is True (hub_kernels=True or use_kernels=True), as `use_kernels`
    itself is opt-in. Naming a Hub kernel as `attn_implementation` is consent for that kernel.
    """
    if output_attentions and requested not in (None, "eager"):
        raise AttentionUnavailableError(
            f"attn_implementation={requested!r} was asked with output_attentions=True, but transformers returns "
            "attention weights only from 'eager' (configuration_utils.py: PretrainedConfig.output_attentions). "
            "Pass attn_implementation='eager', or drop output_attentions."
        )
    if requested is not None:
        decision, warnings = _explicit(machine, model, dtype, requested, hub_code)
        return decision, (requested,), warnings
    if output_attentions:
        automatic, _, _ = decide_attention(machine, model, dtype, None, hub_code)
        rejected = (Rejected(automatic.value, OUTPUT_ATTENTIONS),) if automatic.value != "eager" else ()
        return Decision("attn_implementation", "eager", OUTPUT_ATTENTIONS, rejected), ("eager",), ()
    trace = _with_consent(_flash_trace(machine, model, dtype), machine, hub_code)
    decision, chain = _decision(trace + _portable_trace(machine, model, dtype), machine.weakest_gpu)
    return decision, chain, ()


def decide_sub_model_attention(model: ModelFacts, attention: Decision) -> Decision | None:
    """Attention per sub-model, where one whole-model value does not serve every part: the top class has no SDPA
    (so the plan is eager) while a sub-model's class has (GOT-OCR2's Qwen2 language model), or the plan is SDPA
    and a sub-model's class has none (musicgen's EnCodec audio encoder: transformers raises "does not support an
    attention implementation through torch.nn.functional.scaled_dot_product_attention" for it). Bare
    from_pretrained gives each sub-model its own default, SDPA where its class supports it (transformers
    5.22/5.25 modeling_utils.py: `PreTrainedModel._check_and_adjust_attn_implementation` per sub-model), and
    takes a dict by sub-config name (`PreTrainedConfig._attn_implementation`'s setter, the "" key for the top):
    the plan passes that. None when one value serves every part, or you chose it."""
    if attention.source == "user":
        return None
    parts = model.sub_model_sdpa
    value = ", ".join(f"{key}={'sdpa' if sdpa else 'eager'}" for key, sdpa in parts)
    if attention.value == "eager" and not model.supports_sdpa and any(sdpa for _, sdpa in parts):
        with_sdpa = ", ".join(key for key, sdpa in parts if sdpa)
        reason = (
            f"{model.model_class} has no SDPA, its {with_sdpa} model has: each part gets what it supports, as bare "
            "from_pretrained gives it (attn_implementation by sub-config)"
        )
        return Decision(SUB_MODEL_ATTENTION, value, reason)
    if attention.value == "sdpa" and not all(sdpa for _, sdpa in parts):
        without = ", ".join(key for key, sdpa in parts if not sdpa)
        reason = (
            f"its {without} model has no SDPA (transformers refuses sdpa for it): that part runs eager, the rest "
            "sdpa, as bare from_pretrained gives it (attn_implementation by sub-config)"
        )
        return Decision(SUB_MODEL_ATTENTION, value, reason)
    return None
