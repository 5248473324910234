"""Run by `accelerate launch --use_fsdp --fsdp_version 2` (2 processes, CPU): load_for_finetune under
an FSDP launch, then FSDP2 for real with torch's `fully_shard`, and a few steps that lower the loss.

accelerate 1.16 applies its FSDP plugin only on accelerators (the MULTI_GPU/NPU/XPU/... list in
AcceleratorState; MULTI_CPU is not there), so on a CPU `Accelerator`/`Trainer` silently fall back to
DDP; this worker records that, then shards each decoder layer and the root as accelerate's
`fsdp2_prepare_model` does on a GPU. Writes rank-<N>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from accelerate import Accelerator
from adapters import lora_optimizer, lora_report, snapshot, train_steps, trainable
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from worker_exit import exit_without_teardown

import cudaload


def main(model_path: str, quantize: str, out_dir: str) -> None:
    machine = cudaload.detect()
    model = cudaload.load_for_finetune(model_path, quantize=quantize, gradient_checkpointing=False)
    plan = model.cudaload_plan.plan
    accelerator = Accelerator(cpu=cudaload.training_arguments(model).get("use_cpu", False))
    rank = accelerator.process_index
    before = snapshot(trainable(model))  # whole tensors, before sharding
    for layer in model.get_base_model().model.layers:
        fully_shard(layer)
    fully_shard(model)
    params = trainable(model)  # the sharded DTensors now; compared whole (gathered) after training
    losses = train_steps(model, lora_optimizer(params), rank)  # the same batch every step: its loss must fall
    whole = sum(p.numel() for p in params.values())
    shard = sum(p.to_local().numel() for p in params.values() if isinstance(p, DTensor))
    report = {
        "rank": rank,
        "launch": vars(machine.launch),
        "plan": plan.to_dict(),
        "applied_device": model.cudaload_plan.device,
        "accelerate_distributed_type": str(accelerator.distributed_type),
        "accelerate_fsdp_plugin": getattr(accelerator.state, "fsdp_plugin", None) is not None,
        "sharded": all(isinstance(p, DTensor) for p in params.values()),
        "local_share": shard / whole,
        "losses": losses,
        **lora_report(before, params),
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report, default=str))
    accelerator.wait_for_everyone()
    exit_without_teardown()  # while main's locals live: see worker_exit


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_without_teardown()
