"""`CheckProof`: where the record of a passed test forward lives for a plan, and whether it applies here, now.

`load()` runs a short test forward after loading (loaders/verify.py). Once it has passed for a checkpoint
(its config.json contents and every file it resolves to), a dtype, an attention, a device, these package
versions and this machine, running it again on every load proves nothing new. The planner
(planner/check_proof.py) keys what it knows when planning (config, kwargs, classes, machine, driver, Hub kernel
revisions); what can change between planning and applying is judged when applying (`judge`, called by
loaders/check_record.py): the checkpoint's files as git's index trusts a file (size, mtime and ctime in ns,
inode, device: `touch -r`, `cp -p` or `tar x` restore a time, never the ctime), the host applying, the installed
packages that run the forward, and `CUDALOAD_VERIFY`. So a pickled plan, or one proven on another host, or
weights rewritten after planning, run the forward again. All of it is stat calls and folder listings: no
weight is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import field
from datetime import datetime
from pathlib import Path

from ..errors import SettingError
from ..frozen import frozen
from ..installed import dist_version, installed_versions
from ..regular_file import read_regular_or_none
from ..upstream_flash import FLASH_DISTRIBUTIONS

__all__ = [
    "CHECK_RECORD_KIND",
    "CHECK_RECORD_SCHEMA",
    "FULL_CHECK_ENV",
    "VERIFY_WORDS",
    "VERSIONED",
    "CheckProof",
    "Judged",
    "checkpoint_files",
    "full_check_forced",
    "judge",
]

CHECK_RECORD_KIND = "check-forward"
CHECK_RECORD_SCHEMA = 2  # 2: the key holds the files' ctime/inode/device, the host and the runtime packages
FULL_CHECK_ENV = "CUDALOAD_VERIFY"
"""`CUDALOAD_VERIFY=full` runs the test forward on every load, proven or not (as `load(verify="full")`)."""
VERIFY_WORDS = ("auto", "full")
"""What `CUDALOAD_VERIFY` may say: "auto" (the default: skip a proven forward) or "full" (run it every load)."""

VERSIONED = (
    "torch",
    "transformers",
    "accelerate",
    "kernels",
    "bitsandbytes",
    *sorted({dist for dist, _ in FLASH_DISTRIBUTIONS.values()}),  # flash-attn, flash-attn-3, flash-attn-4
    "torchao",
    "triton",
)
"""The packages whose code runs (or decides) the test forward: a new version of any of them proves anew."""

_MAX_RECORD_BYTES = 1 << 16
_MAX_INDEX_BYTES = 64 << 20


@frozen
class CheckProof:
    """Where a plan's test-forward record lives, and what it says (`Plan.check_proof`).

    Attributes:
        path: The record's file in cudaload's cache; the loader writes it after a full check passed.
        key: A hash of what the planner knows the check depends on: config.json's contents, the
            from_pretrained kwargs (dtype, attention, device, ...), the model class, the package versions,
            the GPU driver, the cached Hub kernels' revisions and the machine's fingerprint. The record is
            only believed under this key joined with what is judged when applying (`judge`): the
            checkpoint's files, the host and the installed packages then.
        versions: The package versions the key holds, written into the record and quoted when it is used.
        proven: "proven on this machine at <time> for <versions>" when a record applied when planning
            (said by `plan()`; `load()` judges it again when applying); None when the forward must run.
        folder: The checkpoint's folder (resolved), whose files are stat'ed when applying.
    """

    path: str
    key: str
    versions: Mapping[str, str] = field(default_factory=dict)
    proven: str | None = None
    folder: str = ""


@frozen
class Judged:
    """A proof judged when applying: the full `key` a passed forward is recorded under, and `proven` (the
    proof's line) when the record there holds that key."""

    key: str
    proven: str | None = None


def full_check_forced(env: Mapping[str, str] | None = None) -> bool:
    """`CUDALOAD_VERIFY=full`: run the test forward on every load, proven or not. Unset, empty or "auto":
    skip a proven one. Anything else raises SettingError (a typo must not silently skip a check)."""
    raw = (os.environ if env is None else env).get(FULL_CHECK_ENV)
    word = (raw or "").strip().lower()
    if word and word not in VERIFY_WORDS:
        raise SettingError(
            f"{FULL_CHECK_ENV}={raw!r}: accepted values are {' or '.join(repr(w) for w in VERIFY_WORDS)} "
            f'("full" runs the test forward on every load; "auto", the default, skips one proven before); '
            f"set one of them or unset {FULL_CHECK_ENV}."
        )
    return word == "full"


def checkpoint_files(folder: str | os.PathLike[str]) -> list[tuple[str, int, int, int, int, int]]:
    """Each file the checkpoint in `folder` resolves to, as git's index trusts a file: (name, size, mtime_ns,
    ctime_ns, inode, device). The folder's regular files (weights, their index, configs, remote code), and
    every shard a `*.index.json` names wherever it lies (a subfolder too). A symlink (the Hub cache's) is
    followed to its blob. A file that cannot be stat'ed counts as absent (-1s): its return is a change."""
    root = Path(folder)
    found: dict[str, tuple[str, int, int, int, int, int]] = {}
    indexes = []
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                found[entry.name] = _stat_row(entry.name, entry.stat())
                if entry.name.endswith(".index.json"):
                    indexes.append(root / entry.name)
    except OSError:
        return []
    for index in indexes:
        for name in _shards(index):
            if name not in found:
                try:
                    found[name] = _stat_row(name, os.stat(root / name))
                except OSError:
                    found[name] = (name, -1, -1, -1, -1, -1)
    return sorted(found.values())


def _stat_row(name: str, info: os.stat_result) -> tuple[str, int, int, int, int, int]:
    return (name, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def _shards(index: Path) -> set[str]:
    """The files a weights index's `weight_map` names (empty when it cannot be read)."""
    raw = read_regular_or_none(index, _MAX_INDEX_BYTES)
    try:
        weight_map = json.loads(raw or b"{}").get("weight_map") or {}
    except (ValueError, AttributeError, RecursionError):
        return set()
    return {v for v in weight_map.values() if isinstance(v, str)} if isinstance(weight_map, dict) else set()


def _runtime_versions() -> dict[str, str]:
    """The `VERSIONED` packages installed in this process now (folder names on sys.path: about a millisecond)."""
    installed = installed_versions()
    return {dist: dist_version(dist, installed) or "none" for dist in VERSIONED}


def judge(proof: CheckProof) -> Judged:
    """The proof judged here and now: its full key (the plan's key, the checkpoint's files, this host, the
    packages installed now) and whether the record at `proof.path` holds it."""
    key = hashlib.sha256(
        json.dumps(
            {
                "plan": proof.key,
                "files": checkpoint_files(proof.folder) if proof.folder else [],
                "host": socket.gethostname(),
                "packages": _runtime_versions(),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:32]
    raw = read_regular_or_none(Path(proof.path), _MAX_RECORD_BYTES)
    try:
        record = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict) or (record.get("kind"), record.get("schema"), record.get("key")) != (
        CHECK_RECORD_KIND,
        CHECK_RECORD_SCHEMA,
        key,
    ):
        return Judged(key)  # none, another layout, or another key: the forward runs
    versions = proof.versions
    said = f"torch {versions.get('torch', '?')}, transformers {versions.get('transformers', '?')}"
    return Judged(key, f"proven on this machine at {_when(str(record.get('proven_at')))} for {said}")


def _when(stamp: str) -> str:
    """An ISO time as "2026-12-06 06:30 UTC" (as recorded when it does not parse)."""
    try:
        return datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M %Z").strip()
    except ValueError:
        return stamp
