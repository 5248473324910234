"""quantization_config for fine-tuning: 4-bit nf4 (QLoRA), 8-bit, none, or "auto"."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from ..errors import MissingPackageError, QuantizationError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, Rejected
from .fit import TRAINING_SHARE, gib, judge_fit, pinned_gpu
from .memory import TrainingMemory

__all__ = ["QUANTIZE_CHOICES", "bitsandbytes_status", "decide_quantization"]

QUANTIZE_CHOICES = ("4bit", "8bit", "auto", None)
# bitsandbytes runs 4-/8-bit on CPU from 0.48 on (before that only CUDA); measured here with 0.50.2.
BNB_CPU_SINCE = Version("0.48.0")


def bitsandbytes_status(machine: Machine) -> tuple[bool, str]:
    version = machine.software.version("bitsandbytes")
    if version is None:
        return False, "bitsandbytes is not installed (pip install 'cudaload[finetune]')"
    if not machine.gpus and Version(version) < BNB_CPU_SINCE:
        return False, f"bitsandbytes {version} has no CPU backend (0.48+ has one); this machine has no CUDA GPU"
    return True, f"bitsandbytes {version} ({'CUDA' if machine.gpus else 'CPU'} backend)"


def _config(quantize: str, dtype: str, machine: Machine) -> dict[str, Any]:
    if quantize == "8bit":
        return {"load_in_8bit": True}
    # FSDP needs the packed 4-bit weights stored in a float dtype to shard them with the rest.
    storage = dtype if machine.launch.strategy == "fsdp" else "uint8"
    return {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": dtype,
        "bnb_4bit_quant_storage": storage,
    }


def decide_quantization(
    machine: Machine,
    model: ModelFacts,
    requested: str | None,
    dtype: str,
    estimates: dict[str | None, TrainingMemory],
    device_map: Any = None,
) -> tuple[Decision, dict[str, Any] | None, tuple[str, ...]]:
    """(decision, BitsAndBytesConfig kwargs or None, warnings). `estimates` maps None/"4bit"/"8bit"
    to the training-memory estimate for that choice; `device_map` is the one you passed, if any: a
    single process judges the GPU it pins the model to.

    "auto" asks fit.py's `judge_fit`, as placement does: the same GPU and budget for both."""
    if requested not in QUANTIZE_CHOICES:
        raise QuantizationError(
            f"quantize={requested!r} is not a choice. Use '4bit' (QLoRA), '8bit', None (no quantization) "
            "or 'auto' (4-bit only when 16-bit LoRA would not fit)."
        )
    if model.quantized is not None and requested is not None:
        raise QuantizationError(
            f"quantize={requested!r} was asked, but {model.source} is already quantized "
            f"({model.quantized}). Pass quantize=None to fine-tune it as it is."
        )
    usable, why = bitsandbytes_status(machine)
    if requested in ("4bit", "8bit"):
        if not usable:
            raise MissingPackageError(f"quantize={requested!r} was asked, but {why}.")
        detail = (
            f"nf4 + double quant, compute dtype = the plan's dtype ({dtype}), not BitsAndBytesConfig's default"
            if requested == "4bit"
            else "LLM.int8"
        )
        return (
            Decision("quantize", requested, f"your choice: {detail}", source="user"),
            _config(requested, dtype, machine),
            (),
        )
    if requested is None:
        return Decision("quantize", None, "your choice: full-precision base weights", source="user"), None, ()

    # "auto": quantize only when 16-bit LoRA does not fit the GPU.
    plain, four = estimates[None], estimates["4bit"]
    if not machine.gpus:
        return (
            Decision(
                "quantize",
                None,
                "no GPU: the weights live in RAM, and 4-bit matmuls on CPU are slower",
                (Rejected("4bit", "saves RAM, costs speed on CPU; pass quantize='4bit' to trade"),),
            ),
            None,
            (),
        )
    # Judged on the GPU placement uses (fit.py): on a mixed machine the one with most free memory,
    # under a distributed launch the smallest (every rank holds a copy).
    pinned = pinned_gpu(device_map)
    fit = judge_fit(machine, plain.total, TRAINING_SHARE, pinned)
    budget = fit.budget
    how = (
        f"estimated {gib(plain.total)} for {dtype} LoRA (weights {gib(plain.weights)}, LoRA+Adam "
        f"{gib(plain.lora)}, activations {gib(plain.activations)}) vs {gib(budget)} usable on {fit.where}"
    )
    if fit.fits:
        return (
            Decision(
                "quantize",
                None,
                f"{dtype} LoRA fits: {how}",
                (Rejected("4bit", "not needed: slower and lossier than 16-bit LoRA"),),
            ),
            None,
            (),
        )
    if not usable:
        warning = f"16-bit LoRA will not fit ({how}) and 4-bit is unavailable: {why}."
        return (
            Decision("quantize", None, f"4-bit would be needed but {why}", (Rejected("4bit", why),)),
            None,
            (warning,),
        )
    warnings: tuple[str, ...] = ()
    if not judge_fit(machine, four.total, TRAINING_SHARE, pinned).fits:
        warnings = (
            f"Even 4-bit needs ~{gib(four.total)} and {fit.where} has {gib(budget)} usable: "
            "shorten sequences, lower the batch, or use a bigger GPU.",
        )
    return (
        Decision(
            "quantize",
            "4bit",
            f"{dtype} LoRA does not fit ({how}); QLoRA needs ~{gib(four.total)}",
            (Rejected(None, "does not fit"),),
        ),
        _config("4bit", dtype, machine),
        warnings,
    )
