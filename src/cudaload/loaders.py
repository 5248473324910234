"""`load()`: apply a Plan through `from_pretrained`, fall back along its attention chain,
verify with a short forward, and record what was applied. Loaders never decide."""

from __future__ import annotations

import os
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import CudaloadError, CudaloadWarning, LoadFailedError, ModelConfigError, SettingError, describe_error
from .plans import Decision, Plan, Rejected

if TYPE_CHECKING:
    from .generation import GenerationPlan

__all__ = ["AppliedPlan", "Fallback", "load"]


@dataclass(frozen=True)
class Fallback:
    """An attention option that failed while loading, and why (`AppliedPlan.fallbacks`).

    `load()` records one for each link of the plan's attention chain it had to leave before one
    worked; `explain()` shows them as "fell back from ...".

    Attributes:
        option: The attention implementation that failed (e.g. "flash_attention_2").
        phase: Where it failed: "load" (from_pretrained raised), "verify" (the test forward
            raised or gave non-finite logits) or "switch" (set_attn_implementation refused it on
            the loaded model).
        error: The error, as "ExceptionType: first line of its message".

    Examples:
        >>> import cudaload
        >>> fallback = cudaload.Fallback("flash_attention_2", "load", "ImportError: flash_attn is not installed")
        >>> fallback.phase
        'load'
    """

    option: str
    phase: str
    """"load" (from_pretrained raised), "verify" (the test forward raised or gave non-finite
    logits) or "switch" (set_attn_implementation refused it on the loaded model)."""
    error: str


@dataclass(frozen=True)
class AppliedPlan:
    """What `load()` actually applied, read back from the loaded model (`model.cudaload_plan`).

    Attributes:
        plan: The plan as applied: its kwargs carry the attention implementation that worked, and
            a failed link appears among the attention decision's rejections.
        attn_implementation: The attention implementation the loaded model uses.
        dtype: The dtype of the model's first floating parameter (e.g. "bfloat16").
        device: The model's device as torch reports it (e.g. "cpu", "cuda:0").
        device_map: accelerate's `hf_device_map` when the model was dispatched; None otherwise.
        fallbacks: The attention options that failed before this one, in order.
        offloaded: Modules `device_map="auto"` put on CPU or disk, as "module -> place".
        verified: True: a test forward gave finite logits; None: not run (verify=False, or the
            model takes no token ids or returns no logits).
        timings: Seconds per step: "plan", "probe" (when the CPU dtype probe ran), "load",
            "load[option]" for a failed option, "verify".
        warnings: The plan's warnings and any offload warning, each issued as a CudaloadWarning.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> applied = cudaload.load(path, dtype="float32", attn_implementation="sdpa").cudaload_plan
        >>> applied.attn_implementation, applied.dtype, applied.verified, applied.fallbacks
        ('sdpa', 'float32', True, ())
        >>> "applied:" in applied.explain()
        True
    """

    plan: Plan
    """The plan as applied: its kwargs carry the attention implementation that worked."""
    attn_implementation: str
    dtype: str
    device: str
    device_map: Mapping[str, Any] | None
    fallbacks: tuple[Fallback, ...] = ()
    offloaded: tuple[str, ...] = ()
    """Modules `device_map="auto"` put on CPU or disk."""
    verified: bool | None = None
    """True: a test forward gave finite logits; None: not run (verify=False or no text input)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def generation(self) -> GenerationPlan | None:
        """The generation settings as applied: decided again with the attention and dtype the loaded
        model really has (a fallback can change them). None for models that do not generate."""
        return self.plan.generation

    def explain(self) -> str:
        """The plan's explanation, then what was applied: fallbacks, offloading, verification, timings."""
        lines = [self.plan.explain(), "applied:"]
        lines.append(f"  attn_implementation={self.attn_implementation} dtype={self.dtype} device={self.device}")
        for fb in self.fallbacks:
            lines.append(f"  fell back from {fb.option} ({fb.phase}): {fb.error}")
        if self.offloaded:
            lines.append(f"  offloaded to CPU/disk: {', '.join(self.offloaded)}")
        lines.append(
            "  verified: " + {True: "test forward gave finite logits", None: "not run"}.get(self.verified, "failed")
        )
        lines.append("  timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "attn_implementation": self.attn_implementation,
            "dtype": self.dtype,
            "device": self.device,
            "device_map": dict(self.device_map) if self.device_map else None,
            "fallbacks": [vars(f) for f in self.fallbacks],
            "offloaded": list(self.offloaded),
            "verified": self.verified,
            "timings": dict(self.timings),
            "warnings": list(self.warnings),
        }


