"""Inside a launched rank: hold this rank's plan against the manifest its launch carries (`check_launched_plan`),
refuse a process no launcher started (`check_launched_environment`), and give the plan arguments the launch was
planned with (`manifest_plan_arguments`). `load_for_finetune()` calls them, then `agree.py` makes every rank
reach the same verdict."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import LaunchMismatchError
from ..plans import Plan
from .job import LAUNCH_ENV, MANIFEST
from .manifest import launch_invariants, model_identity

__all__ = ["check_launched_environment", "check_launched_plan", "manifest_plan_arguments", "plan_differences"]

_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""What torchrun (and `accelerate launch`, which runs it) sets in every rank: torch 2.13 `torch.distributed.run`."""


def check_launched_environment(manifest: Mapping[str, Any], env: Mapping[str, str]) -> None:
    """Raise LaunchMismatchError when `CUDALOAD_LAUNCH` is set in a process that no launcher started."""
    missing = [name for name in _RANK_VARIABLES if name not in env]
    if missing and manifest["nodes"] * manifest["ranks_per_node"] > 1:  # one process needs no launcher
        where = manifest.get("path", MANIFEST)
        raise LaunchMismatchError(
            f"{LAUNCH_ENV}={where!r} says this process is a rank of a launch of {manifest['nodes']} node(s) x "
            f"{manifest['ranks_per_node']} ranks, but no launcher started it ({', '.join(missing)} not set). Run the "
            f"launch files (bash torchrun-node0.sh on node 0, ...), or unset {LAUNCH_ENV} to run this script alone."
        )


def manifest_plan_arguments(manifest: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """plan()'s arguments as the launch was planned: the parallelism asked, the link and the node RAM you gave
    (facts of the job's nodes, which a rank is not to replace with its own guesses). The layout is the
    launch's own (a rank reads it from its launcher, and the check compares it with the manifest's); a process
    of one (WORLD_SIZE 1 in `env`) plans the layout it is: 1 node x 1 rank."""
    args: dict[str, Any] = {"parallelism": manifest["parallelism"]}
    if manifest.get("interconnect"):
        args["interconnect"] = manifest["interconnect"]
    if manifest.get("node_memory") is not None:
        args["node_memory"] = manifest["node_memory"]
    if env is not None and env.get("WORLD_SIZE", "1").strip() in ("", "1"):
        args |= {"nodes": 1, "ranks_per_node": 1}
    return args


def _identity_differences(mine: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
    """The model's differences; a folder's config digest and weight files only where both sides read a folder."""
    keys = [k for k in ("model_class", "parameters") if k in planned] + [
        k for k in ("config_sha256", "weights") if k in mine and k in planned
    ]
    return [
        f"model {key}: this rank {json.dumps(mine.get(key))}, planned before the launch {json.dumps(planned.get(key))}"
        for key in keys
        if mine.get(key) != planned.get(key)
    ]


def plan_differences(plan: Plan, manifest: Mapping[str, Any]) -> list[str]:
    """Each difference between this rank's plan and the manifest's, with both values; empty when they agree."""
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
    if "model_identity" in manifest:
        differences[:0] = _identity_differences(model_identity(plan), manifest["model_identity"])
    return differences


def mismatch_message(plan: Plan, manifest: Mapping[str, Any], differences: list[str]) -> str:
    return (
        f"This rank's plan for {plan.model} differs from the plan its launch was written from "
        f"({manifest.get('model')}): " + "; ".join(differences) + ". Write the launch again on a machine like "
        "this one (cudaload launch ... with the same flags), or pass those settings explicitly."
    )


def check_launched_plan(plan: Plan, manifest: Mapping[str, Any]) -> None:
    """Raise LaunchMismatchError when this rank's plan differs from the launch's in a shared decision, the job's
    shape or the model, naming each difference with both values."""
    differences = plan_differences(plan, manifest)
    if differences:
        raise LaunchMismatchError(mismatch_message(plan, manifest, differences))
