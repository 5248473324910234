"""device_map (and max_memory): one GPU when the model fits with headroom, spread with an
explicit max_memory when it must, loud about CPU/disk offload; per-rank under torchrun."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import PlacementError
from ..facts.machine import Gpu, Machine
from ..plans import Decision, Plan, Rejected
from .current_device import rank_gpu, sharder
from .devices import check_device_map
from .fit import (
    HEADROOM,
    TRAINING_SHARE,
    Fit,
    format_bytes,
    judge_fit,
    max_memory_size,
    percent,
    size_bytes,
)

__all__ = [
    "decide_placement",
    "judge_upstream_placement",
    "weights_phrase",
]


# decide_placement's answer: (device_map decision, max_memory or None, warnings).
_Placement = tuple[Decision, dict[Any, str] | None, tuple[str, ...]]


def decide_placement(
    machine: Machine,
    weight_bytes: int,
    requested: Any = None,
    quantized: bool = False,
    training_bytes: int | None = None,
    tensor_parallel: Decision | None = None,
    tp_requested: bool = False,
    caps: Mapping[Any, Any] | None = None,
    trained: str = "LoRA",
) -> tuple[Decision, dict[Any, str] | None, tuple[str, ...]]:
    """(device_map decision, max_memory or None, warnings). `trained`: what training adds beside the weights and
    AdamW, as the reasons name it ("LoRA", or "gradients" in full training).

    `caps` is your max_memory (checked by devices.py `check_max_memory`): a single process places the model
    within them (`_capped_placement`), and a device_map of one device with them is refused (transformers would
    ignore them).

    Whether the model fits one GPU is judged on `training_bytes` (the whole training estimate,
    against TRAINING_SHARE of free memory) when fine-tuning, else on the weights (against HEADROOM).
    `tensor_parallel` is decide_tensor_parallel's answer; `tp_requested`: the caller passed a tp_plan
    (or distributed_config), which transformers refuses to combine with a device_map.
    """
    if requested is not None:
        if caps is not None:
            _refuse_ignored_caps(requested, caps)
        return _user_placement(machine, requested, quantized), None, ()
    if caps is not None and not machine.launch.distributed:
        return _capped_placement(machine, weight_bytes, caps)
    if tp_requested or (tensor_parallel is not None and tensor_parallel.value == "auto"):
        return _tensor_parallel_placement(tp_requested), None, ()
    launch = machine.launch
    if launch.distributed and launch.shards_parameters:
        return _sharded_placement(machine, weight_bytes)
    weights = judge_fit(machine, weight_bytes, HEADROOM)
    if launch.distributed and tensor_parallel is not None and not weights.fits:
        return _rank_spread_placement(machine, weights, tensor_parallel)
    if launch.distributed:
        return _rank_placement(machine), None, ()
    if not machine.gpus:
        return _cpu_placement(machine, weight_bytes)
    return _gpu_placement(machine, weights, training_bytes, quantized, trained)


# transformers reads max_memory only to infer a device_map from one of these strategies (integrations/accelerate.py
# `_get_device_map`: `if isinstance(device_map, str)` after `check_and_set_device_map` turned "cuda:0", 0 or a
# torch.device into {"": device}); with any other device_map it is never read.
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_CAPS_IGNORED = (
    "transformers reads max_memory only to infer a device_map for 'auto', 'balanced', 'balanced_low_0' or "
    "'sequential' (integrations/accelerate.py `_get_device_map`) and ignores it otherwise"
)


def _refuse_ignored_caps(device_map: Any, caps: Mapping[Any, Any]) -> None:
    if isinstance(device_map, str) and device_map in _STRATEGIES:
        return
    raise PlacementError(
        f"max_memory={dict(caps)!r} was given with device_map={device_map!r}: {_CAPS_IGNORED}, so your caps would "
        "be dropped. Pass device_map='auto' (or leave device_map unset) to have them honoured, or drop max_memory."
    )


def _capped_placement(machine: Machine, weight_bytes: int, caps: Mapping[Any, Any]) -> _Placement:
    """Your max_memory, applied: device_map "auto" (a single device would ignore the caps) and where the weights
    land within them. accelerate fills the GPUs named, then the "cpu" cap, then disk: a device not named gets
    nothing, and without a "cpu" key transformers sends the rest straight to disk (integrations/accelerate.py
    `_init_infer_auto_device_map`: `if "disk" not in devices: devices.append("disk")`)."""
    gpus = sum(size_bytes(v) for k, v in caps.items() if isinstance(k, int))
    cpu = size_bytes(caps["cpu"]) if "cpu" in caps else 0
    on_gpus = min(weight_bytes, gpus)
    on_cpu = min(weight_bytes - on_gpus, cpu)
    on_disk = weight_bytes - on_gpus - on_cpu
    size = weights_phrase(weight_bytes)
    landing = ", ".join(
        f"~{format_bytes(n)} on {where}"
        for n, where in ((on_gpus, "the GPUs"), (on_cpu, "the CPU"), (on_disk, "disk"))
        if n or (where == "the GPUs" and machine.gpus)
    )
    single = machine.gpus[0].device if machine.gpus else "cpu"
    decision = Decision(
        "device_map",
        "auto",
        f"your max_memory is applied ({landing}): {_CAPS_IGNORED}",
        (Rejected(single, "transformers would ignore your max_memory"),),
    )
    warnings: tuple[str, ...] = ()
    if on_cpu or on_disk:
        where = " and ".join(f"~{format_bytes(n)} to {name}" for n, name in ((on_cpu, "CPU"), (on_disk, "disk")) if n)
        no_cpu = "" if "cpu" in caps else " (your max_memory has no 'cpu' key: transformers then adds 'disk')"
        warnings = (
            f"{size} exceed your max_memory on the GPUs: {where} will be offloaded{no_cpu}, and every forward "
            "copies them back (very slow). Raise the caps, quantize, or use a smaller model.",
        )
    return decision, None, warnings


def _user_placement(machine: Machine, device_map: Any, quantized: bool) -> Decision:
    launch = machine.launch
    if launch.distributed and device_map == "auto":
        if quantized:
            raise PlacementError(
                f"device_map='auto' was asked for a quantized model under {launch.launcher or 'a launcher'} with "
                f"WORLD_SIZE={launch.world_size}: 'auto' splits the model across this node's GPUs and breaks data "
                f"parallelism. Leave device_map unset (cudaload gives each rank {{'': LOCAL_RANK}})."
            )
        raise PlacementError(
            f"device_map='auto' was asked under WORLD_SIZE={launch.world_size}: transformers refuses to train a "
            "model loaded with device_map='auto' in any distributed mode. Leave device_map unset."
        )
    check_device_map(machine, device_map)
    return Decision("device_map", device_map, "your choice", source="user")


def _tensor_parallel_placement(tp_requested: bool) -> Decision:
    who = "your tp_plan" if tp_requested else "tp_plan='auto'"
    return Decision(
        "device_map",
        None,
        f"{who} places each rank's shard on its own device (cuda:LOCAL_RANK, or the CPU): no device_map",
        (Rejected("auto", "transformers refuses tp_plan together with a device_map"),),
    )


def _sharded_placement(machine: Machine, weight_bytes: int) -> _Placement:
    """FSDP / DeepSpeed ZeRO-3: the framework places the shards, so no device_map."""
    what = sharder(machine.launch)
    cpu_notes: tuple[str, ...] = ()
    ranks = max(machine.launch.local_world_size, 1)
    ram = machine.cpu.memory_available
    if ram is not None and weight_bytes * ranks > ram * HEADROOM:
        # load_for_finetune() has one rank read the weights: an FSDP2 plan's other ranks build the model on meta
        # (loaders/fsdp_loading.py), a ZeRO-3 plan's partition at load (loaders/zero3_loading.py). Another load reads
        # the whole checkpoint on every rank: transformers 5.22-5.25 `PreTrainedModel._load_pretrained_model` does,
        # FSDP's cpu_ram_efficient_loading included, and sees no ZeRO-3 context (`is_deepspeed_zero3_enabled()`).
        how = "builds the other ranks' model on the meta device" if what == "FSDP" else "partitions at load"
        cpu_notes = (
            f"{what} loading: unless loaded by load_for_finetune() (which {how}), each of the {ranks} ranks on this "
            f"node reads a full ~{format_bytes(weight_bytes)} copy into CPU RAM before {what} shards it (transformers "
            f"reads the whole checkpoint on every rank): ~{format_bytes(weight_bytes * ranks)} against "
            f"{format_bytes(ram)} of RAM: expect an OOM kill.",
        )
    if not machine.gpus and what == "FSDP":  # DeepSpeed runs on its CPU accelerator (DS_ACCELERATOR=cpu, gloo)
        # accelerate (1.16) switches to FSDP / DeepSpeed only on accelerators: AcceleratorState keeps
        # DistributedType.MULTI_CPU and drops the plugin (accelerate/state.py), with no message.
        cpu_notes += (
            f"{what} on a CPU-only machine: accelerate (and so Trainer) applies its {what} plugin only on GPUs "
            "and runs plain DDP here without a word. To shard on CPU, run accelerate's own preparation "
            "(accelerate.utils.fsdp_utils.fsdp2_prepare_model; see cudaload's distributed docs): it broadcasts "
            "rank 0's weights, and load_for_finetune() reads unquantized weights on rank 0 only, so neither DDP "
            "nor a bare torch fully_shard can train the other ranks.",
        )
    decision = Decision(
        "device_map",
        None,
        f"{what} shards and places parameters itself: no device_map",
        (Rejected("auto", f"conflicts with {what} sharding"),),
    )
    return decision, None, cpu_notes


def _rank_spread_placement(machine: Machine, weights: Fit, tensor_parallel: Decision) -> _Placement:
    """A distributed rank whose copy fits no single GPU and that tensor parallelism cannot shard."""
    launch = machine.launch
    # Every rank of this node holds a whole copy spread over the node's GPUs, so each gets
    # 1/local_world_size of each GPU (fit.py divides the spread) and of the RAM.
    ranks = max(launch.local_world_size, 1)
    size = weights_phrase(weights.need)
    why_not_tp = tensor_parallel.reason.removeprefix("not tensor parallel: ")
    spread = _gpu_max_memory(weights)
    notes: tuple[str, ...] = ()
    if not weights.fits_spread:
        ram = machine.cpu.memory_available or 0
        spread["cpu"] = max_memory_size(ram * HEADROOM / ranks)
        notes = (
            f"{size} per rank exceed this rank's share of the GPUs ({ranks} ranks per node each hold a copy): "
            "the rest is offloaded to CPU. Run one process (python, not torchrun) or a model TP can shard.",
        )
    decision = Decision(
        "device_map",
        "auto",
        f"{size} exceed one GPU and tensor parallelism is out ({why_not_tp}): "
        f"this rank's copy spreads over the {len(weights.spread)} GPUs with max_memory = 1/{ranks} of each "
        f"({percent(HEADROOM)} of free memory, shared by the node's {ranks} ranks)",
        (Rejected({"": launch.local_rank}, f"{size} exceed {format_bytes(weights.budget)} usable on {weights.where}"),),
    )
    return decision, spread, notes


def _rank_placement(machine: Machine) -> Decision:
    """A data-parallel rank: the whole copy on this rank's own device."""
    launch = machine.launch
    if not machine.gpus:
        return Decision("device_map", "cpu", f"rank {launch.rank}/{launch.world_size} on CPU (gloo)")
    index = rank_gpu(machine)
    return Decision(
        "device_map",
        {"": index},
        f"{launch.strategy or 'data'}-parallel rank {launch.rank}/{launch.world_size}: the whole model on this "
        f"rank's GPU (LOCAL_RANK={launch.local_rank}, not the global rank)",
        (Rejected("auto", "splits the model across GPUs and breaks data parallelism"),),
    )


