"""The native libraries installed quantization packages ship, read from their file names without importing them.

bitsandbytes picks one `libbitsandbytes_{cuda,rocm,xpu}<version>.so` for the torch it runs under (0.50.2
cextension.py: `get_cuda_bnb_library_path`), and importing it to ask costs seconds and, on an AVX512-BF16 CPU, a
Hub lookup (docs/DESIGN.md): the file names are enough to judge a ROCm torch against them (facts/bnb_rocm.py).
torchao loads its `_C*.so` extensions at import (torchao 0.18.0 __init__.py), and transformers imports torchao in
every process that loads a model: which ones it ships says what that import tries (facts/torchao_import.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["bitsandbytes_builds", "builds_in", "torchao_extensions"]


def _package_folder(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # a top-level name: runs nothing
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def _names(folder: Path) -> list[str]:
    try:
        return [path.name for path in folder.iterdir()]
    except OSError:
        return []


def _build(name: str) -> str | None:
    """The build a file name `libbitsandbytes_<letters><digits>.<so|dylib|dll>` names; None for another file.
    String methods, not a pattern: every detect() reads the folder, and compiling one costs more than its ~20 names."""
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix not in ("so", "dylib", "dll") or not stem.startswith("libbitsandbytes_"):
        return None
    build = stem.removeprefix("libbitsandbytes_")
    letters = build.rstrip("0123456789")
    return build if letters.isascii() and letters.isalpha() and letters.islower() else None


def builds_in(folder: Path) -> tuple[str, ...]:
    """The builds a bitsandbytes package folder ships ("cpu", "cuda128", "rocm64", "xpu2025"), sorted."""
    return tuple(sorted(build for build in map(_build, _names(folder)) if build is not None))


def bitsandbytes_builds() -> tuple[str, ...] | None:
    """The installed bitsandbytes' builds; None when it is not installed."""
    folder = _package_folder("bitsandbytes")
    return None if folder is None else builds_in(folder)


def torchao_extensions() -> tuple[str, ...] | None:
    """The `_C*.so` extensions the installed torchao ships, sorted; None when it is not installed."""
    folder = _package_folder("torchao")
    return None if folder is None else tuple(sorted(n for n in _names(folder) if n.startswith("_C") and ".so" in n))
