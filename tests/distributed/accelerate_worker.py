"""Run by `accelerate launch` (CPU): load_for_finetune, then a short LoRA fine-tune through
`Accelerator.prepare` (DDP over gloo when accelerate started several processes).

Each rank trains on different data; DDP averages gradients, so the adapters must end equal.
Writes rank-<N>.json into the output folder: what cudaload detected and planned, what was applied,
and the LoRA weights' state before and after.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from accelerate import Accelerator
from adapters import identical_across_ranks, lora_optimizer, lora_report, snapshot, train_steps, trainable
from worker_exit import exit_without_teardown

import cudaload


def main(model_path: str, out_dir: str) -> None:
    machine = cudaload.detect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", cudaload.CudaloadWarning)
        model = cudaload.load_for_finetune(model_path, quantize=None)
    applied = model.cudaload_plan
    # The plan's use_cpu is Accelerator's cpu=: without it accelerate on a CPU-only machine picks
    # DistributedType.NO under a multi-process launch and every rank trains alone (accelerate/state.py).
    accelerator = Accelerator(cpu=cudaload.training_arguments(model).get("use_cpu", False))
    params = trainable(model)
    prepared, optimizer = accelerator.prepare(model, lora_optimizer(params))
    # After prepare (DDP's broadcast made the ranks equal): lora_A starts random and non-zero, so
    # "changed" compares with this snapshot, not with zero.
    before = snapshot(params)
    rank = accelerator.process_index
    losses = train_steps(prepared, optimizer, rank, backward=accelerator.backward)
    report = {
        "rank": rank,
        "launch": vars(machine.launch),
        "accelerate": {
            "distributed_type": str(accelerator.distributed_type),
            "num_processes": accelerator.num_processes,
            "local_process_index": accelerator.local_process_index,
            "device": str(accelerator.device),
            "wrapped": type(prepared).__name__,
        },
        "plan": applied.plan.to_dict(),
        "applied": {"device": applied.device, "device_map": applied.device_map},
        "warnings": [str(w.message) for w in caught if issubclass(w.category, cudaload.CudaloadWarning)],
        "losses": losses,
        **lora_report(before, params),
        "lora_identical_across_ranks": identical_across_ranks(params),
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report, default=str))
    accelerator.wait_for_everyone()
    exit_without_teardown()  # while main's locals live: see worker_exit


if __name__ == "__main__":
    main(*sys.argv[1:3])
    exit_without_teardown()
