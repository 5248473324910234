"""Which GPU decides for a process, and which CUDA device it makes current.

On GPUs of different compute capability one process is judged (dtype, attention) on the GPU it places the
model on, not the weakest; a quantized FSDP / ZeRO-3 rank and a pre-quantized checkpoint need the right
device current before they load, because transformers' quantizers read `torch.cuda.current_device()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import PlacementError
from ..facts.launch import zero_stage
from ..facts.machine import Gpu, Launch, Machine, Strategy
from ..facts.model import ModelFacts
from ..facts.placer import Landing
from ..plans import Decision, Plan, Rejected
from ..request import Request
from .fit import (
    HEADROOM,
    judge_fit,
    pinned_gpu,
)
from .memory import weight_bytes

__all__ = [
    "current_gpu_when_training",
    "decide_current_device",
    "decide_rank_device",
    "landed_machine",
    "placed_machine",
    "rank_gpu",
    "sharder",
]


def placed_machine(machine: Machine, model: ModelFacts, request: Request) -> Machine:
    """`machine` restricted to the one GPU a single process will place the model on, when its GPUs
    differ in compute capability; else `machine` itself (every GPU, or the weakest, decides).

    The GPU is the one your device_map pins, else the one `judge_fit` picks for a 16-bit copy (the most
    free memory), as `decide_placement` will: T4 + A100 puts Llama-3-8B on the A100, so the A100 decides
    bf16 and FlashAttention. A distributed launch keeps every GPU (all ranks must agree on the dtype);
    a spread (device_map "auto", or a copy too big for one GPU) keeps every GPU it may touch.
    This is the first guess of policy/settle.py `settle_placement`, which checks it against where the
    composed plan lands (`landed_machine`).
    """
    if not _mixed_single_process(machine):
        return machine
    pinned = pinned_gpu(request.device_map)
    if pinned is None:
        if request.device_map is not None:
            return machine
        # 2 bytes a parameter: bf16 or fp16, whichever the GPU runs (the size placement judges is no larger
        # once the dtype is chosen for that GPU; fp32 only where neither is native, which this GPU decides).
        fit = judge_fit(machine, weight_bytes(model, "bfloat16", None), HEADROOM)
        if not fit.fits or fit.gpu is None:
            return machine
        pinned = fit.gpu.index
    return _only(machine, pinned)


def rank_gpu(machine: Machine) -> int:
    """This rank's CUDA index: LOCAL_RANK, or 0 when the process sees one GPU (CUDA_VISIBLE_DEVICES set
    per rank)."""
    launch = machine.launch
    index = 0 if len(machine.gpus) == 1 else launch.local_rank
    if index >= len(machine.gpus):
        raise PlacementError(
            f"LOCAL_RANK={launch.local_rank} but this process sees {len(machine.gpus)} GPU(s): start at most "
            "one process per visible GPU (torchrun --nproc_per_node), or fix CUDA_VISIBLE_DEVICES."
        )
    return index


def decide_rank_device(machine: Machine, quantized: bool, device_map: Any) -> Decision | None:
    """The CUDA device to make current before a quantized FSDP / DeepSpeed ZeRO-3 rank loads (None when
    there is no such question). Those launches get no device_map, and bitsandbytes' quantizer then puts
    the whole model on `torch.cuda.current_device()` (transformers quantizers/quantizer_bnb_4bit.py and
    quantizer_bnb_8bit.py `update_device_map`: `device_map = {"": torch.cuda.current_device()}`), which
    is cuda:0 on every rank unless the process set it: every rank's copy would land on GPU 0."""
    launch = machine.launch
    if not (quantized and launch.distributed and launch.shards_parameters and machine.gpus) or device_map is not None:
        return None
    index = rank_gpu(machine)
    what = sharder(launch)
    return Decision(
        "cuda_device",
        index,
        f"torch.cuda.set_device({index}) before loading (LOCAL_RANK={launch.local_rank}): {what} takes no "
        "device_map, and bitsandbytes' quantizer then loads onto torch.cuda.current_device(), cuda:0 on every "
        "rank unless set",
        (Rejected(0, "every rank's quantized copy on GPU 0") if index else Rejected(None, "left to chance"),),
    )


