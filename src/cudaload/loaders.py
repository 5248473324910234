"""`load()`: apply a Plan through `from_pretrained`, fall back along its attention chain,
verify with a short forward, and record what was applied. Loaders never decide."""

from __future__ import annotations

import logging
import os
import re
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast

from .errors import CudaloadError, CudaloadWarning, LoadFailedError, ModelConfigError, SettingError, describe_error
from .facts.quant_methods import DEFAULT_CONFIG_CLASS, config_method
from .plans import Decision, Plan, Rejected, mutable
from .upstream import FLASH_OPTIONS, attention_kind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .facts.machine import Machine
    from .plans import GenerationPlan

__all__ = ["AppliedPlan", "Fallback", "from_pretrained_kwargs", "load", "set_rank_device"]

logger = logging.getLogger(__name__)
"""Under the "cudaload" logger (silent unless you configure logging): one INFO line per load, a WARNING per fallback."""


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
        missing_weights: Weights the checkpoint lacked (or held in another shape), initialized at
            random; only ever non-empty with `allow_missing_weights=True` (else loading raises).
        unexpected_weights: Checkpoint weights the loaded class has no place for (e.g. a head when
            loading a base model); with the checkpoint's own class, loading raises instead.
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
    missing_weights: tuple[str, ...] = ()
    """Weights the checkpoint lacked, initialized at random (only with allow_missing_weights=True)."""
    unexpected_weights: tuple[str, ...] = ()
    """Checkpoint weights the model did not use (e.g. a head, when loaded as a base model)."""
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
        if self.missing_weights:
            lines.append(f"  initialized at random (not in the checkpoint): {_listed(self.missing_weights)}")
        if self.unexpected_weights:
            lines.append(f"  checkpoint weights not used: {_listed(self.unexpected_weights)}")
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
            "missing_weights": list(self.missing_weights),
            "unexpected_weights": list(self.unexpected_weights),
            "timings": dict(self.timings),
            "warnings": list(self.warnings),
        }


# Where transformers (5.22-5.25) refuses an attention option it cannot use, by module: it checks,
# resolves or loads the option there and raises only ImportError (flash_attn/kernels missing or too
# old, no supported device, compute capability too low; flex unavailable), ValueError (the model
# class does not support it, FlashAttention without a GPU, a name nobody registered, a Hub kernel
# that failed to load: load_and_register_attn_kernel wraps any error as one) or KeyError
# (AttentionInterface.get_interface at the first forward: not registered).
_DISPATCH_FUNCTIONS: Mapping[str, frozenset[str]] = {
    "transformers.modeling_utils": frozenset(
        {
            "_check_and_adjust_attn_implementation",
            "get_correct_attn_implementation",
            "_flash_attn_can_dispatch",
            "_flash_attn_import_error",
            "_sdpa_can_dispatch",
            "_flex_attn_can_dispatch",
            "set_attn_implementation",
            "get_interface",
        }
    ),
    "transformers.modeling_flash_attention_utils": frozenset({"lazy_import_flash_attention"}),
    "transformers.integrations.hub_kernels": frozenset({"load_and_register_attn_kernel"}),
}
_DISPATCH_ERRORS = (ImportError, ValueError, KeyError)

