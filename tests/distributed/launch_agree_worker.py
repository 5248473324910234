"""Started by torchrun-node<N>.sh that `cudaload.launch_files()` wrote: load_for_finetune() under the launch,
with the process group initialized first ("group") or not ("store": the check goes through torchrun's store).

Writes ok-<rank>.json when the ranks agreed, or error-<rank>.txt with the LaunchMismatchError's message and exits
3 when they did not."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from worker_exit import exit_without_teardown

import cudaload
from cudaload.errors import LaunchMismatchError


def main(model_path: str, out_dir: str, mode: str) -> None:
    if mode == "group":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    try:
        cudaload.load_for_finetune(
            model_path,
            quantize=None,
            dtype="float32",
            lora={"lora_dropout": 0.0},
            gradient_checkpointing=False,
            seq_len=64,
            batch_size=1,
        )
    except LaunchMismatchError as exc:
        Path(out_dir, f"error-{rank}.txt").write_text(str(exc))
        sys.stdout.flush()
        os._exit(3)
    Path(out_dir, f"ok-{rank}.json").write_text(json.dumps({"rank": rank}))
    exit_without_teardown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_without_teardown()
