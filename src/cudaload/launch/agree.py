"""Every launched rank reaches the same verdict before the first training collective: each publishes its plan's
digest and its own check's differences, reads every other rank's, and all go on or all raise the same
LaunchMismatchError, naming the ranks that differ and how.

The exchange goes through the process group when the script initialized one (a gloo group of its own with a
timeout, torch 2.13 `torch.distributed.new_group` and `all_gather_object`), else through the store torchrun's
agent hosts at MASTER_ADDR:MASTER_PORT (torch 2.13 `torch.distributed.rendezvous._create_c10d_store`: with
TORCHELASTIC_USE_AGENT_STORE=True every rank is its client), under keys of its own. Without either (no torchrun)
there is no one to ask, and each rank's own check stands alone."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from ..errors import LaunchMismatchError
from ..plans import Plan
from .check import check_launched_environment, check_launched_plan, plan_differences
from .manifest import launch_invariants, model_identity, sha256

__all__ = ["AGREE_TIMEOUT_S", "agree_across_ranks", "check_launch", "rank_record", "verdict"]

AGREE_TIMEOUT_S = 300.0
"""How long a rank waits for the others' plans: they plan at the same moment, so a rank that has not reported
by then failed before (its own output says why)."""
_PREFIX = "cudaload-launch/plan/"


def rank_record(plan: Plan, rank: int, differences: Sequence[str]) -> dict[str, Any]:
    """What a rank tells the others: its plan's digest (decisions, layout, model) and its check's differences."""
    section = plan.finetune.parallelism if plan.finetune is not None else None
    shared = {
        "decisions": launch_invariants(plan),
        "layout": None if section is None else [section["nodes"], section["ranks_per_node"]],
        "model": model_identity(plan),
    }
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "digest": sha256(json.dumps(shared, sort_keys=True).encode()),
        "shared": shared,
        "differences": list(differences),
    }


def _compare(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """How the ranks' plans differ from rank 0's, key by key."""
    first = records[0]
    lines = []
    for record in records[1:]:
        if record["digest"] == first["digest"]:
            continue
        for part in ("decisions", "layout", "model"):
            a, b = first["shared"][part], record["shared"][part]
            if isinstance(a, dict) and isinstance(b, dict):
                lines += [
                    f"{part} {key}: rank {first['rank']} {json.dumps(a.get(key))}, rank {record['rank']} "
                    f"{json.dumps(b.get(key))}"
                    for key in sorted(set(a) | set(b))
                    if a.get(key) != b.get(key)
                ]
            elif a != b:
                lines.append(f"{part}: rank {first['rank']} {json.dumps(a)}, rank {record['rank']} {json.dumps(b)}")
    return lines


def verdict(records: Sequence[Mapping[str, Any]], model: str) -> str | None:
    """The message every rank raises (the same text from the same records), or None when all agree."""
    records = sorted(records, key=lambda r: r["rank"])
    failed = [r for r in records if r["differences"]]
    across = _compare(records)
    if not failed and not across:
        return None
    parts = [f"rank {r['rank']} ({r['host']}): " + "; ".join(r["differences"]) for r in failed]
    if across:
        parts.append("the ranks' plans differ from each other: " + "; ".join(across))
    agreeing = [r["rank"] for r in records if not r["differences"]]
    return (
        f"The launched ranks of {model} do not all agree with the plan their launch was written from, so every rank "
        f"stops: {' | '.join(parts)}. Ranks that agree with it: {agreeing or 'none'}. Write the launch again on a "
        "machine like the ranks' (cudaload launch ... with the same flags), copy the same files to every node, or "
        "pass the planned settings explicitly."
    )


def _through_group(record: Mapping[str, Any], world: int, timeout_s: float) -> list[Any]:
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    gathered: list[Any] = [None] * world
    try:
        dist.all_gather_object(gathered, dict(record), group=group)
    finally:
        dist.destroy_process_group(group)
    return gathered


def _through_store(record: Mapping[str, Any], env: Mapping[str, str], world: int, timeout_s: float) -> list[Any]:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # exported from torch._C at runtime

    run = f"{_PREFIX}{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s))
    store.set(f"{run}{record['rank']}", json.dumps(record))
    keys = [f"{run}{r}" for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # torch's DistStoreError is a RuntimeError
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        raise LaunchMismatchError(
            f"The launched ranks compare their plans before training, but rank(s) {missing} did not report theirs "
            f"within {timeout_s:.0f} s ({exc}): they failed before (see their output), so every rank stops."
        ) from exc
    return [json.loads(store.get(key)) for key in keys]


def agree_across_ranks(
    plan: Plan, differences: Sequence[str], env: Mapping[str, str], timeout_s: float = AGREE_TIMEOUT_S
) -> None:
    """Exchange this rank's record with every other rank's; raise the same LaunchMismatchError on every rank when
    any rank's check failed or their plans differ. With no way to reach the others it returns: the rank's own
    check stands alone."""
    world = int(env.get("WORLD_SIZE", "1") or 1)
    rank = int(env.get("RANK", "0") or 0)
    record = rank_record(plan, rank, differences)
    records: list[Any] | None = None
    if world > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            records = _through_group(record, world, timeout_s)
        elif env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
            records = _through_store(record, env, world, timeout_s)
    if records is None:
        return
    message = verdict(records, plan.model)
    if message is not None:
        raise LaunchMismatchError(message)


def check_launch(
    plan: Plan, manifest: Mapping[str, Any], env: Mapping[str, str] | None = None, timeout_s: float = AGREE_TIMEOUT_S
) -> None:
    """A launched rank's whole check, before it loads a weight: started by a launcher, then its plan against the
    manifest, agreed with every other rank (all go on or all raise the same message), then on its own.

    Raises:
        LaunchMismatchError: no launcher started this process, or any rank's plan differs from the manifest or
            from another rank's.
    """
    env = os.environ if env is None else env
    check_launched_environment(manifest, env)
    agree_across_ranks(plan, plan_differences(plan, manifest), env, timeout_s)
    check_launched_plan(plan, manifest)
