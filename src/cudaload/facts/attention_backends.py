"""The attention backends transformers knows by name (not FlashAttention, not a Hub kernel): one record each.

A record owns everything cudaload registers for its backend: its check (every reason it cannot serve a model
here), its place in the automatic chain after FlashAttention, the model-class flag that says a class supports
it (read into the model facts by capability/model_config.py) and the modules that only run it (an error raised
inside them is the backend's, so load() falls back: loaders/attribution.py). The policy
(policy/attention_checks.py, attention.py), the capability reader and the loader read this table, so a new
backend is a record here, not an edit in each of them. A check is a pure function of the facts, as a
quantization method's `build` is (facts/quant_methods.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ..frozen import frozen
from .machine import Machine
from .model import ModelFacts

__all__ = ["BACKENDS", "EAGER", "AttentionBackend", "OptionCheck", "class_flags"]


@frozen
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


@frozen
class AttentionBackend:
    """An attention backend transformers knows by name (not FlashAttention, not a Hub kernel).

    Attributes:
        name: Its `attn_implementation` string.
        check: (machine, model, dtype) -> every reason against it here (`OptionCheck`).
        tried: Its place in the automatic chain, after FlashAttention, in the table's order: "always", or
            "if_previous_rejected" (only when the backend tried before it was rejected), or "never" (an
            explicit choice only).
        checked: False when nothing is checked (eager): an explicit choice of it is "passed as is".
        class_flag: The model-class attribute transformers reads to allow it (e.g. "_supports_sdpa"); read from
            the class into `ModelFacts` (`ModelFacts.supports(flag)`). None: every class runs it.
        runtime_modules: Modules that do nothing but run it: any error raised inside one is this backend's, so
            load() tries the next option (loaders/attribution.py).
    """

    name: str
    check: Callable[[Machine, ModelFacts, str], OptionCheck]
    tried: Literal["always", "if_previous_rejected", "never"]
    checked: bool = True
    class_flag: str | None = None
    runtime_modules: tuple[str, ...] = ()


EAGER = "the reference implementation: works everywhere, slowest"


def _sdpa(machine: Machine, model: ModelFacts, dtype: str) -> OptionCheck:
    # The class's own flag is the whole check, softcapping included: transformers' sdpa_attention_forward
    # raises on `softcap` (integrations/sdpa_attention.py, 5.22-5.25), and every class that passes it declares
    # `_supports_sdpa = False` ("sdpa does not support softcapping": gemma2, t5gemma, vaultgemma). A class that
    # supports SDPA with attn_logit_softcapping in its config (Gemma 3) never passes it: eager would not cap either.
    blockers = () if model.supports("_supports_sdpa") else (f"{model.model_class} does not support SDPA",)
    return OptionCheck("sdpa", "torch SDPA: fused attention on every device", blockers)


def _flex(machine: Machine, model: ModelFacts, dtype: str) -> OptionCheck:
    # transformers raises for a class without `_supports_flex_attn` (`_flex_attn_can_dispatch`).
    supported = model.supports("_supports_flex_attn")
    blockers = () if supported else (f"{model.model_class} does not support flex_attention",)
    # On a CPU flex_attention goes through torch.compile, which cudaload has not verified there: it may
    # run, so your choice is kept, but the automatic chain does not plan it.
    costs = (
        () if machine.weakest_gpu is not None else ("not planned on a CPU: it needs torch.compile there (unverified)",)
    )
    return OptionCheck("flex_attention", "torch flex_attention: fused, applies what SDPA cannot", blockers, costs)


def _eager(machine: Machine, model: ModelFacts, dtype: str) -> OptionCheck:
    return OptionCheck("eager", EAGER)  # runs everywhere


BACKENDS: dict[str, AttentionBackend] = {
    b.name: b
    for b in (
        AttentionBackend(
            "sdpa",
            _sdpa,
            "always",
            class_flag="_supports_sdpa",
            runtime_modules=("transformers.integrations.sdpa_attention", "transformers.integrations.sdpa_paged"),
        ),
        # transformers' own advice when a kernel cannot softcap: "Try using `eager` or `flex_attention`".
        AttentionBackend(
            "flex_attention",
            _flex,
            "if_previous_rejected",
            class_flag="_supports_flex_attn",
            runtime_modules=("transformers.integrations.flex_attention", "torch.nn.attention.flex_attention"),
        ),
        AttentionBackend("eager", _eager, "always", checked=False),  # always there: the chain's last link
    )
}
"""The named attention backends, in the order the automatic chain tries them after FlashAttention."""


def class_flags() -> tuple[str, ...]:
    """The model-class flags the backends name, read from BACKENDS at each call (a backend registered later
    counts): what capability/model_config.py reads from a model class."""
    return tuple(dict.fromkeys(b.class_flag for b in BACKENDS.values() if b.class_flag is not None))