def _cpu_placement(machine: Machine, weight_bytes: int) -> _Placement:
    size = weights_phrase(weight_bytes)
    warnings: tuple[str, ...] = ()
    available = machine.cpu.memory_available
    if available is not None and weight_bytes > available * HEADROOM:
        warnings = (f"{size} but only {format_bytes(available)} of RAM available: expect swapping or an OOM kill.",)
    return Decision("device_map", "cpu", f"no CUDA GPU: {size} in RAM"), None, warnings


def _gpu_placement(
    machine: Machine, weights: Fit, training_bytes: int | None, quantized: bool, trained: str = "LoRA"
) -> _Placement:
    """One process with GPUs: one GPU when the copy (or the training run) fits it, else a spread."""
    if training_bytes is None:
        fit, what = weights, weights_phrase(weights.need)
    else:
        # The same judgement quantize="auto" made (quantization.py), on the same GPU.
        fit = judge_fit(machine, training_bytes, TRAINING_SHARE)
        what = f"~{format_bytes(training_bytes)} to train (weights, {trained} + AdamW, activations)"
    if fit.fits and fit.gpu is not None:
        return _one_gpu_placement(fit.gpu, what), None, ()
    if (
        training_bytes is not None
        and weights.fits
        and weights.gpu is not None
        and training_bytes > sum(fit.spread.values())
    ):
        return _training_overflow_placement(weights.gpu, weights.need, fit, trained)
    if weights.fits_spread:
        return _spread_placement(weights, what), _gpu_max_memory(weights), ()
    if training_bytes is not None and quantized:
        # transformers' bitsandbytes quantizers refuse modules dispatched to the CPU unless
        # llm_int8_enable_fp32_cpu_offload is set (5.22-5.25 quantizers/quantizer_bnb_4bit.py:
        # Bnb4BitHfQuantizer.validate_environment), and those modules then train unquantized in fp32 on the CPU.
        raise PlacementError(
            f"{weights_phrase(weights.need)} (quantized) exceed all GPU memory together, so fine-tuning would "
            "offload part of the base to the CPU: transformers' bitsandbytes quantizer refuses that unless "
            "llm_int8_enable_fp32_cpu_offload=True, and the offloaded layers would then run unquantized in fp32 on "
            "the CPU, every step. Use more or larger GPUs, or a smaller model."
        )
    return _offload_placement(machine, weights, quantized)


