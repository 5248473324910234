"""Make bitsandbytes believe the CPU has (or lacks) AVX512-BF16, so that a test exercises both of its import
paths on any machine: bitsandbytes 0.50.2 backends/cpu/ops.py imports `has_avx512bf16` from
`bitsandbytes.functional` and, when it returns True, fetches `kernels-community/quantization-bitsandbytes`
at import. Only the answer of that function changes, and only for this process (and its forks).

Use before anything imports bitsandbytes: `force(True)`, or set CUDALOAD_TEST_BNB_AVX512BF16=1 (or 0) for a
process that calls `force_from_environment()`. Never run a 4-bit matmul with the path forced on a CPU that
lacks the instructions: the check is there because bitsandbytes' native CPU kernels need them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

ENVIRONMENT = "CUDALOAD_TEST_BNB_AVX512BF16"


class _Patched(importlib.abc.Loader):
    def __init__(self, inner: Any, answer: bool) -> None:
        self.inner, self.answer = inner, answer

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        answer = self.answer
        module.has_avx512bf16 = lambda: answer  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, answer: bool) -> None:
        self.answer = answer

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "bitsandbytes.functional":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Patched(spec.loader, self.answer)
                return spec
        return None


def force(answer: bool) -> None:
    """From now on in this process, bitsandbytes' `has_avx512bf16()` returns `answer`."""
    if "bitsandbytes.functional" in sys.modules:
        raise RuntimeError("bitsandbytes is already imported: force() must run before it is")
    sys.meta_path.insert(0, _Finder(answer))


def force_from_environment() -> bool | None:
    """force() from CUDALOAD_TEST_BNB_AVX512BF16 ("1"/"0"); the forced answer, or None when it is not set."""
    value = os.environ.get(ENVIRONMENT)
    if value not in ("0", "1"):
        return None
    force(value == "1")
    return value == "1"
