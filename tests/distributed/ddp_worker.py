"""Run by torchrun (2 processes, gloo, CPU): a short DDP LoRA fine-tune through load_for_finetune.

Each rank trains on different data; DDP averages gradients, so the adapters must end equal on every
rank and, every tensor of them, different from the snapshot taken before training. Writes
rank-<N>.json into the output folder for the test to check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from adapters import identical_across_ranks, snapshot, trainable, unchanged
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
    # No weight decay: it would move the non-zero lora_A even with no gradient, so a change is a
    # gradient step.
    optimizer = torch.optim.AdamW(params.values(), lr=1e-2, weight_decay=0.0)
    ids = torch.randint(2, 256, (2, 16), generator=torch.Generator().manual_seed(100 + rank))
    losses = []
    for _ in range(3):
        loss = ddp(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())

    still = unchanged(before, params)
    report = {
        "rank": rank,
        "launch": vars(machine.launch) if hasattr(machine.launch, "__dict__") else None,
        "planned_device_map": plan.kwargs.get("device_map"),
        "device_decision": plan.decision("device_map").reason,
        "applied_device": model.cudaload_plan.device,
        "training_arguments": args,
        "losses": losses,
        "lora_tensors": len(params),
        "lora_unchanged": still,
        "lora_changed": len(still) < len(params),
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
