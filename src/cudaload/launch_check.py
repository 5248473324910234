"""Inside a launched rank: read the manifest the launch files carry (`CUDALOAD_LAUNCH`) and hold this rank's
plan against the plan the launch was written from (launch_writer.py). `load_for_finetune()` calls both."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import LaunchMismatchError
from .launch_writer import LAUNCH_ENV, launch_invariants
from .plans import Plan

__all__ = ["check_launched_plan", "manifest_plan_arguments", "read_manifest"]


def read_manifest(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The manifest this rank was launched with (`CUDALOAD_LAUNCH`), or None outside such a launch."""
    where = env.get(LAUNCH_ENV)
    if not where:
        return None
    try:
        manifest = json.loads(Path(where).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LaunchMismatchError(
            f"{LAUNCH_ENV}={where!r} names the plan this launch was written from, but it cannot be read ({exc}). "
            "Copy cudaload-launch.json to every node at that path, or unset the variable."
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("cudaload_launch") != 1:
        raise LaunchMismatchError(f"{LAUNCH_ENV}={where!r} is not a cudaload launch manifest (cudaload_launch: 1).")
    return manifest


def manifest_plan_arguments(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """plan()'s layout arguments as the launch was planned: the rank decides with the same facts."""
    args = {"nodes": manifest["nodes"], "parallelism": manifest["parallelism"]}
    if manifest.get("interconnect"):
        args["interconnect"] = manifest["interconnect"]
    return args


def check_launched_plan(plan: Plan, manifest: Mapping[str, Any]) -> None:
    """Raise LaunchMismatchError when this rank's plan differs from the launch's in a shared decision or in
    the job's shape, naming each difference with both values."""
    mine = launch_invariants(plan)
    planned = manifest["decisions"]
    differences = [
        f"{key}: this rank {json.dumps(mine.get(key))}, planned before the launch {json.dumps(planned.get(key))}"
        for key in sorted(set(mine) | set(planned))
        if mine.get(key) != planned.get(key)
    ]
    section = plan.finetune.parallelism if plan.finetune is not None else None
    shape = (section["nodes"], section["ranks_per_node"]) if section is not None else (1, 1)
    if shape != (manifest["nodes"], manifest["ranks_per_node"]):
        differences.insert(
            0,
            f"layout: this launch runs {shape[0]} node(s) x {shape[1]} ranks, planned {manifest['nodes']} x "
            f"{manifest['ranks_per_node']}",
        )
    if differences:
        raise LaunchMismatchError(
            f"This rank's plan for {plan.model} differs from the plan its launch was written from "
            f"({manifest.get('model')}): " + "; ".join(differences) + ". Write the launch again on a machine like "
            "this one (cudaload launch ... with the same flags), or pass those settings explicitly."
        )
