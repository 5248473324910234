"""Run by torchrun (2 processes, CPU, gloo): `cudaload.load(path, tp_plan="auto")`, tensor parallel for
real through transformers' base_model_tp_plan. Each rank holds half of every sharded projection; the
logits must equal those of the whole model loaded in one process. Writes rank-<N>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM
from worker_exit import exit_without_teardown

import cudaload


def main(model_path: str, out_dir: str) -> None:
    machine = cudaload.detect()
    model = cudaload.load(model_path, tp_plan="auto", dtype="float32")
    applied = model.cudaload_plan
    rank = dist.get_rank()
    ids = torch.arange(1, 17).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        whole = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)(input_ids=ids).logits
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    report = {
        "rank": rank,
        "launch": vars(machine.launch),
        "plan": applied.plan.to_dict(),
        "applied": {"device": applied.device, "device_map": applied.device_map, "verified": applied.verified},
        "tp_size": getattr(model, "_tp_size", None),
        "q_proj_is_dtensor": isinstance(q_proj, DTensor),
        "q_proj_local_rows": q_proj.to_local().shape[0] if isinstance(q_proj, DTensor) else q_proj.shape[0],
        "q_proj_rows": q_proj.shape[0],
        "max_logit_difference": (logits - whole).abs().max().item(),
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report, default=str))
    dist.barrier()
    exit_without_teardown()  # while main's locals live: see worker_exit


if __name__ == "__main__":
    main(*sys.argv[1:3])
    exit_without_teardown()
