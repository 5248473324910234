"""bitsandbytes under a ROCm torch: which release has a ROCm backend, and whether the installed wheel ships a build
that torch's HIP version can load. Pure: the builds are read from the wheel's file names
(capability/native_libraries.py) and the HIP version from `torch.version.hip` (capability/module_constants.py: the
loaded module's, else torch/version.py's), neither imported.

Sources, by symbol:
- bitsandbytes 0.50.2 cextension.py: `get_cuda_bnb_library_path` picks `libbitsandbytes_rocm<major><minor>` for
  `torch.version.hip`: the exact version, else the highest shipped below it with the same major, else the lowest
  above it with the same major (a logged warning); "No cross-major fallback": a HIP major with no build of its own
  gets a path that does not exist, and bitsandbytes raises when it loads it.
- bitsandbytes documentation, installation guide: "experimental support for ... AMD ROCm" in 0.48 (v0.48.1 page);
  0.50.2's README support table lists AMD GPUs (LLM.int8, QLoRA 4-bit, 8-bit optimizers) as supported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["ROCM_SINCE", "hip_major_minor", "rocm_build", "rocm_builds"]

ROCM_SINCE = "0.48.0"
"""The first bitsandbytes release with a ROCm backend on the registry (experimental until 0.50); CUDA's minimum is
transformers' BITSANDBYTES_MIN_VERSION (0.46.1)."""

_BUILD = re.compile(r"^rocm(?P<major>\d)(?P<minor>\d+)$")


def hip_major_minor(hip: str) -> tuple[int, int] | None:
    """(major, minor) of `torch.version.hip` ("6.3.42131-fa1d09cbd" -> (6, 3)); None when it does not parse."""
    match = re.match(r"^(\d+)\.(\d+)", hip.strip())
    return (int(match[1]), int(match[2])) if match else None


def rocm_builds(builds: Iterable[str]) -> dict[tuple[int, int], str]:
    """The ROCm builds among a wheel's builds, by (major, minor): "rocm64" -> (6, 4), "rocm714" -> (7, 14) (one
    digit of major, as bitsandbytes 0.50.2 cextension.py: `_split_cuda_version` reads them)."""
    found = {}
    for build in builds:
        match = _BUILD.match(build)
        if match is not None:
            found[(int(match["major"]), int(match["minor"]))] = build
    return found


def rocm_build(builds: Iterable[str], hip: str) -> tuple[str | None, str]:
    """(the build bitsandbytes loads under ROCm `hip`, or None when none can load; why), by
    `get_cuda_bnb_library_path`'s order."""
    version = hip_major_minor(hip)
    shipped = rocm_builds(builds)
    listed = ", ".join(f"ROCm {major}.{minor}" for major, minor in sorted(shipped)) or "no ROCm build"
    if version is None:
        return None, f"torch's HIP version {hip!r} does not parse"
    if version in shipped:
        return shipped[version], f"its {shipped[version]} build matches ROCm {version[0]}.{version[1]}"
    same = sorted(v for v in shipped if v[0] == version[0])
    below = [v for v in same if v < version]
    pick = max(below) if below else min(same) if same else None
    if pick is None:
        return None, (
            f"the installed bitsandbytes ships {listed}, none for ROCm {version[0]}.x, and it does not fall back "
            f"across majors (bitsandbytes 0.50.2 cextension.py: get_cuda_bnb_library_path): torch's ROCm "
            f"{version[0]}.{version[1]} cannot load it"
        )
    return shipped[pick], (
        f"no build for ROCm {version[0]}.{version[1]}: bitsandbytes loads its {shipped[pick]} build instead, with a "
        "warning (same major)"
    )