# Where transformers chooses, checks, loads or runs an attention implementation (5.22-5.25):
# modeling_utils.py `PreTrainedModel._check_and_adjust_attn_implementation`,
# `get_correct_attn_implementation`, `_flash_attn_can_dispatch`, `_sdpa_can_dispatch`,
# `_flex_attn_can_dispatch`, `set_attn_implementation`; integrations/hub_kernels.py
# `load_and_register_attn_kernel`, `lazy_load_kernel`; and `AttentionInterface` lookups of an
# unregistered name (utils/generic.py `GeneralInterface.__getitem__`).
_ATTENTION_FUNCTIONS = frozenset(
    {
        "_check_and_adjust_attn_implementation",
        "get_correct_attn_implementation",
        "_flash_attn_can_dispatch",
        "_sdpa_can_dispatch",
        "_flex_attn_can_dispatch",
        "set_attn_implementation",
        "load_and_register_attn_kernel",
        "lazy_load_kernel",
    }
)
# Modules that run one: the FlashAttention packages, Hub kernels, transformers' attention integrations.
_ATTENTION_MODULES = (
    "flash_attn",
    "flash_attn_interface",
    "kernels",
    "transformers.integrations.flash_attention",
    "transformers.integrations.sdpa_attention",
    "transformers.integrations.flex_attention",
    "transformers.integrations.hub_kernels",
    "transformers.modeling_flash_attention_utils",
)


