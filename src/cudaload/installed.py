"""Which of the distributions cudaload cares about are installed here, read from the names of the
`<name>-<version>.dist-info` folders on sys.path (no import, no metadata parsing).

The one read of this machine below the capability layer: `Machine.simulated()` starts from this
machine's packages (a simulated H100 has the bitsandbytes and kernels you installed), so the facts
layer needs it, and it may not import a probe. It reads folder names only and changes nothing.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

from .upstream_flash import FLASH_DISTRIBUTIONS

__all__ = ["PACKAGES", "dist_version", "installed_versions"]

PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "huggingface_hub",
    "peft",
    "bitsandbytes",  # its quantization methods' package, and the paged 8-bit optimizers'
    "kernels",
    "nvidia-ml-py",
    *(dist for dist, _ in FLASH_DISTRIBUTIONS.values()),
    # what a pre-quantized checkpoint's quantizer needs (policy/quantization.py, facts/stored_weights.py)
    "triton",
    "optimum",
    "gptqmodel",
    "compressed-tensors",
    "fbgemm-gpu",  # module fbgemm_gpu: transformers' fbgemm_fp8 quantizer needs it on CUDA
    "fbgemm-gpu-genai",
)
"""The distributions cudaload names itself; facts/packages.py `detected_packages()` adds each quantization
method's."""


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def installed_versions(paths: Sequence[str] | None = None) -> dict[str, str | None]:
    """{normalised distribution name: version} from the `<name>-<version>.dist-info` (and egg-info)
    folder names on `paths` (default sys.path), the first found winning as in importlib.metadata;
    None where the name carries no version. Reading folder names takes about a millisecond;
    importlib.metadata parses each METADATA file as an e-mail (~4 ms a package, plus ~30 ms to
    import), which alone would double detect()."""
    found: dict[str, str | None] = {}
    for entry in sys.path if paths is None else paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            if dot and suffix in ("dist-info", "egg-info"):
                dist, _, rest = stem.partition("-")
                found.setdefault(_normalise(dist), rest.partition("-")[0] or None)
    return found


def dist_version(dist: str, installed: Mapping[str, str | None]) -> str | None:
    """`dist`'s version in `installed` (from `installed_versions()`), None when it is not there."""
    key = _normalise(dist)
    if key not in installed:
        return None
    version = installed[key]
    if version is not None:
        return version
    # A develop-mode egg-info folder has no version in its name: read its metadata.
    import importlib.metadata as metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
