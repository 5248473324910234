"""Run by a launcher: what cudaload detects and plans in this process, without loading a model.

Writes proc-<pid>.json (not rank-<N>.json: a launcher that starts lone processes would give each
RANK 0), so the test counts the processes the launcher really started.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import cudaload
from cudaload.facts.model import reference_model


def main(out_dir: str) -> None:
    machine = cudaload.detect()
    plan = cudaload.plan(reference_model(), finetune=True, quantize=None, probe=False)
    report = {"launch": vars(machine.launch), "plan": plan.to_dict()}
    Path(out_dir, f"proc-{os.getpid()}.json").write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
