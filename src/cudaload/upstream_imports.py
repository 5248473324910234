"""First imports of upstream packages whose import has effects: transformers (once, under a lock) and
bitsandbytes (without Hub code unless the user allowed it); a transformers class by its name
(`resolve_auto_class`, for the planner and the loader alike).

transformers resolves its public names lazily (`_LazyModule.__getattr__` imports the submodule on
first access). Done from several threads at once on a fresh interpreter, the threads that lose the
race see a half-initialized module: `from transformers import AutoConfig` raised ImportError in 7
of 8 threads calling `load()` (transformers 5.25.0). cudaload's entry points call
`import_transformers()` first, so the names they use are resolved by one thread while the others wait.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .errors import ModelConfigError

__all__ = [
    "before_first_import",
    "bitsandbytes_hub_kernel_refused",
    "import_bitsandbytes",
    "import_transformers",
    "resolve_auto_class",
]

_LOCK = threading.Lock()
_resolved: set[str] = set()
"""The transformers names resolved so far in this process (`import_transformers`)."""
_notices: list[Callable[[], None]] = []
"""Called once, just before this process first imports transformers (`before_first_import`)."""

# The lazily exported names cudaload's own code imports from transformers (each resolution imports
# its submodule: configuration, modeling, generation, the Auto mappings; the tokenizer's only when asked).
_NAMES = (
    "PretrainedConfig",
    "AutoConfig",
    "PreTrainedModel",
    "GenerationConfig",
    "BitsAndBytesConfig",
    "AutoModel",
    "AutoModelForCausalLM",
)


def import_transformers(*more: str) -> None:
    """Import transformers and resolve the names cudaload uses, once per process, thread-safely; `more`: names
    only some entry points use, resolved under the same lock when first asked (`tokenizer_for()`'s AutoTokenizer:
    its tokenization modules cost load() ~7 ms of CPU, issue 50, and load() never reads a tokenizer)."""
    wanted = (*_NAMES, *more)
    if _resolved.issuperset(wanted):
        return
    with _LOCK:
        if "transformers" not in sys.modules:
            while _notices:
                _notices.pop(0)()
        import transformers

        for name in wanted:
            if name not in _resolved:
                getattr(transformers, name)
                _resolved.add(name)


@contextlib.contextmanager
def before_first_import(say: Callable[[], None]) -> Iterator[None]:
    """Within: `say()` runs once, just before transformers (and torch with it) is first imported in this process,
    which takes seconds of CPU (7-14 s on a busy 2-core machine, issue 46): the CLI says what it waits on there,
    and says nothing when the command needs no import (a plan read from cudaload's cache)."""
    _notices.append(say)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # said already
            _notices.remove(say)


def resolve_auto_class(name: str) -> Any:
    """The transformers class called `name`: an Auto class (e.g. "AutoModelForCausalLM") or a model
    class (e.g. "BertModel").

    Raises:
        ModelConfigError: transformers has no class of that name with `from_pretrained`.
    """
    import_transformers()
    import transformers

    auto = getattr(transformers, name, None)
    if auto is None or not hasattr(auto, "from_pretrained"):
        raise ModelConfigError(
            f"model_class={name!r}: transformers has no such Auto class or model class. Pass the name of one, "
            "e.g. 'AutoModelForCausalLM', 'AutoModelForSequenceClassification' or 'BertModel'."
        )
    return auto


# bitsandbytes (0.48 to 0.50.2 at least) fetches and runs `kernels-community/quantization-bitsandbytes` from the Hub
# when it is imported on a CPU with AVX512-BF16 and `kernels` is installed (bitsandbytes 0.50.2
# backends/cpu/ops.py, the `if has_avx512bf16():` block calling `kernels.get_kernel`). peft imports bitsandbytes,
# and so does transformers' bitsandbytes quantizer. Without the user's consent cudaload imports bitsandbytes
# first, with `kernels.get_kernel` refusing for that one import: bitsandbytes then keeps its built-in CPU path
# (the same one it takes when the fetch fails) and no Hub host is contacted. Once imported, later imports of
# peft or transformers reuse the module and fetch nothing.
_BNB_KERNEL_LOGGER = "bitsandbytes.backends.cpu.ops"
_REFUSAL = "Hub code refused by cudaload (no consent)"
_bnb_lock = threading.Lock()
_bnb_kernel_refused: list[str] = []  # the repos bitsandbytes asked for during the guarded import


class _HubKernelRefused(RuntimeError):
    """Raised by the stand-in for `kernels.get_kernel` while bitsandbytes is imported without consent."""


class _DropRefusal(logging.Filter):
    """bitsandbytes logs a WARNING telling users to install kernels when the fetch fails; after our refusal
    that advice is wrong, so the line is dropped (the refusal is logged by cudaload instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _REFUSAL not in record.getMessage()


def import_bitsandbytes(*, hub_code: bool) -> bool:
    """Import bitsandbytes (if installed) before peft or transformers do; without `hub_code` consent the
    import fetches no Hub kernel. Returns True when bitsandbytes is imported (now or before)."""
    if "bitsandbytes" in sys.modules:
        return True
    if importlib.util.find_spec("bitsandbytes") is None:
        return False
    with _bnb_lock:
        if "bitsandbytes" in sys.modules:
            return True
        if hub_code:
            import bitsandbytes

            return True
        with _no_hub_kernels():
            import bitsandbytes  # noqa: F401
    for repo in _bnb_kernel_refused:
        logging.getLogger("cudaload").info(
            "bitsandbytes asked for %s from the Hub at import; not fetched (Hub code needs hub_kernels=True): "
            "it runs its built-in CPU path",
            repo,
        )
    return True


def bitsandbytes_hub_kernel_refused() -> tuple[str, ...]:
    """The Hub kernels bitsandbytes asked for at import and cudaload refused (empty when none were asked for)."""
    return tuple(_bnb_kernel_refused)


@contextlib.contextmanager
def _no_hub_kernels() -> Iterator[None]:
    try:
        import kernels
    except Exception:  # not installed, or broken: bitsandbytes' own fallback handles it
        yield
        return
    original = kernels.get_kernel

    def refused(repo_id: str, *args: Any, **kwargs: Any) -> Any:
        _bnb_kernel_refused.append(repo_id)
        raise _HubKernelRefused(f"{repo_id}: {_REFUSAL}")

    quiet = _DropRefusal()
    logger = logging.getLogger(_BNB_KERNEL_LOGGER)
    kernels.get_kernel = refused
    logger.addFilter(quiet)
    try:
        yield
    finally:
        kernels.get_kernel = original
        logger.removeFilter(quiet)