def _one_gpu_placement(gpu: Gpu, what: str) -> Decision:
    return Decision(
        "device_map",
        gpu.device,
        f"{what} fit on {gpu.name} ({gpu.device}, {format_bytes(gpu.usable_memory)} free) with headroom",
        (Rejected("auto", "splitting a model that fits on one GPU only adds transfers"),),
    )


def _training_overflow_placement(gpu: Gpu, weight_bytes: int, training: Fit, trained: str) -> _Placement:
    """The weights fit `gpu`, but the training run does not fit even all GPUs together."""
    # What does not fit is the rest of training (mostly activations at seq_len x batch_size):
    # spreading the weights would not help, so keep them on one GPU and say what to change.
    rest = training.need - weight_bytes
    excess = (
        f"~{format_bytes(training.need)} to train exceeds {gpu.name} ({gpu.device}, "
        f"{format_bytes(training.budget)} usable for training): the weights (~{format_bytes(weight_bytes)}) fit, "
        f"the other ~{format_bytes(rest)} (activations at this seq_len x batch_size, {trained} and AdamW state) do not"
    )
    decision = Decision(
        "device_map",
        gpu.device,
        f"{excess}, on one GPU or spread over all",
        (Rejected("auto", "spreads the weights, which fit; the training state does not fit the GPUs together"),),
    )
    warning = (
        f"{excess}: expect an out-of-memory error. Lower seq_len or batch_size, turn gradient_checkpointing "
        "on, or use a GPU with more memory."
    )
    return decision, None, (warning,)


