"""Run by torchrun (2 processes, CPU): Trainer with cudaload.training_arguments() must run data
parallel (world size 2, gradients averaged), not each rank alone. Writes rank-<N>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from adapters import identical_across_ranks, snapshot, trainable, unchanged
from transformers import Trainer, TrainingArguments
from worker_exit import exit_without_teardown

import cudaload


class Rows(torch.utils.data.Dataset):
    def __init__(self, seed: int) -> None:
        self.ids = torch.randint(2, 256, (8, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(model_path: str, out_dir: str) -> None:
    model = cudaload.load_for_finetune(model_path, quantize=None)
    args = TrainingArguments(
        **cudaload.training_arguments(
            model,
            output_dir=out_dir,
            max_steps=3,
            per_device_train_batch_size=2,
            learning_rate=1e-2,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            seed=0,
        )
    )
    params = trainable(model)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(seed=0))
    # Trainer wraps the model in DDP only inside train(), so this snapshot precedes DDP's broadcast
    # of rank 0's weights: on rank 0 (whose report the test checks too) only training moves them.
    before = snapshot(params)
    trainer.train()
    still = unchanged(before, params)
    rank = args.process_index
    identical = identical_across_ranks(params) if dist.is_initialized() else None
    report = {
        "rank": rank,
        "world_size": args.world_size,
        "parallel_mode": str(args.parallel_mode),
        "use_cpu": args.use_cpu,
        "identical": identical,
        # Identical ranks prove nothing if nothing trained: compare with the snapshot too.
        "lora_tensors": len(params),
        "unchanged": still,
        "changed": len(still) < len(params),
        "steps": trainer.state.global_step,
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        # accelerate started the gloo group; tear it down before exit, or a rank can abort
        # ("terminate called without an active exception") while the other still talks to it.
        dist.barrier()
        dist.destroy_process_group()
    exit_without_teardown()  # while main's locals live: see worker_exit


if __name__ == "__main__":
    main(*sys.argv[1:3])
    exit_without_teardown()
