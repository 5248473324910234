"""Which of the distributions cudaload cares about are installed here, read from the names of the
`<name>-<version>.dist-info` folders on sys.path (no import, no metadata parsing).

The one read of this machine below the capability layer: `Machine.simulated()` starts from this
machine's packages (a simulated H100 has the bitsandbytes and kernels you installed), so the facts
layer needs it, and it may not import a probe. It reads folder names only and changes nothing.
"""

from __future__ import annotations

import os
import sys
import time
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
    """PEP 503's normal form with "_" (runs of "-", "_" and "." become one "_"), without `re`: it runs once per
    dist-info folder on sys.path (~170 in a training environment)."""
    name = dist.replace("-", "_").replace(".", "_").lower()
    while "__" in name:
        name = name.replace("__", "_")
    return name


def installed_versions(paths: Sequence[str] | None = None) -> dict[str, str | None]:
    """{normalised distribution name: version} from the `<name>-<version>.dist-info` (and egg-info)
    folder names on `paths` (default sys.path), the first found winning as in importlib.metadata;
    None where the name carries no version. Reading folder names takes about a millisecond;
    importlib.metadata parses each METADATA file as an e-mail (~4 ms a package, plus ~30 ms to
    import), which alone would double detect().

    A load asks four times (detection, the facts cache's key, the packages a plan names, the test forward's
    proof): the folders are listed again when one of them changed since (its modification time: installing or
    removing a distribution adds or removes a folder there), or had changed within _RACY_NS before the listing
    (stamps come from a coarse clock: a second change in the same tick keeps the stamp, git's "racily clean"
    case). Each answer is the packages installed now."""
    entries = tuple(sys.path if paths is None else paths)
    stamps = tuple(_stamp(entry) for entry in entries)
    known = _listed.get(entries)
    if known is not None and known[0] == stamps:
        return dict(known[1])
    listed_at = time.time_ns()
    found: dict[str, str | None] = {}
    for entry in entries:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            if dot and suffix in ("dist-info", "egg-info"):
                dist, _, rest = stem.partition("-")
                found.setdefault(_normalise(dist), rest.partition("-")[0] or None)
    if all(stamp is None or stamp < listed_at - _RACY_NS for stamp in stamps):
        _listed[entries] = (stamps, found)
    return dict(found)


_listed: dict[tuple[str, ...], tuple[tuple[int | None, ...], dict[str, str | None]]] = {}
"""The last listing of each sequence of folders, with their modification times (ns) when it was made."""
_RACY_NS = 2_000_000_000
"""A folder changed this close to its listing is listed again next time (FAT stamps to 2 s, Linux to a tick)."""


def _stamp(entry: str) -> int | None:
    try:
        return os.stat(entry or ".").st_mtime_ns
    except OSError:
        return None


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
