"""Whether Hub kernels (`kernels` package) can be used here, and `use_kernels`."""

from __future__ import annotations

from ..errors import MissingPackageError, install_hint
from ..facts.machine import Machine
from ..plans import Decision, Rejected

__all__ = ["decide_use_kernels", "kernels_status"]


def kernels_status(machine: Machine) -> tuple[bool, str]:
    """(usable, why): is `kernels` installed in a version the installed transformers accepts?"""
    software = machine.software
    version = software.version("kernels")
    accepted = software.kernels_range or (None, None)
    if version is None:
        return False, f"the `kernels` package is not installed ({install_hint('kernels', *accepted)})"
    if software.kernels_range is not None:
        low, high = software.kernels_range
        if not (software.at_least("kernels", low) and not software.at_least("kernels", high)):
            return False, (
                f"kernels {version} is installed but transformers {software.version('transformers')} "
                f"accepts only [{low}, {high}) ({install_hint('kernels', low, high)})"
            )
    return True, f"kernels {version} is installed and accepted by transformers"


def decide_use_kernels(machine: Machine, requested: bool | None) -> Decision:
    usable, why = kernels_status(machine)
    if requested is True:
        if not usable:
            raise MissingPackageError(
                f"use_kernels=True was asked, but {why}. Install a matching `kernels` or drop use_kernels."
            )
        if not machine.gpus:
            raise MissingPackageError(
                "use_kernels=True was asked, but this machine has no CUDA GPU and the Hub layer kernels "
                "cudaload would use are built for CUDA. Drop use_kernels."
            )
        return Decision("use_kernels", True, "your choice", source="user")
    if requested is False:
        return Decision("use_kernels", False, "your choice", source="user")
    reason = (
        "opt-in: replaces layers with kernels fetched from the Hub at load time (network + code from "
        "kernels-community); pass use_kernels=True to enable"
    )
    rejected = Rejected(True, why if not usable else "not enabled without being asked")
    if not machine.gpus:
        rejected = Rejected(True, "Hub layer kernels target CUDA; no GPU here")
    elif machine.hub.offline:
        rejected = Rejected(True, "HF_HUB_OFFLINE is set: layer kernels cannot be fetched")
    return Decision("use_kernels", False, reason, (rejected,))
