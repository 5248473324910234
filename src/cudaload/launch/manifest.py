"""The manifest a launch carries (`cudaload-launch.json`): what every rank must agree with (the layout, the
decisions, the model) and the digest of every other file of the set; written with `json.dumps`, read back as a
bounded regular file and checked against its schema (`read_manifest`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import LaunchManifestError
from ..plans import Plan
from ..regular_file import read_regular
from .job import LAUNCH_ENV, MANIFEST

__all__ = [
    "INVARIANT_SETTINGS",
    "MANIFEST_VERSION",
    "launch_invariants",
    "model_identity",
    "read_manifest",
    "sha256",
]

MANIFEST_VERSION = 3
"""`cudaload_launch` in the manifest: 2 adds the model's identity and the files' digests, 3 the node RAM you gave."""
INVARIANT_SETTINGS = ("parallelism", "train", "dtype", "attn_implementation", "quantize", "lora", "use_cache")
"""Decisions every rank must share with the plan made before the launch. The device (LOCAL_RANK's) and the
TrainingArguments flags a launcher sets for its rank differ by design and are not compared."""
MAX_BYTES = 1 << 20
"""A manifest is a few KiB; more is not one (`/dev/zero` would be read until memory runs out)."""
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def launch_invariants(plan: Plan) -> dict[str, Any]:
    """The decisions of `plan` a launched rank must reach too, and the quantization config it loads with."""
    values = {d.setting: d.value for d in plan.decisions if d.setting in INVARIANT_SETTINGS}
    values.setdefault("parallelism", None)
    if "quantization_config" in plan.kwargs:
        values["quantization_config"] = plan.kwargs["quantization_config"]
    read_back: dict[str, Any] = json.loads(json.dumps(values, default=str))  # as JSON has it: lists, not tuples
    return read_back


def model_identity(plan: Plan) -> dict[str, Any]:
    """What the plan's model is: its class and size, and for a local folder the digest of its config (its JSON,
    keys sorted) and the names and sizes of its weight files. A Hub id has no folder to read: class and size."""
    identity: dict[str, Any] = {"model_class": plan.model_class, "parameters": plan.parameters}
    folder = Path(plan.model)
    if not folder.is_dir():
        return identity
    config = folder / "config.json"
    if config.is_file():
        try:
            read = json.loads(config.read_bytes())
        except ValueError:
            read = None
        if read is not None:
            identity["config_sha256"] = sha256(json.dumps(read, sort_keys=True).encode())
    weights = sorted(p for p in folder.iterdir() if p.name.endswith(_WEIGHT_SUFFIXES) and p.is_file())
    identity["weights"] = {p.name: p.stat().st_size for p in weights}
    return identity


_SCHEMA: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "nodes": (int,),
    "ranks_per_node": (int,),
    "interconnect": (str, type(None)),
    "node_memory": (int, type(None)),
    "parallelism": (str,),
    "decisions": (dict,),
    "model_identity": (dict,),
    "files": (dict,),
}


def _schema_problems(manifest: Mapping[str, Any]) -> list[str]:
    problems = [
        f"{key!r} is {type(manifest.get(key)).__name__}, not {' or '.join(t.__name__ for t in types)}"
        if key in manifest
        else f"{key!r} is missing"
        for key, types in _SCHEMA.items()
        if key not in manifest
        or not isinstance(manifest[key], types)
        or (isinstance(manifest[key], bool) and bool not in types)
    ]
    for key in ("nodes", "ranks_per_node"):
        if isinstance(manifest.get(key), int) and not isinstance(manifest[key], bool) and manifest[key] < 1:
            problems.append(f"{key!r} is {manifest[key]}, not a count of at least 1")
    return problems


def read_manifest(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The manifest this rank was launched with (`CUDALOAD_LAUNCH`), or None outside such a launch.

    Raises:
        LaunchManifestError: the file cannot be read, is not a regular file of at most 1 MiB, is not JSON, or
            is not a manifest of this version (the message names the file and what is wrong).
    """
    where = env.get(LAUNCH_ENV)
    if not where:
        return None
    again = f"Copy the {MANIFEST} of the launch files to every node at that path, or unset {LAUNCH_ENV}."
    try:
        manifest = json.loads(read_regular(where, MAX_BYTES))
    except (OSError, ValueError) as exc:
        raise LaunchManifestError(
            f"{LAUNCH_ENV}={where!r} names the plan this launch was written from, but it cannot be read ({exc}). "
            + again
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("cudaload_launch") != MANIFEST_VERSION:
        found = manifest.get("cudaload_launch") if isinstance(manifest, dict) else type(manifest).__name__
        raise LaunchManifestError(
            f"{LAUNCH_ENV}={where!r} is not a cudaload launch manifest of version {MANIFEST_VERSION} "
            f"(cudaload_launch: {found!r}). Write the launch again with this cudaload (cudaload launch ...)."
        )
    problems = _schema_problems(manifest)
    if problems:
        raise LaunchManifestError(
            f"{LAUNCH_ENV}={where!r} is a damaged cudaload launch manifest: {'; '.join(problems)}. Write the launch "
            "again (cudaload launch ...) and copy it to every node."
        )
    manifest["path"] = where
    return manifest
