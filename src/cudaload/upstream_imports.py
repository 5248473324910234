"""The first import of transformers, made once under a lock.

transformers resolves its public names lazily (`_LazyModule.__getattr__` imports the submodule on
first access). Done from several threads at once on a fresh interpreter, the threads that lose the
race see a half-initialized module: `from transformers import AutoConfig` raised ImportError in 7
of 8 threads calling `load()` (transformers 5.25.0). cudaload's entry points call
`import_transformers()` first, so the names they use are resolved by one thread while the others wait.
"""

from __future__ import annotations

import threading

__all__ = ["import_transformers"]

_LOCK = threading.Lock()
_DONE = False

# The lazily exported names cudaload's own code imports from transformers (each resolution imports
# its submodule: configuration, modeling, tokenization, generation, the Auto mappings).
_NAMES = (
    "PretrainedConfig",
    "AutoConfig",
    "AutoTokenizer",
    "PreTrainedModel",
    "GenerationConfig",
    "BitsAndBytesConfig",
    "AutoModel",
    "AutoModelForCausalLM",
)


def import_transformers() -> None:
    """Import transformers and resolve the names cudaload uses, once per process, thread-safely."""
    global _DONE
    if _DONE:
        return
    with _LOCK:
        if _DONE:
            return
        import transformers

        for name in _NAMES:
            getattr(transformers, name)
        _DONE = True
