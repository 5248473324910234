"""Whether Hub kernels (`kernels` package) can be used here, and `use_kernels`."""

from __future__ import annotations

from ..errors import MissingPackageError, SettingError
from ..facts.machine import Machine
from ..facts.packages import install_hint
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


# transformers before 5.25 maps one layer to a CPU Hub kernel (5.22 integrations/hub_kernels.py
# `_KERNEL_MAPPING["MegaBlocksMoeMLP"]["cpu"]`: kernels-community/megablocks `CPUMegaBlocksMoeMLP`, gpt-oss);
# 5.25's mapping has no "cpu" entry, so there use_kernels=True on a CPU would fetch nothing it could use.
CPU_LAYER_KERNELS_UNTIL = "5.25.0"


def decide_use_kernels(machine: Machine, requested: bool | None) -> Decision:
    """use_kernels, always passed to from_pretrained: transformers 5.25 turns it on when it is not passed
    (modeling_utils.py `PreTrainedModel.from_pretrained`: `use_kernels = kwargs.pop("use_kernels", None)`, then
    True unless USE_HUB_KERNELS disables it), which would swap layers for Hub code nobody asked for."""
    usable, why = kernels_status(machine)
    disabled = machine.hub.layer_kernels_disabled
    if requested is True:
        if not usable:
            raise MissingPackageError(
                f"use_kernels=True was asked, but {why}. Install a matching `kernels` or drop use_kernels."
            )
        if disabled is not None:
            raise SettingError(
                f"use_kernels=True was asked, but {disabled} turns Hub layer kernels off in transformers (it "
                "would load without them and only log it). Unset USE_HUB_KERNELS, or drop use_kernels."
            )
        if not machine.gpus and machine.software.at_least("transformers", CPU_LAYER_KERNELS_UNTIL):
            raise MissingPackageError(
                "use_kernels=True was asked, but this machine has no CUDA GPU and transformers "
                f"{machine.software.version('transformers')} maps no layer to a CPU Hub kernel (its "
                "integrations/hub_kernels.py mapping has no 'cpu' entry since 5.25). Drop use_kernels."
            )
        return Decision("use_kernels", True, "your choice", source="user")
    if requested is False:
        return Decision("use_kernels", False, "your choice", source="user")
    reason = (
        "opt-in: replaces layers with kernels fetched from the Hub at load time (network + code from "
        "kernels-community); pass use_kernels=True to enable"
    )
    rejected = Rejected(True, why if not usable else "not enabled without being asked")
    if disabled is not None:
        rejected = Rejected(True, f"{disabled} turns Hub layer kernels off")
    elif not machine.gpus:
        rejected = Rejected(True, "Hub layer kernels target CUDA; no GPU here")
    elif machine.hub.offline:
        rejected = Rejected(True, "HF_HUB_OFFLINE is set: layer kernels cannot be fetched")
    return Decision("use_kernels", False, reason, (rejected,))