# Code that does nothing but run one kind of option (upstream.attention_kind): an error
# raised inside it is that option's whatever its type, e.g. flash_attn's "no kernel image is
# available" on a GPU it was not built for. Not the `kernels` package as a whole: it also loads
# `use_kernels` layers and quantization kernels (hub_kernels.lazy_load_kernel); an attention Hub
# kernel is fetched through load_and_register_attn_kernel above and runs through transformers'
# flash-attention wrappers.
_FLASH_WRAPPERS = (
    "transformers.integrations.flash_attention",
    "transformers.integrations.flash_paged",
    "transformers.modeling_flash_attention_utils",
)
_RUNTIME_MODULES: Mapping[str, tuple[str, ...]] = {
    "flash": (*_FLASH_WRAPPERS, *sorted({option.module for option in FLASH_OPTIONS.values()})),
    "hub_kernel": (*_FLASH_WRAPPERS, "transformers.integrations.msa_attention"),
    "sdpa": ("transformers.integrations.sdpa_attention", "transformers.integrations.sdpa_paged"),
    "flex": ("transformers.integrations.flex_attention", "torch.nn.attention.flex_attention"),
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then the exceptions it was raised from or while handling, as Python prints them
    (a `raise ... from None` ends the chain)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def _is_attention_failure(exc: BaseException, option: str) -> bool:
    """Whether `exc` is the attention option's failure, so that the next option may succeed.

    Judged by the exception's type and where it was raised (its traceback's frames), never by its
    text: a weights file under a folder called "flash_attention..." or bitsandbytes' "no kernel
    image is available" is not attention's, and another option would only read the weights again.
    It is attention's when, in `exc` or an exception it was raised from or while handling:

    - an ImportError, ValueError or KeyError was raised inside the functions with which
      transformers checks, resolves or loads an attention implementation (`_DISPATCH_FUNCTIONS`:
      modeling_utils.py `_check_and_adjust_attn_implementation`, `get_correct_attn_implementation`,
      `_flash_attn_can_dispatch`, `_flash_attn_import_error`, `_sdpa_can_dispatch`,
      `_flex_attn_can_dispatch`, `set_attn_implementation`, `AttentionInterface.get_interface`;
      modeling_flash_attention_utils.py `lazy_import_flash_attention`; integrations/hub_kernels.py
      `load_and_register_attn_kernel`), the types they refuse an option with; or
    - any error was raised inside code that only runs this kind of option (`_RUNTIME_MODULES`: the
      FlashAttention packages and transformers' flash, SDPA or flex wrappers), except running out
      of memory: the fix for that is placement, and eager attention needs more memory, not less.

    Args:
        exc: What `from_pretrained`, `set_attn_implementation` or the test forward raised.
        option: The `attn_implementation` being tried (e.g. "flash_attention_2", "sdpa").

    Returns:
        True when another attention option may succeed where this one failed.
    """
    runtime = _RUNTIME_MODULES.get(attention_kind(option), ())
    for error in _chain(exc):
        if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":  # torch's is a RuntimeError
            continue
        refusal = isinstance(error, _DISPATCH_ERRORS)
        for frame, _ in traceback.walk_tb(error.__traceback__):
            module = str(frame.f_globals.get("__name__", ""))
            if refusal and frame.f_code.co_name in _DISPATCH_FUNCTIONS.get(module, ()):
                return True
            if _in(module, runtime):
                return True
    return False


def _load_error(plan: Plan, exc: BaseException) -> LoadFailedError:
    """A from_pretrained failure that no attention fallback can fix, named by its likely cause; when the
    cause is not one cudaload knows, what was passed and how to see transformers' own account of it."""
    model = plan.model
    text = str(exc)
    kind = type(exc).__name__
    if "Torch not compiled with CUDA enabled" in text:  # torch 2.13 torch/cuda/__init__.py:522, a CPU build
        hint = (
            f"the plan places weights on a GPU (device_map={plan.kwargs.get('device_map')!r}) and torch here "
            "cannot use CUDA (a CPU build of torch)"
        )
    elif (
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
        passed = ", ".join(f"{k}={_short(v)}" for k, v in plan.kwargs.items())
        hint = (
            f"not one cudaload recognises. from_pretrained was called with {passed}: check those settings against "
            "the model, and read transformers' own traceback chained to this error (or call from_pretrained "
            "yourself with cudaload.from_pretrained_kwargs(plan))"
        )
    # A plan made for another machine fails in ways only that can explain (CUDA missing, an unknown error);
    # a missing or corrupt file is the file's fault wherever the plan was made.
    known_file_cause = hint.startswith(("the checkpoint", "the weights", "a file"))
    return LoadFailedError(
        f"Loading {model} failed: {describe_error(exc)}. Likely cause: {hint}."
        + ("" if known_file_cause else _elsewhere(plan))
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _elsewhere(plan: Plan) -> str:
    """ " This plan was made for <machine> ..." when the plan was made for another machine than this one (a
    simulated GPU, or another host): said only on the error path, where detecting this machine costs nothing
    that matters."""
    from .planner import planned_elsewhere

    here = planned_elsewhere(plan)
    if here is None:
        return ""
    return (
        f" This plan was made for {plan.machine}, and this process runs on {here}: plan it here "
        "(cudaload.load(model) or cudaload.plan(model) without machine=) to load on this machine."
    )


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

_Phase = Literal["load", "verify", "switch"]


@dataclass(frozen=True)
class _Failure:
    """One attention option's failed attempt: the phase (as in `Fallback.phase`), the problem in one
    line, and what was raised (None when nothing was: non-finite logits)."""

    phase: _Phase
    problem: str
    error: BaseException | None = None


@dataclass(frozen=True)
class _Verification:
    """What the test forward found: "passed" (finite logits), "skipped" (the model takes no token
    ids or returns no logits) or "failed" (`problem`; `error` is what it raised, None for
    non-finite logits)."""

    status: Literal["passed", "skipped", "failed"]
    problem: str = ""
    error: BaseException | None = None

    @property
    def verified(self) -> bool | None:
        """`AppliedPlan.verified`: True when passed, None when skipped, False when failed."""
        return {"passed": True, "skipped": None}.get(self.status, False)

    @property
    def failure(self) -> _Failure | None:
        """The failure to attribute when the forward failed (phase "verify"), else None."""
        return _Failure("verify", self.problem, self.error) if self.status == "failed" else None


_PASSED = _Verification("passed")
_SKIPPED = _Verification("skipped")


def _verify(model: Any, training: bool) -> _Verification:
    """A short forward of 8 token ids, and whether its logits are finite.

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
        return _Verification("failed", describe_error(exc), exc)
    logits = getattr(out, "logits", None)
    if logits is None:
        return _SKIPPED
    if not torch.isfinite(logits).all():
        return _Verification("failed", NON_FINITE)
    return _PASSED


def _offloaded(device_map: Mapping[str, Any] | None, has_gpu: bool) -> tuple[str, ...]:
    """Modules placed off the fast device: "disk" always, "cpu" when a GPU was available."""
    if not device_map:
        return ()
    slow = {"disk", "cpu"} if has_gpu else {"disk"}
    return tuple(f"{name or '(whole model)'} -> {where}" for name, where in device_map.items() if str(where) in slow)


def _offload_warning(model: str, offloaded: tuple[str, ...]) -> str:
    """What to say when from_pretrained's device_map put modules on the CPU or disk (known only after
    loading, from the model's `hf_device_map`)."""
    shown = ", ".join(offloaded[:4]) + (", ..." if len(offloaded) > 4 else "")
    return (
        f"{model}: device_map offloaded {len(offloaded)} module(s) ({shown}): every forward copies those weights "
        "back (from disk or CPU), which is many times slower. Quantize (4-bit), add GPU memory, or pick a smaller "
        "model."
    )


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, CudaloadWarning, stacklevel=4)  # the caller of load()


def _as_applied(plan: Plan, chain: tuple[str, ...], fallbacks: list[Fallback]) -> Plan:
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
    return replace(plan.with_attention(chain[0]), attention_chain=chain, decisions=decisions)


def from_pretrained_kwargs(plan: Plan) -> dict[str, Any]:
    """The plan's from_pretrained keyword arguments as the objects transformers takes: its JSON-ready
    `kwargs` with a `BitsAndBytesConfig` for a planned quantization and, for tensor parallelism, a
    `DistributedConfig` where transformers has one. What `load()` passes to from_pretrained (with
    `output_loading_info=True`); use it to load a plan with transformers yourself.

    Args:
        plan: A `Plan` from `plan()`.

    Returns:
        A new dict of from_pretrained keyword arguments (the plan is not changed).

    Raises:
        SettingError: `plan` is not a Plan.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> a100 = cudaload.Machine.simulated("A100", packages={"bitsandbytes": "0.50.2", "peft": "0.21.2"})
        >>> plan = cudaload.plan(path, machine=a100, finetune=True, quantize="4bit")
        >>> plan.kwargs["quantization_config"]["bnb_4bit_quant_type"]
        'nf4'
        >>> type(cudaload.from_pretrained_kwargs(plan)["quantization_config"]).__name__
        'BitsAndBytesConfig'
    """
    if not isinstance(plan, Plan):
        raise SettingError(
            f"from_pretrained_kwargs() takes a Plan from cudaload.plan(), not {type(plan).__name__} ({plan!r:.60})."
        )
    kwargs: dict[str, Any] = mutable(plan.kwargs)  # plain dicts: transformers and accelerate may change what they get
    quant = kwargs.get("quantization_config")
    if isinstance(quant, Mapping):
        import transformers

        method = config_method(plan.decisions)  # the record's data; the real config object is built here
        config_class = getattr(transformers, method.config_class if method else DEFAULT_CONFIG_CLASS)
        kwargs["quantization_config"] = config_class(**quant)
    if "tp_plan" in kwargs and "distributed_config" not in kwargs and "tp_size" not in kwargs:
        # transformers >= 5.1x takes TP through DistributedConfig (a bare tp_plan= warns FutureWarning).
        try:
            from transformers.distributed import DistributedConfig  # type: ignore[attr-defined]
        except ImportError:  # older 5.x: tp_plan= is the API
            return kwargs
        kwargs["distributed_config"] = DistributedConfig(tp_plan=kwargs.pop("tp_plan"))
    return kwargs


@dataclass(frozen=True)
class _WeightsReport:
    """What transformers' loading report (`output_loading_info=True`) says of the checkpoint's weights."""

    missing: tuple[str, ...] = ()
    """Weights the model has and the checkpoint lacks (or holds in another shape): initialized at random."""
    unexpected: tuple[str, ...] = ()
    """Weights the checkpoint holds and the model has no place for: not used."""

    @classmethod
    def read(cls, info: Mapping[str, Any]) -> _WeightsReport:
        mismatched = {str(entry[0]) for entry in info.get("mismatched_keys") or ()}
        return cls(
            missing=tuple(sorted({str(k) for k in info.get("missing_keys") or ()} | mismatched)),
            unexpected=tuple(sorted(str(k) for k in info.get("unexpected_keys") or ())),
        )


def _load_with(auto: Any, plan: Plan, option: str) -> tuple[Any, _WeightsReport, _Failure | None]:
    """(the model loaded with `option`, its weights report, None), or (None, an empty report, the failure)."""
    try:
        model, info = auto.from_pretrained(
            plan.model, output_loading_info=True, **from_pretrained_kwargs(plan.with_attention(option))
        )
    except CudaloadError:
        raise  # cudaload's own errors already say what to do
    except Exception as exc:
        return None, _WeightsReport(), _Failure("load", describe_error(exc), exc)
    return model, _WeightsReport.read(info), None


def _listed(keys: tuple[str, ...], limit: int = 6) -> str:
    return ", ".join(keys[:limit]) + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")


def _check_weights(plan: Plan, model: Any, report: _WeightsReport, allow_missing: bool) -> tuple[str, ...]:
    """Raise when the checkpoint does not fill the model; the warnings to issue otherwise.

    A weight the checkpoint lacks is initialized at random by from_pretrained, which only logs it:
    the model then runs (the test forward passes) and answers nonsense. Unused checkpoint weights
    are an error when the model is the checkpoint's own architecture (config.json and weights
    disagree); when you chose another class (e.g. a base model from a checkpoint with a head) they
    are what you asked for, recorded in `AppliedPlan.unexpected_weights`.
    """
    cls = type(model).__name__
    notes: list[str] = []
    if report.missing:
        if not allow_missing:
            raise LoadFailedError(
                f"{plan.model} loaded as {cls}, but its checkpoint lacks {len(report.missing)} of the model's "
                f"weights, which from_pretrained initialized at random: {_listed(report.missing)}. The checkpoint "
                "is incomplete, or it was saved from another architecture: pass the model_class it was saved "
                "with (config.json's 'architectures'), or re-save it. To train these weights (e.g. a new task "
                "head), pass allow_missing_weights=True."
            )
        notes.append(
            f"{plan.model}: {len(report.missing)} weights are not in the checkpoint and were initialized at random "
            f"(allow_missing_weights=True): {_listed(report.missing)}. Train them before using the model's outputs."
        )
    if report.unexpected and cls in (getattr(model.config, "architectures", None) or ()):
        raise LoadFailedError(
            f"{plan.model} loaded as {cls}, its own architecture, but {len(report.unexpected)} checkpoint weights "
            f"have no place in it and were not used: {_listed(report.unexpected)}. config.json and the weights "
            "disagree (e.g. num_hidden_layers edited after saving): fix the config or re-save the model."
        )
    return tuple(notes)


def _switch_to(model: Any, option: str) -> _Failure | None:
    """Switch the loaded model in place to `option` (no weights are read again); the failure if
    transformers refuses it."""
    try:
        model.set_attn_implementation(option)
    except Exception as exc:
        return _Failure("switch", describe_error(exc), exc)
    return None


def _unrelated(plan: Plan, option: str, failure: _Failure, fallbacks: list[Fallback]) -> LoadFailedError:
    """The error for a failure that is not the attention option's: no other option is tried."""
    model = plan.model
    if failure.phase == "load" and failure.error is not None:
        return _load_error(plan, failure.error)
    if failure.phase == "switch":
        return LoadFailedError(
            f"Could not switch to attn_implementation={option!r} after the others failed: "
            f"{failure.problem}. Tried: {', '.join(f.option for f in fallbacks)}."
        )
    return LoadFailedError(
        f"{model} loaded, but a test forward failed for a reason unrelated to attention: "
        f"{failure.problem}. Check the placement (device_map/max_memory) and dtype, or pass verify=False "
        f"to skip the check.{_elsewhere(plan)}"
    )


def _no_fallback(plan: Plan, option: str, failure: _Failure, fallbacks: list[Fallback], why: str) -> LoadFailedError:
    """The error for an attention option that failed when cudaload may not fall back (`why`)."""
    chain = plan.attention_chain
    if (
        failure.problem == NON_FINITE
        and len(fallbacks) + 1 == len(chain)
        and all(f.error == NON_FINITE for f in fallbacks)
    ):
        # Every attention option, eager included, gave NaN/inf: attention is not the problem.
        return LoadFailedError(
            f"{plan.model} loaded, but every attention option ({', '.join(chain)}) gave non-finite logits in "
            f"{plan.dtype}: the weights or the dtype are the problem, not attention. Check the checkpoint for "
            "NaN/inf weights; with float16, try dtype='bfloat16' (sm80+) or 'float32' (fp16 overflow)."
        )
    tried = "".join(f"\n  {f.option} ({f.phase}): {f.error}" for f in fallbacks)
    return LoadFailedError(
        f"Loading {plan.model} with attn_implementation={option!r} failed at {failure.phase}: "
        f"{failure.problem.rstrip('.')}. Not falling back ({why}).{' Tried:' + tried if tried else ''} "
        "Pass another attn_implementation, or leave it unset (and strict=False) to let cudaload fall back."
    )


def _planned_quantize(plan: Plan) -> Any:
    try:
        return plan.decision("quantize").value
    except KeyError:
        return None


def set_rank_device(plan: Plan, set_device: Any = None) -> int | None:
    """Make the plan's `cuda_device` the current CUDA device before from_pretrained (a quantized FSDP /
    ZeRO-3 rank: its loader places the weights on `torch.cuda.current_device()`; a pre-quantized checkpoint on
    mixed GPUs: its quantizer judges the current device); returns the index, or None when the plan has no
    such decision or this process has no CUDA device of that index (a plan made for another machine: the
    load then fails, or falls back, on its own terms, never on set_device). `set_device` defaults to
    `torch.cuda.set_device`, called only when CUDA is there; one you pass is always called."""
    try:
        index = int(plan.decision("cuda_device").value)
    except KeyError:
        return None
    if set_device is None:
        import torch

        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        set_device = torch.cuda.set_device
    set_device(index)
    return index


def _hub_code_allowed(plan: Plan, option: str) -> bool:
    """The plan's consent to Hub code: hub_kernels=True or use_kernels=True when it was made, or `option` is
    the Hub kernel you named as attn_implementation (naming one is consent for it). A plan without its inputs
    (rebuilt from JSON) carries no consent."""
    request = plan.inputs.request if plan.inputs is not None else None
    if plan.kwargs.get("use_kernels") is True or (
        request is not None and True in (request.hub_kernels, request.use_kernels)
    ):
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


def _unasked_hub_code(plan: Plan, option: str, phase: _Phase) -> _Failure | None:
    """A failure, before transformers is asked, when `option` would make it download and run Hub code here that
    the plan did not allow (a plan made for another machine, where the package was installed or the kernel
    cached); None when it fetches nothing, the kernel is in this machine's cache, or Hub code was allowed."""
    if _hub_code_allowed(plan, option):
        return None
    repo = _hub_repo_here(option)
    if repo is None:
        return None
    from .capability import detect

    kernel = detect().hub.kernel(repo)
    if kernel is not None and kernel.cached:
        return None  # fetched before: the same rule as the plan's (policy/attention.py `_consent_needed`)
    return _Failure(
        phase,
        f"transformers would download and run {repo} from the Hub here, and this plan does not allow Hub code "
        "(pass hub_kernels=True to plan() or load() to allow it)",
    )


def apply_plan(
    plan: Plan, *, strict: bool, verify: bool, training: bool = False, allow_missing_weights: bool = False
) -> Any:
    """Load `plan.model` through `plan.auto_class`, falling back along `plan.attention_chain`.

    One loop over the chain: load the first option (or, once a model is loaded and failed its test
    forward, switch it in place to the next), then run the test forward. A failure that is the
    option's (`_is_attention_failure`) is recorded as a `Fallback` and the next option is tried;
    any other failure raises at once, as does the last option's or one cudaload may not leave.
    Weights the checkpoint does not fill raise before any test forward (`_check_weights`).
    """
    from .capability.model_config import resolve_auto_class
    from .upstream_imports import import_transformers

    import_transformers()
    # A quantized FSDP / ZeRO-3 rank, or a pre-quantized checkpoint on mixed GPUs: before the quantizer reads the
    # current device (policy/current_device.py, `decide_rank_device` and `decide_current_device`).
    set_rank_device(plan)
    auto = resolve_auto_class(plan.auto_class)
    chain = plan.attention_chain
    can_fall_back = not strict and "attn_implementation" not in plan.explicit
    why = "strict=True" if strict else "you chose it" if not can_fall_back else "no option left in the chain"
    fallbacks: list[Fallback] = []
    timings: dict[str, float] = dict(plan.timings)  # "probe" when planning measured this CPU
    model: Any = None
    verified: bool | None = None
    report = _WeightsReport()
    weight_notes: tuple[str, ...] = ()
    for index, option in enumerate(chain):
        start = time.perf_counter()
        # A link that would fetch Hub code the plan did not allow fails before transformers is asked.
        failure: _Failure | None = _unasked_hub_code(plan, option, "load" if model is None else "switch")
        if failure is None and model is None:
            model, report, failure = _load_with(auto, plan, option)
            timings["load" if failure is None else f"load[{option}]"] = time.perf_counter() - start
            if failure is None:
                weight_notes = _check_weights(plan, model, report, allow_missing_weights)
        elif failure is None:  # the loaded model failed its test forward: switch it in place, no weights read again
            failure = _switch_to(model, option)
            timings["verify"] = timings.get("verify", 0.0) + time.perf_counter() - start
        if failure is None and verify:
            start = time.perf_counter()
            outcome = _verify(model, training)
            timings["verify"] = timings.get("verify", 0.0) + time.perf_counter() - start
            verified, failure = outcome.verified, outcome.failure
        if failure is None:
            break
        if failure.error is not None and not _is_attention_failure(failure.error, option):
            raise _unrelated(plan, option, failure, fallbacks) from failure.error
        if not can_fall_back or index == len(chain) - 1:
            raise _no_fallback(plan, option, failure, fallbacks, why) from failure.error
        fallbacks.append(Fallback(option, failure.phase, failure.problem))
        logger.warning(
            "%s: attn_implementation=%s failed at %s (%s); falling back to %s",
            plan.model,
            option,
            failure.phase,
            failure.problem.rstrip("."),
            chain[index + 1],
        )

    applied_plan = _as_applied(plan, chain[index:], fallbacks)
    if plan.generation is not None:
        from .planner import generation_as_applied

        dtype = str(model.dtype).removeprefix("torch.")
        applied_plan = replace(
            applied_plan, generation=generation_as_applied(plan, applied_plan.attn_implementation, dtype)
        )
    device_map = getattr(model, "hf_device_map", None)
    offloaded = _offloaded(device_map, has_gpu=any(isinstance(v, int) for v in (device_map or {}).values()))
    notes = [*plan.warnings, *weight_notes]
    if offloaded:
        notes.append(_offload_warning(plan.model, offloaded))
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
        missing_weights=report.missing,
        unexpected_weights=report.unexpected,
        timings=timings,
        warnings=tuple(notes),
    )
    model.cudaload_plan = applied
    logger.info("%s", _summary(applied, type(model).__name__))
    return model


def _summary(applied: AppliedPlan, cls: str) -> str:
    """The one log line of a load: what was applied, where, and how long it took."""
    where = applied.device
    if applied.device_map:
        places = sorted({f"cuda:{p}" if isinstance(p, int) else str(p) for p in applied.device_map.values()})
        where = f"device_map {places[0]}" if len(places) == 1 else f"device_map over {', '.join(places)}"
    fell = f", fell back from {', '.join(f.option for f in applied.fallbacks)}" if applied.fallbacks else ""
    took = ", ".join(f"{step} {seconds:.2f}s" for step, seconds in applied.timings.items())
    return (
        f"loaded {applied.plan.model} as {cls} on {where}: dtype={applied.dtype} attn_implementation="
        f"{applied.attn_implementation}{fell} ({took})"
    )


def load(
    model: str | os.PathLike[str] | Plan,
    *,
    strict: bool = False,
    verify: bool = True,
    machine: Machine | None = None,
    model_class: str | type | None = None,
    allow_missing_weights: bool = False,
    **overrides: Any,
) -> PreTrainedModel:
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
        model_class: The transformers Auto class (or model class) to load with, as a class or its
            name (e.g. "AutoModelForSequenceClassification", `BertModel`). Default None: the
            checkpoint's own architecture (config.json's "architectures"). A Plan loads through
            the class it was planned with (`Plan.auto_class`); naming another one is an error.
        allow_missing_weights: Accept weights the checkpoint does not hold, initialized at random
            (e.g. a new task head you will train), with a warning; they are listed in
            `AppliedPlan.missing_weights`. Default False: such a load raises LoadFailedError.
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
            names the likely cause); the checkpoint lacks weights of the model (unless
            `allow_missing_weights=True`) or holds weights its own architecture does not use;
            the test forward failed for a reason unrelated to attention;
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
    from .capability.model_config import model_class_name
    from .planner import check_flag

    for name, value in (("strict", strict), ("verify", verify), ("allow_missing_weights", allow_missing_weights)):
        check_flag(name, value, allow_none=False)
    if "output_loading_info" in overrides:
        raise SettingError(
            "output_loading_info= is not passed through: load() reads transformers' loading report itself, raises "
            "on weights the checkpoint lacks and records the rest in model.cudaload_plan (missing_weights, "
            "unexpected_weights)."
        )
    if isinstance(model, Plan):
        given = [
            *(
                [f"model_class={model_class!r}"]
                if model_class_name(model_class) not in (None, model.auto_class)
                else []
            ),
            *(["machine"] if machine is not None else []),
            *overrides,
        ]
        if given:
            raise SettingError(
                f"load(plan) was given {', '.join(given)}: a Plan is loaded as planned "
                f"(for {model.machine}, through {model.auto_class}). Build the plan with them instead: "
                "cudaload.plan(model, ...)."
            )
        if model.finetune is not None:
            # load() applies no LoRA and no k-bit preparation: the model would come back untrainable,
            # with a plan that says it is set up for fine-tuning.
            raise SettingError(
                f"load(plan) was given a fine-tuning plan (LoRA r={model.finetune.lora.get('r')}, "
                f"quantize={_planned_quantize(model)!r}): load() applies neither the adapters nor the k-bit "
                "preparation. Pass it to cudaload.load_for_finetune(plan), or plan for inference "
                "(cudaload.plan(model) without finetune=True) to load with load()."
            )
        the_plan = model
    else:
        from .planner import plan

        overrides.setdefault("generate", None)  # plan generation for a generating model when its config allows
        the_plan = plan(str(model), machine=machine, model_class=model_class, **overrides)
    planned = time.perf_counter() - start
    loaded = apply_plan(the_plan, strict=strict, verify=verify, allow_missing_weights=allow_missing_weights)
    applied: AppliedPlan = loaded.cudaload_plan
    loaded.cudaload_plan = replace(applied, timings={"plan": planned, **applied.timings})
    return cast("PreTrainedModel", loaded)
