"""Started by the DeepSpeed launch files `cudaload.launch_files()` wrote (torchrun per "node", or
accelerate-launch.sh), or alone as the single-process reference: HF Trainer with `training_arguments()` (which
carries the plan's DeepSpeed config) runs a few LoRA steps on one global batch of `rows` rows.

Each step's global batch is the whole dataset (`rows` rows: one row a rank, or all of them in the single
process), so the ranks' mean loss must equal the single process's. Reports Trainer's logged losses, the engine
Trainer ran, each rank's share of the weights (ZeRO-3: `ds_tensor.numel()` over `ds_numel`), the peak RSS over
training against the RSS before loading (after the runtime's fixed cost: deepspeed imported, its process group
up and one collective run), the RSS at each stage, and the plan's per-rank estimate. Writes <mode>-<rank>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from launched_worker import SEQ, STEPS, _settle, _status, _warm_up
from transformers import Trainer, TrainerCallback, TrainingArguments
from worker_exit import exit_without_teardown

import cudaload
from cudaload.launch import launch_invariants


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows: int) -> None:
        self.ids = torch.randint(2, 256, (rows, SEQ), generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _share(model: torch.nn.Module, base_only: bool = False) -> float:
    """The fraction of the weights this rank holds: ZeRO-3's partition of each parameter, else all of it (of the
    base weights only with `base_only`: the LoRA adapters, added after loading, are partitioned by the engine)."""
    held = whole = 0
    for p in model.parameters():
        if base_only and p.requires_grad:
            continue
        numel = int(getattr(p, "ds_numel", p.numel()))
        held += int(p.ds_tensor.numel()) if hasattr(p, "ds_tensor") else numel
        whole += numel
    return held / whole


class Marks(TrainerCallback):
    """The RSS (now, and the peak since the last reset) after the engine's init and after each step."""

    def __init__(self, marks: dict[str, list[int]]) -> None:
        self.marks = marks

    def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.marks["engine"] = [_status("VmRSS"), _status("VmHWM")]

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.marks[f"step{state.global_step}"] = [_status("VmRSS"), _status("VmHWM")]


def _warm_up_runtime() -> None:
    """The fixed cost of a DeepSpeed rank before the model: deepspeed's modules (measured on this machine,
    2026-12-06: +24 MiB RSS), its process group (+5 MiB) and a first collective, which every rank pays whatever
    the model (Trainer would start them anyway; init_distributed does nothing the second time)."""
    import deepspeed

    deepspeed.init_distributed()
    dist.all_reduce(torch.ones(1024))
    _settle()


def main(model_path: str, mode: str, rows: str, out_dir: str) -> None:
    launched = mode != "single"
    _warm_up(model_path)
    marks = {"warm": [_status("VmRSS"), _status("VmHWM")]}
    if launched:
        _warm_up_runtime()
    baseline = _status("VmRSS")
    torch.manual_seed(0)  # the same LoRA initialisation in every process
    model = cudaload.load_for_finetune(
        model_path, quantize=None, dtype="float32", lora={"lora_dropout": 0.0}, gradient_checkpointing=False,
        seq_len=SEQ, batch_size=1,
    )  # fmt: skip
    plan = model.cudaload_plan.plan
    at_load = _share(model, base_only=True)  # ZeRO-3: partitioned by transformers' zero.Init while loading
    loaded = _status("VmHWM")
    marks["loaded"] = [_status("VmRSS"), loaded]
    extra = {} if launched else {"per_device_train_batch_size": int(rows)}
    kwargs = cudaload.training_arguments(
        model, output_dir=str(Path(out_dir, "trainer")), max_steps=STEPS, learning_rate=1e-2, report_to=[],
        save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True, **extra,
    )  # fmt: skip
    args = TrainingArguments(**kwargs)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(int(rows)), callbacks=[Marks(marks)])
    _settle()
    trainer.train()
    rank = args.process_index
    layout = plan.finetune.parallelism if plan.finetune is not None else None
    report = {
        "rank": rank,
        "world": args.world_size,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "engine": type(trainer.model_wrapped).__name__,
        "zero_stage": trainer.model_wrapped.zero_optimization_stage() if launched else None,
        "deepspeed": kwargs.get("deepspeed"),
        "share": _share(trainer.model_wrapped),
        "share_at_load": at_load,
        "parallelism": plan.decision("parallelism").value if layout is not None else None,
        "estimate": None if layout is None else layout["sizes"][layout["strategy"]],
        "invariants": launch_invariants(plan),
        "rss_baseline": baseline,
        "rss_load_peak": loaded,
        "rss_peak": _status("VmHWM"),
        "rss_marks": marks,
        "manifest": os.environ.get("CUDALOAD_LAUNCH"),
    }
    Path(out_dir, f"{mode}-{rank}.json").write_text(json.dumps(report, default=str))
    if launched:
        dist.barrier()
    exit_without_teardown()  # while main's locals live: see worker_exit


if __name__ == "__main__":
    main(*sys.argv[1:5])
    exit_without_teardown()
