"""Started by launch files `cudaload.launch_files()` wrote (torchrun per "node", or `accelerate launch
--config_file`), or alone as the single-process reference: a few LoRA steps on one global batch.

Each rank takes its rows of the same global batch, so DDP / FSDP2 over the ranks must give the single
process's losses. `load_for_finetune()` reads the launch manifest (CUDALOAD_LAUNCH) and raises if its plan
differs from the one the launch was written from. Peak RSS is measured over the training steps (the kernel's
high-water mark, reset after loading: /proc/self/clear_refs "5") against the RSS before the model loaded,
and reported beside the plan's per-rank estimate. Writes <name>-<rank>.json.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from worker_exit import exit_without_teardown

import cudaload
from cudaload.launch import launch_invariants

STEPS = 3
SEQ = 64


def _status(field: str) -> int:
    """A /proc/self/status memory field in bytes (VmRSS: now, VmHWM: the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def _settle() -> None:
    """Free what loading left (Python garbage, glibc's free lists), then restart the peak from now."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def _warm_up(model_path: str) -> None:
    """Import what loading imports (peft, the model's modules) and run one tiny op of each kind training
    uses, so that the RSS baseline holds the code and the allocator's first arenas, not the model."""
    import accelerate.utils.fsdp_utils  # noqa: F401  (the FSDP2 preparation, and TrainingArguments' modules)
    import peft  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, TrainingArguments  # noqa: F401

    config = AutoConfig.from_pretrained(model_path)
    tiny = AutoModelForCausalLM.from_config(
        config.__class__(**{**config.to_dict(), "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64})
    )
    ids = torch.zeros((1, 4), dtype=torch.long)
    tiny(input_ids=ids, labels=ids).loss.backward()
    del tiny
    _settle()


def _warm_up_fsdp2() -> None:
    """The runtime's fixed cost before the baseline: FSDP2 (torch's fully_shard, its device mesh and collectives)
    shards a tiny module and runs one step, so what a rank grows by afterwards is the model's."""
    from torch.distributed.fsdp import fully_shard

    tiny = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    fully_shard(tiny[0])
    fully_shard(tiny)
    tiny(torch.ones(2, 64)).sum().backward()
    del tiny
    _settle()


def _shard(model: torch.nn.Module, rank: int) -> tuple[torch.nn.Module, dict[str, object]]:
    """FSDP2 as the accelerate config asked: accelerate 1.16 drops its FSDP plugin on a CPU (MULTI_CPU), so the
    plugin is built from the FSDP_* variables `accelerate launch` set from the YAML and handed to accelerate's own
    `fsdp2_prepare_model` (its wrap policy, reshard_after_forward, and with cpu_ram_efficient_loading rank 0's
    weights broadcast into the shards of the ranks that built the model on meta)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule

    plugin = FullyShardedDataParallelPlugin()
    wrap = set(plugin.transformer_cls_names_to_wrap or ())
    prepared = fsdp2_prepare_model(_CpuAccelerator(plugin, None, rank), model)
    # fully_shard swaps each module's class for an "FSDP<name>" subclass of FSDPModule and its own.
    wrapped = [m for m in prepared.modules() if isinstance(m, FSDPModule) and type(m).__name__[4:] in wrap]
    return prepared, {
        "fsdp_version": plugin.fsdp_version,
        "reshard_after_forward": plugin.reshard_after_forward,
        "wrap": sorted(wrap),
        "wrapped": len(wrapped),
        "cpu_ram_efficient_loading": plugin.cpu_ram_efficient_loading,
        "state_dict_type": str(plugin.state_dict_type),
    }


class _CpuAccelerator:
    """What accelerate 1.16 `fsdp2_prepare_model` reads of its Accelerator, on a CPU: `Accelerator()` there is
    MULTI_CPU and drops its FSDP plugin (`AcceleratorState`), so the ranks hand accelerate's own preparation the
    plugin and mesh Trainer would build from the plan's TrainingArguments."""

    def __init__(self, plugin: object, parallelism: object, rank: int) -> None:
        self.state = type("State", (), {"fsdp_plugin": plugin})()
        self.parallelism_config = parallelism
        self.torch_device_mesh = parallelism.build_device_mesh("cpu") if parallelism is not None else None
        self.mixed_precision = "no"
        self.is_main_process = rank == 0
        self.device = torch.device("cpu")


def _prepare_fsdp2(model: torch.nn.Module, rank: int, out_dir: str) -> tuple[torch.nn.Module, dict[str, object]]:
    """FSDP2 as the plan's TrainingArguments say (the torchrun launch): transformers' own TrainingArguments
    parses them into the plugin's arguments (`fsdp_plugin_args`, what Trainer builds its plugin from), then
    accelerate's `fsdp2_prepare_model` shards the model (rank 0's weights broadcast to the others)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from transformers import TrainingArguments

    args = TrainingArguments(**cudaload.training_arguments(model, output_dir=str(Path(out_dir, "trainer"))))
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    prepared = fsdp2_prepare_model(_CpuAccelerator(plugin, args.parallelism_config, rank), model)
    local = full = 0
    for param in prepared.parameters():
        full += param.numel()
        local += param.to_local().numel() if hasattr(param, "to_local") else param.numel()
    mesh = args.parallelism_config
    return prepared, {
        "plugin_args": args.fsdp_plugin_args,
        "mesh": None if mesh is None else [mesh.dp_replicate_size, mesh.dp_shard_size],
        "local_elements": local,
        "full_elements": full,
    }


def main(model_path: str, mode: str, rows: str, out_dir: str) -> None:
    world = int(rows)
    launched = mode != "single"
    if launched:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if launched else 0
    ranks = dist.get_world_size() if launched else 1
    _warm_up(model_path)
    if launched and mode.startswith("fsdp"):
        _warm_up_fsdp2()
    baseline = _status("VmRSS")
    torch.manual_seed(0)  # the same LoRA initialisation in every process (DDP's ranks and the single one)
    model = cudaload.load_for_finetune(
        model_path,
        quantize=None,
        dtype="float32",
        lora={"lora_dropout": 0.0},  # no dropout: the ranks and the single process compute the same thing
        gradient_checkpointing=False,
        seq_len=SEQ,
        batch_size=1,
    )
    plan = model.cudaload_plan.plan
    sharding: dict[str, object] = {}
    wrapped: torch.nn.Module = model
    if mode == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=False)
    elif mode == "fsdp":
        wrapped, sharding = _shard(model, rank)
    elif mode.startswith("fsdp-"):  # the torchrun launch of an FSDP2 plan (full or hybrid shard)
        wrapped, sharding = _prepare_fsdp2(model, rank, out_dir)
    params = [p for p in wrapped.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    batch = torch.randint(2, 256, (world, SEQ), generator=torch.Generator().manual_seed(7))
    mine = batch[rank * world // ranks : (rank + 1) * world // ranks]
    load_peak = _status("VmHWM")  # loading and sharding, before the first step
    _settle()
    loaded = _status("VmRSS")
    losses = []
    marks = []
    for _ in range(STEPS):
        loss = wrapped(input_ids=mine, labels=mine).loss
        marks.append(_status("VmHWM"))
        loss.backward()
        marks.append(_status("VmHWM"))
        optimizer.step()
        optimizer.zero_grad()
        value = loss.detach().clone()
        if launched:
            dist.all_reduce(value)
            value /= ranks
        losses.append(value.item())
    section = plan.finetune
    assert section is not None
    layout = section.parallelism
    report = {
        "rank": rank,
        "world": ranks,
        "losses": losses,
        "parallelism": plan.decision("parallelism").value if layout is not None else None,
        "layout": None if layout is None else [layout["nodes"], layout["ranks_per_node"]],
        "estimate": None if layout is None else layout["sizes"][layout["strategy"]],
        "weight_bytes": plan.weight_bytes,
        "device_map": plan.kwargs.get("device_map", "none"),
        "invariants": launch_invariants(plan),
        "rss_baseline": baseline,
        "rss_load_peak": load_peak,
        "rss_loaded": loaded,
        "applied_device": model.cudaload_plan.device,
        "verify_note": model.cudaload_plan.verify_note,
        "rss_marks": marks,
        "rss_peak": _status("VmHWM"),
        "sharding": sharding,
        "manifest": os.environ.get("CUDALOAD_LAUNCH"),
    }
    Path(out_dir, f"{mode}-{rank}.json").write_text(json.dumps(report, default=str))
    if launched:
        dist.barrier()
    exit_without_teardown()  # while main's locals live: see worker_exit


if __name__ == "__main__":
    main(*sys.argv[1:5])
    exit_without_teardown()
