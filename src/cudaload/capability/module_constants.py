"""Constants of torch and transformers modules, read without importing either: the loaded module's own values
when the process has imported it already, else the assignments in its source text.

detect() must not import torch nor transformers (about a second each; tests/test_overhead.py holds it), so the
values are read from the source files when they are not loaded. When the caller has imported them (`load()` in a
fresh process: the caller or from_pretrained needs both), reading and scanning the files would cost about a
millisecond of CPU for nothing, and the loaded module is what this process runs even if the files on disk have
changed since: its values win. Nothing is imported here: only `sys.modules.get`.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = ["TorchBuilds", "module_constants", "torch_builds", "transformers_kernels_range"]

TORCH_VERSION_MODULE = "torch.version"
"""Where torch keeps its build versions, each a string or None (written when torch is built): torch 2.13
version.py: `cuda`; torch 2.13 version.py: `hip`; torch 2.13 version.py: `xpu`."""

TRANSFORMERS_IMPORT_UTILS = "transformers.utils.import_utils"
"""Where transformers keeps the `kernels` range it accepts: transformers 5.22-5.25 utils/import_utils.py:
`KERNELS_MIN_VERSION`; transformers 5.22-5.25 utils/import_utils.py: `KERNELS_MAX_VERSION`."""


class TorchBuilds(NamedTuple):
    """What torch was built for: `torch.version.cuda`, `.hip` (ROCm) and `.xpu` (oneAPI); None where not."""

    cuda: str | None
    hip: str | None
    xpu: str | None


def _module_source(module: str) -> str | None:
    """The source text of `module` (a dotted name inside an installed package), found without importing the
    package: `find_spec` of a top-level name runs nothing."""
    package, *inner = module.split(".")
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    *folders, name = inner
    try:
        return Path(spec.origin).parent.joinpath(*folders, name + ".py").read_text(encoding="utf-8")
    except OSError:
        return None


def _assigned(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """The first string each of `names` is assigned at the start of a line (`name = "x"`, `name: T = "x"`), in
    one pass that stops once all are found; a name assigned None or nothing is left out."""
    pattern = rf"^({'|'.join(map(re.escape, names))})(?:\s*:[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]"
    found: dict[str, str] = {}
    for match in re.finditer(pattern, text, re.MULTILINE):
        found.setdefault(match.group(1), match.group(2))
        if len(found) == len(names):
            break
    return found


def _string_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None  # as the text reading: a non-empty string or None


def module_constants(module: str, names: tuple[str, ...]) -> dict[str, str | None]:
    """`names`' values in `module`: the loaded module's when `sys.modules` holds it with all of them (a string,
    else None), else the strings its source file assigns them (None for any it does not)."""
    loaded = sys.modules.get(module)
    # A module without one of the names (still being imported by another thread, or a torch older than its `xpu`)
    # is not trusted for any of them: all are read from its file.
    if loaded is not None and all(hasattr(loaded, name) for name in names):
        return {name: _string_or_none(getattr(loaded, name)) for name in names}
    found = _assigned(_module_source(module) or "", names)
    return {name: found.get(name) for name in names}


def torch_builds() -> TorchBuilds:
    """torch's build versions, from `torch.version` when torch is imported, else from torch/version.py (read
    once for the three)."""
    values = module_constants(TORCH_VERSION_MODULE, TorchBuilds._fields)
    return TorchBuilds(**values)


def transformers_kernels_range() -> tuple[str, str] | None:
    """The `kernels` versions transformers accepts (it ignores others silently): KERNELS_MIN_VERSION and
    KERNELS_MAX_VERSION of transformers.utils.import_utils (None when either is missing)."""
    values = module_constants(TRANSFORMERS_IMPORT_UTILS, ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION"))
    low, high = values["KERNELS_MIN_VERSION"], values["KERNELS_MAX_VERSION"]
    return (low, high) if low and high else None