def decide_current_device(machine: Machine, model: ModelFacts, device_map: Any) -> Decision | None:
    """The CUDA device to make current before a pre-quantized checkpoint loads on GPUs of different compute
    capability in one process (None when there is no such question).

    transformers' quantizers judge the *current* device (`torch.cuda.get_device_capability()`), not the one the
    weights go on: transformers 5.22-5.25 quantizers/quantizer_mxfp4.py: Mxfp4HfQuantizer.validate_environment,
    5.22-5.25 quantizers/quantizer_finegrained_fp8.py: FineGrainedFP8HfQuantizer.validate_environment,
    5.22-5.25 quantizers/quantizer_fbgemm_fp8.py: FbgemmFp8HfQuantizer.validate_environment, compressed-tensors.
    cudaload judges the GPU the model goes on (the weakest of a spread), so `load()` makes that GPU current
    (`torch.cuda.set_device`) and both judge the same one. Uniform GPUs need nothing: cuda:0 answers as any other
    would."""
    if model.quantization is None or machine.launch.distributed or len({g.arch for g in machine.gpus}) < 2:
        return None
    pinned = pinned_gpu(device_map)
    if pinned is None and device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        return None  # the CPU, or a map of your own: left as it is
    gpu = next((g for g in machine.gpus if g.index == pinned), None) or min(
        machine.gpus, key=lambda g: (g.capability, g.index)
    )
    where = "the GPU the model goes on" if pinned is not None else "the weakest GPU the spread may touch"
    return Decision(
        "cuda_device",
        gpu.index,
        f"torch.cuda.set_device({gpu.index}) before loading: {gpu.name} ({gpu.sm}) is {where}, and transformers' "
        "quantizers judge torch.cuda.current_device() (quantizer_mxfp4.py, quantizer_finegrained_fp8.py, "
        "quantizer_fbgemm_fp8.py `validate_environment`: torch.cuda.get_device_capability())",
        (Rejected(None, "cuda:0 would be judged, whatever GPU the weights go on"),),
    )


def landed_machine(machine: Machine, plan: Plan, landing: Landing | None = None) -> Machine:
    """`machine` restricted to the GPUs the plan's weights land on, when its GPUs differ in compute
    capability and a single process loads; else `machine` itself.

    The GPU the plan's device_map pins; for a spread, the GPUs that hold weights in `landing` (where
    transformers' own device_map="auto" puts them, facts/placer.py); a spread of unknown landing may touch
    every GPU. Offloaded layers run on a GPU of the map (accelerate's execution device), so "cpu" and
    "disk" add none."""
    if not _mixed_single_process(machine):
        return machine
    pinned = pinned_gpu(plan.kwargs.get("device_map"))
    if pinned is not None or landing is None:
        return _only(machine, pinned)
    filled = {int(device) for device, size in landing.items() if device.isdigit() and size > 0}
    chosen = tuple(g for g in machine.gpus if g.index in filled)
    return replace(machine, gpus=chosen) if chosen else machine


def _mixed_single_process(machine: Machine) -> bool:
    """GPUs of different compute capability, loaded by one process (a launch keeps every GPU: all ranks
    must agree on the dtype)."""
    return len({g.arch for g in machine.gpus}) >= 2 and not machine.launch.distributed


def _only(machine: Machine, index: int | None) -> Machine:
    """`machine` with GPU `index` alone (itself when no GPU has that index)."""
    chosen = tuple(g for g in machine.gpus if g.index == index)
    return replace(machine, gpus=chosen) if chosen else machine


def sharder(launch: Launch) -> str:
    return "FSDP" if launch.strategy == "fsdp" else "DeepSpeed ZeRO-3"


def current_gpu_when_training(machine: Machine) -> Gpu | None:
    """The GPU torch's current device is when the training script builds TrainingArguments (which judges tf32
    there): the launcher's LOCAL_RANK, else cuda:0 (torch's default)."""
    index = machine.launch.local_rank or 0
    return machine.gpus[index] if index < len(machine.gpus) else None


def as_launched(machine: Machine, parallel: Mapping[str, Any] | None) -> Machine:
    """A training plan for nodes x ranks (`parallel`: FinetunePlan.parallelism) is placed as the job's ranks place
    it (each rank passes its own LOCAL_RANK, a sharding strategy no device_map):

    - made outside the job, as the job's rank 0 places it, not as one process on this machine (issue 46:
      "cuda:0" for a 16-rank DDP job);
    - inside a rank whose launcher names no engine (torchrun, SLURM, mpirun: their "ddp" is only a default), with
      the plan's strategy, the one source of it: an FSDP rank under the emitted torchrun scripts loads as FSDP
      loads (no device_map), not as a DDP rank (issue 45: the 70B fsdp-hybrid rank got the whole model on its
      GPU). `accelerate launch` names its engine (ACCELERATE_USE_FSDP / DeepSpeed's variables): kept."""
    if parallel is None:
        return machine
    chosen, ranks = str(parallel["strategy"]), int(parallel["ranks_per_node"])
    stage = zero_stage(chosen)
    strategy: Strategy | None = (
        "ddp" if chosen == "ddp" else "fsdp" if chosen.startswith("fsdp") else "deepspeed" if stage else None
    )
    launch = machine.launch
    if launch.distributed:
        if launch.launcher == "accelerate" or launch.strategy != "ddp" or strategy in (None, "ddp"):
            return machine
        return replace(machine, launch=replace(launch, strategy=strategy, zero_stage=stage))
    world = int(parallel["nodes"]) * ranks
    if not machine.gpus or world <= 1 or strategy is None:  # one rank, or tensor parallelism: placed as planned
        return machine
    return replace(
        machine, launch=Launch(world_size=world, local_world_size=ranks, strategy=strategy, zero_stage=stage)
    )
