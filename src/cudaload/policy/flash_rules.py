"""The FlashAttention rules: every reason a FlashAttention version cannot run a model here, in the order of
the rules in docs/decisions.md (GPU architecture, dtype, model support, package version, head dims, sinks).

The rules every version shares are `flash_blockers`'; what one version adds is its record in
upstream_flash.FLASH_OPTIONS (a `FlashOption`: package, Hub kernel, and its versions / head_dims / sinks rules); which
architectures run it, and in which order a GPU tries the versions, is the GPU's vendor record's answer
(`Gpu.platform`, facts/platforms.py). A new FlashAttention version is a FlashOption there and its place in each
vendor's order; nothing else names it.
"""

from __future__ import annotations

from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..upstream_flash import FLASH_MAX_HEAD_DIM, FLASH_OPTIONS

__all__ = ["flash_blockers", "flash_order"]


def flash_blockers(
    machine: Machine, model: ModelFacts, dtype: str, name: str, installed: str | None
) -> tuple[str, ...]:
    """Every reason FlashAttention `name` cannot run this model here, in the order of the rules in
    docs/decisions.md. `installed` is the package version, or None for the Hub kernel."""
    option = FLASH_OPTIONS[name]
    gpu = machine.weakest_gpu
    found = (
        gpu.platform.flash_generation(gpu, name, installed) if gpu is not None else "needs a CUDA GPU",
        "FlashAttention runs only in fp16/bf16; the dtype is float32" if dtype == "float32" else None,
        None if model.supports_flash else f"{model.model_class} does not support FlashAttention",
        *option.versions(model, installed),
        _too_big(model) or option.head_dims(gpu, model, installed),
        # No GPU, or fp32: already blocked, the sinks add nothing.
        *(option.sinks(gpu, dtype, installed) if model.attention_sinks and gpu and dtype != "float32" else ()),
    )
    return tuple(reason for reason in found if reason)


def flash_order(machine: Machine) -> tuple[str, ...]:
    """FlashAttention versions in the order the weakest GPU's vendor tries them (no GPU: every version in
    FLASH_OPTIONS' order, each to be rejected with its reason)."""
    gpu = machine.weakest_gpu
    return gpu.platform.flash_order(gpu) if gpu is not None else tuple(FLASH_OPTIONS)


def _too_big(model: ModelFacts) -> str | None:
    """A head dim over 256: no FlashAttention has it (so one head dim gives one reason)."""
    too_big = [d for d in model.head_dims if d > FLASH_MAX_HEAD_DIM]
    if too_big:
        return f"head_dim {max(too_big)}: FlashAttention supports head dims up to {FLASH_MAX_HEAD_DIM}"
    return None
