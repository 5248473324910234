"""Which native builds the installed bitsandbytes ships, read from its files without importing it.

bitsandbytes picks one `libbitsandbytes_{cuda,rocm,xpu}<version>.so` for the torch it runs under (0.50.2
cextension.py: `get_cuda_bnb_library_path`), and importing it to ask costs seconds and, on an AVX512-BF16 CPU, a
Hub lookup (docs/DESIGN.md): the file names are enough to judge a ROCm torch against them (facts/bnb_rocm.py).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

__all__ = ["bitsandbytes_builds", "builds_in"]

_LIBRARY = re.compile(r"^libbitsandbytes_(?P<build>[a-z]+\d*)\.(?:so|dylib|dll)$")


def builds_in(folder: Path) -> tuple[str, ...]:
    """The builds a bitsandbytes package folder ships ("cpu", "cuda128", "rocm64", "xpu2025"), sorted."""
    try:
        names = [path.name for path in folder.iterdir()]
    except OSError:
        return ()
    return tuple(sorted(m["build"] for m in map(_LIBRARY.match, names) if m is not None))


def bitsandbytes_builds() -> tuple[str, ...] | None:
    """The installed bitsandbytes' builds (`find_spec` runs nothing); None when it is not installed."""
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or spec.origin is None:
        return None
    return builds_in(Path(spec.origin).parent)
