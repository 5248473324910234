"""The distributions cudaload names: those detection lists, the extra of cudaload's pyproject.toml that installs
each, and the one install hint every message builds (`install_hint`).

The list is installed.PACKAGES (the distributions cudaload names itself, FlashAttention's among them) and what a
record registers: each quantization method's package (facts/quant_methods.py). It lives here, with the records,
so the bottom modules (errors.py, installed.py) import nothing of cudaload; whoever raises builds the hint here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..installed import PACKAGES, dist_version, installed_versions
from .quant_methods import quant_packages

__all__ = ["INSTALLED_BY", "detected_packages", "install_hint", "installed_by", "packages_here"]

INSTALLED_BY: dict[str, str] = {
    "peft": "finetune",
    "kernels": "kernels",
    "matplotlib": "bench",
}
"""The optional distributions cudaload's messages tell you to install, beyond the quantization methods'
packages (their records name their extra: facts/quant_methods.py) -> the extra of cudaload's pyproject.toml
that also installs it (from a clone: `pip install -e '.[finetune]'`). cudaload itself is not on the package
registry, so a hint names the upstream distribution, which is."""


def detected_packages() -> tuple[str, ...]:
    """The distributions cudaload cares about, what `detect()` reports and a simulated machine takes from
    here: installed.PACKAGES, then each quantization method's package (facts/quant_methods.py: its record registers
    it, as upstream_flash.FLASH_OPTIONS registers FlashAttention's; read at each call, so a method registered later
    counts)."""
    return (*PACKAGES, *(dist for dist in quant_packages() if dist not in PACKAGES))


def packages_here(paths: Sequence[str] | None = None) -> dict[str, str]:
    """{distribution: public version} of the `detected_packages()` installed here ("2.13.0+cpu" -> "2.13.0": a
    simulated GPU machine gets a CUDA build of the same release), read from dist-info folder names (installed.py).
    A FlashAttention distribution counts when its dist-info is there (a simulation does not import it)."""
    found = {}
    installed = installed_versions(paths)
    for dist in detected_packages():
        version = dist_version(dist, installed)
        if version is not None:
            found[dist] = version.split("+")[0]
    return found


def installed_by() -> dict[str, str]:
    """Every distribution an install hint may name -> the extra of cudaload's pyproject.toml that installs it:
    INSTALLED_BY and each quantization method's package (read at each call: a method registered later counts)."""
    return {**INSTALLED_BY, **{dist: package.extra for dist, package in quant_packages().items()}}


def install_hint(dist: str, low: str | None = None, high: str | None = None) -> str:
    """The one command that installs `dist` (a key of `installed_by()`), within [low, high) when given
    (see the example). Every install hint in a message is built here, so a test can check that each
    names what the registry serves.

    Examples:
        >>> install_hint("kernels", "0.17.2", "0.18.0")
        "pip install 'kernels>=0.17.2,<0.18.0'"
    """
    if dist not in installed_by():
        raise KeyError(
            f"no install hint for {dist!r}: add it to INSTALLED_BY (its extra in pyproject.toml), or name it as a "
            "quantization method's package"
        )
    bounds = ",".join(f"{op}{v}" for op, v in ((">=", low), ("<", high)) if v)
    return f"pip install '{dist}{bounds}'" if bounds else f"pip install {dist}"
