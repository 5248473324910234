"""The plan's `CheckProof`: the key of what `load()`'s test forward depends on that planning knows, and whether a
record of it passing is in cudaload's cache (plans/check_proof.py says why a proven check is skipped, and what
is judged again when applying: the checkpoint's files, the host, the installed packages).

The planning key is a hash of config.json's contents, the from_pretrained kwargs (dtype, attention, device,
kernels, quantization, revision, ...), the model class, the package versions that run the forward
(plans/check_proof.py `VERSIONED`: flash-attn 2/3/4, torchao and triton among them), the GPU driver, the
revision of each cached Hub kernel and this machine's fingerprint (`Machine.fingerprint`: CPU model and ISA,
cores, torch threads, GPUs). Only a local folder planned for the detected machine gets one: a Hub id's files
are not stat'ed here, and a simulated machine has run nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..capability.cache import cache_dir, cache_key, read_regular_file, untrusted
from ..facts.machine import Machine
from ..plans import CheckProof, Plan, jsonable
from ..plans.check_proof import VERSIONED, full_check_forced, judge
from ..version import __version__

__all__ = ["check_proof", "proof_versions"]


def proof_versions(machine: Machine) -> dict[str, str]:
    """The versions a proof holds: `VERSIONED` as this machine's software has them, cudaload's own, the GPU
    driver where detected and each cached Hub kernel's revision ("<commit> <variant>")."""
    versions = {dist: machine.software.version(dist) or "none" for dist in VERSIONED}
    kernels = {
        f"hub:{k.repo}": f"{k.revision or '?'} {k.cached_variant}" for k in machine.hub.kernels if k.cached_variant
    }
    return versions | kernels | {"cudaload": __version__, "driver": machine.software.driver or "none"}


def check_proof(model: str, plan: Plan, machine: Machine, overrides: Mapping[str, Any]) -> CheckProof | None:
    """The plan's `CheckProof` (`proven` set when a record under its key is there and the full check is not
    forced), or None when no record applies: not a local folder, a GGUF file, a folder cudaload must not
    read from or write to, or no config.json to hash."""
    folder = Path(model)
    subfolder = overrides.get("subfolder")
    if isinstance(subfolder, (str, os.PathLike)) and str(subfolder):
        folder = folder / subfolder
    if overrides.get("gguf_file") or not folder.is_dir():
        return None
    config = read_regular_file(folder / "config.json")
    if config is None:
        return None
    records = cache_dir() / "checks"
    if untrusted(records.parent) is not None or untrusted(records) is not None:
        return None  # neither read nor written: cache.read_json says why, once, when the probe reads there
    versions = proof_versions(machine)
    key = cache_key(
        {
            "config_sha256": hashlib.sha256(config).hexdigest(),
            "kwargs": jsonable(plan.kwargs),
            "auto_class": plan.auto_class,
            "model_class": plan.model_class,
            "folder": str(folder.resolve()),
            "versions": versions,
            "machine": machine.fingerprint(),
        }
    )
    proof = CheckProof(str(records / f"{key}.json"), key, versions, folder=str(folder.resolve()))
    if full_check_forced():
        return proof
    # Said when planning; load() judges it again when applying (the files, the host and the packages then).
    return replace(proof, proven=judge(proof).proven)
