"""`CheckProof`: where the record of a passed test forward lives for a plan, and whether one is there.

`load()` runs a short test forward after loading (loaders/verify.py). Once it has passed for a checkpoint
(its config.json contents and weight files), a dtype, an attention, a device, these package versions and
this machine, running it again on every load proves nothing new: the planner (planner/check_proof.py) reads
the record into the plan, and the loader skips the forward when the plan says it is proven (still checking
that every weight loaded and reading the dtype and attention back), or writes the record after a full
check passed (loaders/check_record.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CHECK_RECORD_KIND", "CHECK_RECORD_SCHEMA", "FULL_CHECK_ENV", "CheckProof"]

CHECK_RECORD_KIND = "check-forward"
CHECK_RECORD_SCHEMA = 1
FULL_CHECK_ENV = "CUDALOAD_VERIFY"
"""`CUDALOAD_VERIFY=full` runs the test forward on every load, proven or not (as `load(verify="full")`)."""


@dataclass(frozen=True)
class CheckProof:
    """Where a plan's test-forward record lives, and what it says (`Plan.check_proof`).

    Attributes:
        path: The record's file in cudaload's cache; the loader writes it after a full check passed.
        key: A hash of what the check depends on: config.json's contents, the weight files (size and
            modification time), the from_pretrained kwargs (dtype, attention, device, ...), the model
            class, the torch/transformers/accelerate/kernels/bitsandbytes versions and the machine's
            fingerprint. A record is only believed under the same key.
        versions: The package versions the key holds, written into the record and quoted when it is used.
        proven: "proven on this machine at <time> for <versions>" when a record under `key` is there
            (the loader then skips the forward); None when the forward must run.
    """

    path: str
    key: str
    versions: Mapping[str, str] = field(default_factory=dict)
    proven: str | None = None