def _spread_placement(weights: Fit, what: str) -> Decision:
    return Decision(
        "device_map",
        "auto",
        f"{what} exceed one GPU: spread over {len(weights.spread)} GPUs "
        f"with an explicit max_memory ({percent(HEADROOM)} of each one's free memory)",
    )


def _offload_placement(machine: Machine, weights: Fit, quantized: bool) -> _Placement:
    """The copy exceeds all GPUs together: accelerate offloads the rest to CPU, then disk."""
    size = weights_phrase(weights.need)
    max_memory = _gpu_max_memory(weights)
    available = machine.cpu.memory_available or 0
    max_memory["cpu"] = max_memory_size(available * HEADROOM)
    spill = weights.need - sum(weights.spread.values())
    warning = (
        f"{size} exceed all GPU memory: ~{format_bytes(spill)} will be offloaded to CPU"
        f"{' and disk' if spill > available * HEADROOM else ''}, and every forward copies them back (very slow). "
        + ("Use more GPUs or a smaller model." if quantized else "Quantize (4-bit), use more GPUs, or a smaller model.")
    )
    return Decision("device_map", "auto", f"{size} exceed GPU memory: offloading to CPU"), max_memory, (warning,)


def weights_phrase(weight_bytes: float) -> str:
    return f"~{format_bytes(weight_bytes)} of weights"


