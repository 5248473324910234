"""quantize="auto" across a job's ranks: a base that needed 4 bits on one GPU may fit the ranks in 16 bits.
When both fit, the estimated step time decides (rank_sizing.py's model, the job's tokens per second): 16-bit
LoRA keeps the base's accuracy, but a 4-bit base moves a quarter of the bytes and may shard inside a node
where the 16-bit one must shard over the network. Without a step time (a CPU, a GPU without a throughput
figure) 16 bits are kept whenever they fit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import PlacementError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
from ..plans.checkpoint import CheckpointPlan
from ..request import TrainingRequest
from .fit import format_bytes
from .memory import TrainingMemory
from .parallelism import ParallelChoice, parallel_section

__all__ = ["quantize_across_ranks"]


def _fitting(
    machine: Machine,
    model: ModelFacts,
    training: TrainingRequest,
    dtype: str,
    quantize: str | None,
    estimates: dict[str | None, TrainingMemory],
    lora_config: Mapping[str, Any],
) -> ParallelChoice | None:
    """The parallelism choice with `quantize`, None when nothing fits (a strategy asked by name that does not)."""
    try:
        _, choice = parallel_section(machine, model, training, dtype, quantize, estimates, lora_config)
    except PlacementError:
        return None
    return choice if choice is not None and choice.chosen is not None else None


def _throughput(choice: ParallelChoice, tokens: int) -> str:
    rate = choice.tokens_per_s(tokens)
    where = f"{choice.chosen}, {format_bytes(choice.sizes[str(choice.chosen)].total)} a rank"
    return f"{where}, ~{rate / 1000:.1f}k tokens/s" if rate is not None else where


def quantize_across_ranks(
    machine: Machine,
    model: ModelFacts,
    training: TrainingRequest,
    dtype: str,
    estimates: dict[str | None, TrainingMemory],
    lora_config: Mapping[str, Any],
    quant: Decision,
    checkpoint: CheckpointPlan | None,
) -> Decision | None:
    """The `quantize` decision when quantize="auto" chose a quantized base because 16-bit LoRA does not fit one
    GPU, but it fits the job's ranks: 16 bits (None) unless the quantized base trains faster by the estimated
    step time; None: `quant` stands (nothing to weigh, or 16 bits fit no strategy). Only where the ranks can
    shard: planned before the launch with the layout given, or under an FSDP / ZeRO-3 launch (a DDP launch
    copies the whole model to every rank)."""
    if training.quantize != "auto" or checkpoint is not None or quant.value is None:
        return None
    launch = machine.launch
    if launch.distributed and training.nodes is None and not launch.shards_parameters:
        return None
    sixteen = _fitting(machine, model, training, dtype, None, estimates, lora_config)
    if sixteen is None:
        return None
    world, tokens = sixteen.layout.world_size, training.seq_len
    fits = f"16-bit LoRA does not fit one GPU, but it fits each of the {world} ranks"
    quantized = _fitting(machine, model, training, dtype, quant.value, estimates, lora_config)
    one_gpu = Rejected(quant.value, f"only needed on one GPU; {quant.reason}")
    if quantized is None:
        return Decision(
            "quantize", None, f"{fits} with {_throughput(sixteen, tokens)}: no quantization needed", (one_gpu,)
        )
    fast16, fast4 = sixteen.tokens_per_s(tokens), quantized.tokens_per_s(tokens)
    both = f"16-bit: {_throughput(sixteen, tokens)}; {quant.value}: {_throughput(quantized, tokens)}"
    if fast16 is None or fast4 is None:
        return Decision(
            "quantize",
            None,
            f"{fits} with {sixteen.chosen}: no quantization needed (no step time to weigh it against {quant.value} "
            f"on this machine, so 16 bits, which keep the base's accuracy; {both})",
            (one_gpu,),
        )
    if fast4 > fast16:
        return Decision(
            "quantize",
            quant.value,
            f"{fits}, but the {quant.value} base trains faster by the estimated step time ({both}): "
            f"{quant.value} moves fewer bytes per step",
            (
                Rejected(None, f"fits the ranks but trains slower by the estimated step time ({both})"),
                *(r for r in quant.rejected if r.value is not None),  # its "does not fit" was one GPU's
            ),
        )
    return Decision(
        "quantize",
        None,
        f"{fits}, and no slower than {quant.value} by the estimated step time ({both}): no quantization needed",
        (Rejected(quant.value, f"no faster across the ranks ({both}); {quant.reason}"),),
    )
