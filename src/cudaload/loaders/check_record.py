"""The test forward's record: judged when applying, on the host applying (plans/check_proof.py `judge`: the
plan's key with the checkpoint's files, this host and the packages installed now), skipped when the record
there holds that key, written where the plan says after a full one passed (plans/check_proof.py says why).
A pickled plan, or one proven when planning, proves nothing by itself.

A skipped forward is not a load without checks: `apply_plan` still raises on weights the checkpoint does
not fill (`check_weights`) and reads the dtype, attention and device back from the loaded model
(`read_back`). The record is written here as cudaload's cache writes its files (a temporary file renamed
into place, mode 0600, in folders created 0700) without importing it: applying a plan reads no probe.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from ..plans import Plan
from ..plans.check_proof import CHECK_RECORD_KIND, CHECK_RECORD_SCHEMA, FULL_CHECK_ENV, Judged, full_check_forced, judge

__all__ = ["FORCE_HINT", "judge_proof", "proven_check", "record_passed"]

logger = logging.getLogger("cudaload.loaders")

FORCE_HINT = f'verify="full" or {FULL_CHECK_ENV}=full runs it'


def judge_proof(plan: Plan, *, verify: bool | str, training: bool) -> Judged | None:
    """The plan's proof judged now (before any weight is read, so a file rewritten during the load is not
    taken as proven), or None when there is none to judge or record: no `CheckProof`, `verify=False`, a model
    about to be trained (its forward runs in train mode). `CUDALOAD_VERIFY` is read here, when applying, and
    validated (SettingError for a value it does not take); "full" (or `verify="full"`) keeps the key, to
    record a pass, and drops the proof."""
    forced = full_check_forced()
    if plan.check_proof is None or not verify or training:
        return None
    judged = judge(plan.check_proof)
    return Judged(judged.key) if forced or verify == "full" else judged


def proven_check(plan: Plan, option: str, judged: Judged | None) -> str | None:
    """The proof ("proven on this machine at ... for ...") when the test forward of `option` may be skipped;
    None when it must run: nothing judged (`judge_proof`), another attention than the one planned (a
    fallback), or no record under the key judged when applying."""
    if judged is None or option != plan.kwargs.get("attn_implementation"):
        return None
    return judged.proven


def record_passed(plan: Plan, option: str, judged: Judged | None) -> bool:
    """Record that the test forward of the planned attention passed, at the plan's `CheckProof.path`;
    False when there is nothing to record (a fallback, no proof) or it cannot be written (the forward then
    runs again next time: a cost, not an error)."""
    proof = plan.check_proof
    if proof is None or judged is None or option != plan.kwargs.get("attn_implementation"):
        return False
    record = {
        "kind": CHECK_RECORD_KIND,
        "schema": CHECK_RECORD_SCHEMA,
        "key": judged.key,
        "proven_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": dict(proof.versions),
        "model": plan.model,
    }
    path = Path(proof.path)
    try:
        for folder in (path.parent.parent, path.parent):
            if not folder.is_dir():
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle, indent=2)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        logger.debug("could not record the passed test forward in %s (%s): it runs again next load", path, exc)
        return False
    return True
