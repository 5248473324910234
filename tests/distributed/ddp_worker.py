"""Run by torchrun (2 processes, gloo, CPU): a short DDP LoRA fine-tune through load_for_finetune.

Each rank trains on different data; DDP averages gradients, so the adapters must end equal on every
rank and, every tensor of them, different from the snapshot taken before training. Writes
rank-<N>.json into the output folder for the test to check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from adapters import identical_across_ranks, lora_optimizer, lora_report, snapshot, train_steps, trainable
from torch.nn.parallel import DistributedDataParallel
from worker_exit import exit_without_teardown

import cudaload


def main(model_path: str, quantize: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    machine = cudaload.detect()
    model = cudaload.load_for_finetune(model_path, quantize=None if quantize == "none" else quantize)
    plan = model.cudaload_plan.plan
    args = cudaload.training_arguments(model)
    ddp = DistributedDataParallel(model, find_unused_parameters=args.get("ddp_find_unused_parameters", True))

    params = trainable(model)
    # lora_A starts random and non-zero, and DDP made the ranks equal at construction: "changed"
    # compares with this snapshot, taken after DDP's broadcast, not with zero.
    before = snapshot(params)
    losses = train_steps(ddp, lora_optimizer(params), rank)
    report = {
        "rank": rank,
        "launch": vars(machine.launch) if hasattr(machine.launch, "__dict__") else None,
        "planned_device_map": plan.kwargs.get("device_map"),
        "device_decision": plan.decision("device_map").reason,
        "applied_device": model.cudaload_plan.device,
        "training_arguments": args,
        "losses": losses,
        **lora_report(before, params),
        "lora_identical_across_ranks": identical_across_ranks(params),
        "quantized": "quantization_config" in plan.kwargs,
        # The same launch on a node with 2 GPUs: the device must follow LOCAL_RANK, not RANK.
        "device_map_on_2_gpus": cudaload.plan(
            model_path, machine=cudaload.Machine.simulated("A100", count=2, launch=machine.launch)
        ).kwargs.get("device_map"),
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report, default=str))
    dist.destroy_process_group()
    exit_without_teardown()  # while main's locals live: see worker_exit


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_without_teardown()
