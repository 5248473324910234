"""The plan's `CheckProof`: the key of everything `load()`'s test forward depends on, and whether a record of
it passing under that key is in cudaload's cache (plans/check_proof.py says why a proven check is skipped).

The key is a hash of config.json's contents, each file of the checkpoint's folder (name, size, modification
time: a rewritten weights file changes it), the from_pretrained kwargs (dtype, attention, device, kernels,
quantization, revision, ...), the model class, the package versions that run the forward and this machine's
fingerprint (`Machine.fingerprint`: CPU model and ISA, cores, torch threads, GPUs). Only a local folder
planned for the detected machine gets one: a Hub id's files are not stat'ed here, and a simulated machine
has run nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from ..capability.cache import cache_dir, cache_key, read_json, read_regular_file, untrusted
from ..facts.machine import Machine
from ..plans import CheckProof, Plan, jsonable
from ..plans.check_proof import CHECK_RECORD_KIND, CHECK_RECORD_SCHEMA, FULL_CHECK_ENV
from ..version import __version__

__all__ = ["RECORD_SPEC", "check_proof", "full_check_forced", "proof_versions"]

VERSIONED = ("torch", "transformers", "accelerate", "kernels", "bitsandbytes")
"""The packages whose code runs (or decides) the test forward: a new version of any of them proves anew."""

RECORD_SPEC = {
    "kind": str,
    "schema": int,
    "key": str,
    "proven_at": str,
    "versions": dict[str, str],
}
"""The layout a record must have to be read (loaders/check_record.py writes it); anything else is ignored."""


def full_check_forced(env: Mapping[str, str] | None = None) -> bool:
    """`CUDALOAD_VERIFY=full`: run the test forward on every load, proven or not."""
    return (os.environ if env is None else env).get(FULL_CHECK_ENV, "").strip().lower() == "full"


def proof_versions(machine: Machine) -> dict[str, str]:
    """The versions a proof holds: `VERSIONED` as this machine's software has them, and cudaload's own."""
    versions = {dist: machine.software.version(dist) or "none" for dist in VERSIONED}
    return versions | {"cudaload": __version__}


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
            "files": _files(folder),
            "kwargs": jsonable(plan.kwargs),
            "auto_class": plan.auto_class,
            "model_class": plan.model_class,
            "folder": str(folder.resolve()),
            "versions": versions,
            "machine": machine.fingerprint(),
        }
    )
    path = records / f"{key}.json"
    proof = CheckProof(str(path), key, versions)
    record = None if full_check_forced() else read_json(path, RECORD_SPEC)
    expected = (CHECK_RECORD_KIND, CHECK_RECORD_SCHEMA, key)
    if record is None or (record["kind"], record["schema"], record["key"]) != expected:
        return proof  # none, another layout, or (a renamed file) another key: the forward runs
    said = f"torch {versions['torch']}, transformers {versions['transformers']}"  # the record holds the rest
    return CheckProof(str(path), key, versions, f"proven on this machine at {_when(record['proven_at'])} for {said}")


def _files(folder: Path) -> list[tuple[str, int, int]]:
    """Each regular file of the checkpoint's folder as (name, size, modification time in ns): the weights,
    their index, the configs, any remote code. A rewritten file has a new time, and usually a new size."""
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file():
                continue
            info = entry.stat()
            found.append((entry.name, info.st_size, info.st_mtime_ns))
    return sorted(found)


def _when(stamp: str) -> str:
    """An ISO time as "2026-12-06 06:30 UTC" (as recorded when it does not parse)."""
    try:
        return datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M %Z").strip()
    except ValueError:
        return stamp