def _gpu_max_memory(fit: Fit) -> dict[Any, str]:
    """`fit.spread` as accelerate's max_memory (GPU index -> "12.0GiB"); callers may add "cpu"."""
    return {i: max_memory_size(b) for i, b in fit.spread.items()}


def judge_upstream_placement(plan: Plan, landed: Mapping[str, int]) -> Plan:
    """`plan` judged against where transformers' own device_map="auto" puts the weights (`landed`: bytes per
    device, capability/upstream_placement.py `upstream_placement`). A plan that spreads over the GPUs without offload,
    where upstream offloads to CPU or disk, says so in the device_map reason and a warning with upstream's
    amounts: a budget sum is not upstream's answer, as `infer_auto_device_map` keeps room for the largest layer
    on the first GPU and `get_balanced_memory` balances the GPUs, and a max_memory without a "cpu" key sends the
    rest to disk (integrations/accelerate.py). A plan that already warns of an offload keeps its warning."""
    on_cpu, on_disk = landed.get("cpu", 0), landed.get("disk", 0)
    if not (on_cpu or on_disk) or any("offloaded" in w for w in plan.warnings):
        return plan
    if "device_map" in plan.explicit or "max_memory" in plan.explicit or not plan.kwargs.get("max_memory"):
        return plan  # only cudaload's own spread is judged: your caps are judged by `_capped_placement`
    where = " and ".join(f"~{format_bytes(n)} on {name}" for n, name in ((on_cpu, "CPU"), (on_disk, "disk")) if n)
    why = (
        "device_map='auto' keeps room for the largest layer on the first GPU and balances the rest, and without a "
        "'cpu' key in max_memory sends what is left to disk (integrations/accelerate.py `infer_auto_device_map`, "
        "`get_balanced_memory`)"
    )
    placed = plan.decision("device_map")
    decision = replace(placed, reason=f"{placed.reason}; but transformers puts {where}: {why}")
    warning = (
        f"transformers will put {where} although the weights fit the GPUs' budgets: {why}. Every forward copies "
        "them back (very slow): raise max_memory (with a 'cpu' key), quantize, or use more GPUs."
    )
    decisions = tuple(decision if d is placed else d for d in plan.decisions)
    return replace(plan, decisions=decisions, warnings=(*plan.warnings, warning))