def _errors(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _attention_related(exc: BaseException) -> bool:
    """Was `exc` raised while transformers chose, checked, loaded or ran the attention option?

    Judged by where it was raised (the traceback's frames), not by its text: an error naming a
    path with "flash" in it, or bitsandbytes' "no kernel image is available", is not attention's.
    """
    for error in _errors(exc):
        for frame, _ in traceback.walk_tb(error.__traceback__):
            module = str(frame.f_globals.get("__name__", ""))
            if module.startswith("transformers") and frame.f_code.co_name in _ATTENTION_FUNCTIONS:
                return True
            if any(module == m or module.startswith(f"{m}.") for m in _ATTENTION_MODULES):
                return True
            if type(frame.f_locals.get("self")).__name__ == "AttentionInterface":
                return True
    return False


def _load_error(model: str, exc: BaseException) -> LoadFailedError:
    """A from_pretrained failure that no attention fallback can fix, named by its likely cause."""
    text = str(exc)
    kind = type(exc).__name__
    if (
        "size mismatch" in text
        or "mismatched_sizes" in text
        or ("shape" in text.lower() and "mismatch" in text.lower())
    ):
        hint = "the checkpoint's tensor shapes disagree with its config.json: the files belong to different models"
    elif kind == "SafetensorError" or "header" in text.lower() or "incomplete" in text.lower():
        hint = "the weights file is truncated or corrupt: download or save it again"
    elif isinstance(exc, ImportError):
        hint = "the checkpoint needs a package that is not installed (see the message): install it"
    elif isinstance(exc, OSError):
        hint = "a file the model needs is missing or unreadable (a config.json without weights?): check the folder"
    else:
        hint = "see the cause above"
    return LoadFailedError(f"Loading {model} failed: {describe_error(exc)}. Likely cause: {hint}.")


def input_device(model: Any) -> Any:
    """Where inputs go: the first device of a dispatched model (accelerate's hooks move the
    rest; "cpu"/"disk" entries mean CPU), else the model's device."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        first = next(iter(device_map.values()))
        if isinstance(first, int):
            return f"cuda:{first}"
        return "cpu" if str(first) in ("cpu", "disk") else str(first)
    return model.device


NON_FINITE = "the test forward gave non-finite logits"
_PASSED = ("passed", None)
_SKIPPED = ("skipped", None)


def _verify(model: Any, training: bool) -> tuple[str, BaseException | None]:
    """A short forward: _PASSED when the logits are finite, _SKIPPED when the model takes no
    token ids or returns no logits, else (the problem, the exception or None).

    For a model about to be trained the forward runs in train mode under no_grad: an
    eval-mode inference forward lets bitsandbytes (0.50, AVX512-BF16 CPUs) repack 4-bit
    weights into an inference-only layout with no backward, after which no gradient flows
    through the base layers (found here: layer-0 LoRA gradients were all zero).
    """
    import torch

    vocab = int(getattr(model.config.get_text_config(), "vocab_size", 0) or 0)
    if vocab < 8:
        return _SKIPPED
    ids = (torch.arange(1, 9).unsqueeze(0) % vocab).to(input_device(model))
    model.train(training)
    try:
        with torch.no_grad() if training else torch.inference_mode():
            out = model(input_ids=ids)
    except Exception as exc:  # any failure in the forward is a verification failure
        return describe_error(exc), exc
    logits = getattr(out, "logits", None)
    if logits is None:
        return _SKIPPED
    if not torch.isfinite(logits).all():
        return NON_FINITE, None
    return _PASSED


def _offloaded(device_map: Mapping[str, Any] | None, has_gpu: bool) -> tuple[str, ...]:
    """Modules placed off the fast device: "disk" always, "cpu" when a GPU was available."""
    if not device_map:
        return ()
    slow = {"disk", "cpu"} if has_gpu else {"disk"}
    return tuple(f"{name or '(whole model)'} -> {where}" for name, where in device_map.items() if str(where) in slow)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, CudaloadWarning, stacklevel=4)  # the caller of load()


def _from_pretrained(auto: Any, plan: Plan) -> Any:
    return auto.from_pretrained(plan.model, **plan.from_pretrained_kwargs())


def _as_applied(plan: Plan, chain: list[str], fallbacks: list[Fallback]) -> Plan:
    """The plan as applied: the attention that worked, with the failed links among its rejections."""
    if not fallbacks:
        return plan
    planned = plan.decision("attn_implementation")
    applied = Decision(
        "attn_implementation",
        chain[0],
        f"fell back to it: {', '.join(f.option for f in fallbacks)} failed (see applied)",
        (*(Rejected(f.option, f"failed at {f.phase}: {f.error}") for f in fallbacks), *planned.rejected),
        planned.source,
    )
    decisions = tuple(applied if d is planned else d for d in plan.decisions)
    return replace(plan.with_attention(chain[0]), attention_chain=tuple(chain), decisions=decisions)


def _switch_attention(model: Any, chain: list[str], index: int, fallbacks: list[Fallback]) -> int:
    """Switch the loaded model in place to chain[index] (no weights are read again); an option
    that cannot even be set is recorded and skipped. Returns the index now in use."""
    while True:
        try:
            model.set_attn_implementation(chain[index])
            return index
        except Exception as exc:
            if index == len(chain) - 1 or not _attention_related(exc):
                raise LoadFailedError(
                    f"Could not switch to attn_implementation={chain[index]!r} after the others failed: "
                    f"{describe_error(exc)}. Tried: {', '.join(f.option for f in fallbacks)}."
                ) from exc
            fallbacks.append(Fallback(chain[index], "switch", describe_error(exc)))
            index += 1


def _applied_generation(planned: GenerationPlan, model: Any, attention: str) -> GenerationPlan:
    """The generation decisions again, with the attention and dtype the loaded model has."""
    from .facts.dtypes import BYTES
    from .policy.generation import decide_generation

    inputs = dict(planned.inputs)
    machine = inputs.pop("machine")
    dtype = str(model.dtype).removeprefix("torch.")
    return decide_generation(
        machine, planned.facts, dtype=dtype if dtype in BYTES else planned.dtype, attention=attention, **inputs
    )


def apply_plan(plan: Plan, *, strict: bool, verify: bool, training: bool = False) -> Any:
    """Load `plan.model` through `plan.auto_class`, falling back along `plan.attention_chain`."""
    from .model_facts import resolve_auto_class

    auto = resolve_auto_class(plan.auto_class)
    fallbacks: list[Fallback] = []
    timings: dict[str, float] = dict(plan.timings)  # "probe" when planning measured this CPU
    can_fall_back = not strict and "attn_implementation" not in plan.explicit
    chain = list(plan.attention_chain)

    def give_up(option: str, phase: str, cause: str) -> LoadFailedError:
        tried = "".join(f"\n  {f.option} ({f.phase}): {f.error}" for f in fallbacks)
        if cause == NON_FINITE and len(fallbacks) + 1 == len(chain) and all(f.error == NON_FINITE for f in fallbacks):
            # Every attention option, eager included, gave NaN/inf: attention is not the problem.
            return LoadFailedError(
                f"{plan.model} loaded, but every attention option ({', '.join(chain)}) gave non-finite logits in "
                f"{plan.dtype}: the weights or the dtype are the problem, not attention. Check the checkpoint for "
                "NaN/inf weights; with float16, try dtype='bfloat16' (sm80+) or 'float32' (fp16 overflow)."
            )
        why = "strict=True" if strict else "you chose it" if not can_fall_back else "no option left in the chain"
        return LoadFailedError(
            f"Loading {plan.model} with attn_implementation={option!r} failed at {phase}: {cause.rstrip('.')}. "
            f"Not falling back ({why}).{' Tried:' + tried if tried else ''} "
            "Pass another attn_implementation, or leave it unset (and strict=False) to let cudaload fall back."
        )

    model = None
    index = 0
    while model is None:
        option = chain[index]
        start = time.perf_counter()
        try:
            model = _from_pretrained(auto, plan.with_attention(option))
        except Exception as exc:
            timings[f"load[{option}]"] = time.perf_counter() - start
            last = index == len(chain) - 1
            if isinstance(exc, CudaloadError):
                raise
            if not _attention_related(exc):
                raise _load_error(plan.model, exc) from exc
            if not can_fall_back or last:
                raise give_up(option, "load", describe_error(exc)) from exc
            fallbacks.append(Fallback(option, "load", describe_error(exc)))
            index += 1
            continue
        timings["load"] = time.perf_counter() - start

    verified: bool | None = None
    if verify:
        start = time.perf_counter()
        while True:
            option = chain[index]
            outcome = _verify(model, training)
            if outcome in (_PASSED, _SKIPPED):
                verified = True if outcome is _PASSED else None
                break
            problem, error = outcome
            if error is not None and not _attention_related(error):
                raise LoadFailedError(
                    f"{plan.model} loaded, but a test forward failed for a reason unrelated to attention: "
                    f"{problem}. Check the placement (device_map/max_memory) and dtype, or pass verify=False "
                    "to skip the check."
                ) from error
            if not can_fall_back or index == len(chain) - 1:
                raise give_up(option, "verify", problem)
            fallbacks.append(Fallback(option, "verify", problem))
            index = _switch_attention(model, chain, index + 1, fallbacks)
        timings["verify"] = time.perf_counter() - start

    applied_plan = _as_applied(plan, chain[index:], fallbacks)
    if plan.generation is not None:
        applied_plan = replace(
            applied_plan, generation=_applied_generation(plan.generation, model, applied_plan.attn_implementation)
        )
    device_map = getattr(model, "hf_device_map", None)
    offloaded = _offloaded(device_map, has_gpu=any(isinstance(v, int) for v in (device_map or {}).values()))
    notes = list(plan.warnings)
    if offloaded:
        from .policy.placement import offload_warning

        notes.append(offload_warning(plan.model, offloaded))
    for note in notes:
        _warn_once(note)
    applied = AppliedPlan(
        plan=applied_plan,
        attn_implementation=str(model.config._attn_implementation),
        dtype=str(model.dtype).removeprefix("torch."),  # transformers: the first floating parameter's
        device=str(model.device),
        device_map=dict(device_map) if device_map else None,
        fallbacks=tuple(fallbacks),
        offloaded=offloaded,
        verified=verified,
        timings=timings,
        warnings=tuple(notes),
    )
    model.cudaload_plan = applied
    return model


def load(
    model: Any,
    *,
    strict: bool = False,
    verify: bool = True,
    machine: Any = None,
    model_class: str | None = None,
    **overrides: Any,
) -> Any:
    """Load `model` (a local path, a hub id, or a ready `Plan`) with the plan for this machine.

    - `overrides` are from_pretrained kwargs: yours always win; an impossible one raises.
    - If an attention option fails at load or at a short test forward, the next link of the
      plan's chain is used and the cause recorded; `strict=True` raises instead. Only an
      attention implementation you left to cudaload falls back.
    - `model.cudaload_plan` is the AppliedPlan: what was asked, chosen, and really applied.
      For a generating model (a causal or seq2seq LM) it has `.generation` (see `plan()`'s
      `generate=`): pass `generate=True, context=N, cache_implementation=..., padding_side=...` to
      choose, or `generate=False` to skip.

    Each plan warning (and an offload to CPU/disk) is issued once as a `CudaloadWarning`.

    Args:
        model: A local path (str or PathLike), a Hub id, or a `Plan` from `plan()` (then loaded
            as planned: `machine` is not used and no overrides are accepted).
        strict: Raise instead of falling back along the attention chain (default False).
        verify: Run a short test forward (8 token ids) and check its logits are finite (default
            True); False skips it (`AppliedPlan.verified` is then None).
        machine: The `Machine` to plan for (default None: `detect()` this one, and measure the
            CPU dtype when planning for its CPU). A simulated machine is planned as given.
        model_class: The transformers Auto class to load with (default "AutoModelForCausalLM";
            e.g. "AutoModel", "AutoModelForSequenceClassification"). A Plan loads through the
            Auto class it was planned with (`Plan.auto_class`); naming another one is an error.
        **overrides: from_pretrained keyword arguments (`dtype`, `attn_implementation`,
            `device_map`, `max_memory`, `use_kernels`, `revision`, `trust_remote_code`, ...) and
            `plan()` keyword arguments (`workload`, `probe`, `hub_kernels`, `generate`, `context`,
            `cache_implementation`, `padding_side`, ...). Yours always win.

    Returns:
        The loaded transformers model (in eval mode), with `model.cudaload_plan` set to the
        `AppliedPlan`.

    Raises:
        ModelConfigError: `model` is not a path, Hub id or Plan, its config cannot be read, or
            `model_class` is not a transformers Auto class that supports it.
        RemoteCodeError: the model needs `trust_remote_code=True` and it was not given.
        LoadFailedError: loading failed for a reason no fallback can fix (the message
            names the likely cause); the test forward failed for a reason unrelated to attention;
            or an attention option failed with nothing to fall back to (you chose it,
            `strict=True`, or the chain ran out).
        SettingError: an override of the wrong type or an impossible generation setting
            (`WorkloadError` for an unknown `workload`); a Plan given with overrides, a `machine`,
            or a `model_class` other than the one it was planned with.
        DtypeUnsupportedError: a `dtype` this machine cannot run.
        AttentionUnavailableError: an `attn_implementation` this machine or model cannot run.
        PlacementError: a `device_map`/`max_memory` that cannot work here, or invalid launch variables.
        MissingPackageError: `use_kernels=True` without an accepted `kernels` package.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> model = cudaload.load(path, dtype="float32")
        >>> type(model).__name__, model.cudaload_plan.dtype, model.cudaload_plan.verified
        ('Qwen3ForCausalLM', 'float32', True)
        >>> model.cudaload_plan.generation.padding_side  # a decoder-only LM pads batches on the left
        'left'
    """
    start = time.perf_counter()
    if not isinstance(model, (str, os.PathLike, Plan)):
        raise ModelConfigError(
            f"load() takes a local path, a Hub id or a Plan, not {type(model).__name__}. To plan from a "
            "config object use cudaload.plan(config); to load, save the model and pass its folder."
        )
    if isinstance(model, Plan):
        given = [
            *([f"model_class={model_class!r}"] if model_class not in (None, model.auto_class) else []),
            *(["machine"] if machine is not None else []),
            *overrides,
        ]
        if given:
            raise SettingError(
                f"load(plan) was given {', '.join(given)}: a Plan is loaded as planned "
                f"(for {model.machine}, through {model.auto_class}). Build the plan with them instead: "
                "cudaload.plan(model, ...)."
            )
        the_plan = model
    else:
        from .planner import plan

        auto_class = model_class or "AutoModelForCausalLM"
        if "generate" not in overrides and any(k in auto_class for k in ("CausalLM", "Seq2SeqLM")):
            overrides["generate"] = None  # plan generation when the config allows it
        the_plan = plan(str(model), machine=machine, model_class=auto_class, **overrides)
    planned = time.perf_counter() - start
    loaded = apply_plan(the_plan, strict=strict, verify=verify)
    applied: AppliedPlan = loaded.cudaload_plan
    loaded.cudaload_plan = replace(applied, timings={"plan": planned, **applied.timings})
    return loaded
