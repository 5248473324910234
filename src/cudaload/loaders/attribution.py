"""Whose failure is it: an attention option's (the next link may work) or another cause, named in the error."""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import LoadFailedError, describe_error
from ..facts.attention_backends import BACKENDS
from ..plans import Plan
from ..upstream_flash import FLASH_OPTIONS, attention_kind
from .applied import Failure, Fallback
from .verify import NON_FINITE

__all__ = ["is_attention_failure", "no_fallback_error", "unrelated_error"]  # used by apply.py


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

# Code that does nothing but run one kind of option (upstream_flash.attention_kind): an error
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
}
"""The two families recognised by form (upstream_flash.attention_kind); a named backend's are its record's
(facts/attention_backends.py: AttentionBackend.runtime_modules)."""


def _runtime_modules(option: str) -> tuple[str, ...]:
    """The modules that do nothing but run `option`: its family's, or its backend record's."""
    backend = BACKENDS.get(option)
    return _RUNTIME_MODULES.get(attention_kind(option)) or (backend.runtime_modules if backend is not None else ())


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


def is_attention_failure(exc: BaseException, option: str) -> bool:
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
      FlashAttention packages and transformers' flash wrappers; a named backend's record: transformers' SDPA
      or flex wrappers), except running out
      of memory: the fix for that is placement, and eager attention needs more memory, not less.

    Args:
        exc: What `from_pretrained`, `set_attn_implementation` or the test forward raised.
        option: The `attn_implementation` being tried (e.g. "flash_attention_2", "sdpa").

    Returns:
        True when another attention option may succeed where this one failed.
    """
    runtime = _runtime_modules(option)
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
    if "Torch not compiled with CUDA enabled" in text:  # torch.cuda._lazy_init on a CPU build (2.13-2.15)
        hint = (
            f"the plan places weights on a GPU (device_map={plan.kwargs.get('device_map')!r}) and torch here "
            "cannot use CUDA (a CPU build of torch)"
        )
    elif "Found no NVIDIA driver" in text:  # torch.cuda._lazy_init, a CUDA build on a machine without a driver
        hint = (
            f"the plan places weights on a GPU (device_map={plan.kwargs.get('device_map')!r}) and torch here "
            "cannot use CUDA (a CUDA build of torch, but no NVIDIA driver on this machine)"
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
    """ " This plan was made for <machine> ..." when the plan was not made for the machine of the process that
    planned it (a machine passed to plan(): a simulated GPU, another host's); nothing when it was (the planner's
    `ApplyFacts.machine_here`). Read from the plan: applying probes nothing."""
    here = plan.apply_facts.machine_here if plan.apply_facts is not None else None
    if here is not None:
        return ""
    return (
        f" This plan was made for {plan.machine}, a machine given to plan() (this process's own is read only "
        "when machine= is left unset): to load on this machine, plan it here (cudaload.load(model) or "
        "cudaload.plan(model) without machine=)."
    )


def unrelated_error(plan: Plan, option: str, failure: Failure, fallbacks: list[Fallback]) -> LoadFailedError:
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


def no_fallback_error(
    plan: Plan, option: str, failure: Failure, fallbacks: list[Fallback], why: str
) -> LoadFailedError:
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
