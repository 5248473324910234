"""What a GPU vendor's stack can do, as one record per vendor: the seam between the policy and CUDA or ROCm.

A `Gpu` names its vendor ("nvidia", "amd"); `Gpu.platform` is that vendor's `Platform`, and the policy asks it
(bf16, tf32, which FlashAttention runs on this architecture, paged optimizers, which quantization packages have a
backend) instead of testing compute-capability numbers. In the manner of vLLM's `Platform` classes
(vllm/platforms/interface.py: `Platform`, with `CudaPlatform` in cuda.py and `RocmPlatform` in rocm.py) and
huggingface/kernels' backend dataclasses (kernels 0.17 backends.py: `CUDA`, `ROCm`), but data: the records are in
platform_cuda.py and platform_rocm.py, registered by vendor in platforms.py. A new vendor is a record, its probe
(capability/) and its catalog entries (catalog.py); docs/platforms.md says what is known for each.

The rules take a `PlatformGpu`, the few attributes of a GPU they read, not `Gpu` itself: `Gpu.platform` returns
these records, so a rule annotated with `Gpu` would make hardware.py and this module (and each record's module)
import each other, for a type. `Gpu` is a `PlatformGpu` as it stands (mypy checks it wherever a rule is called
with one); `Software` lives in software.py, below both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Protocol

from ..frozen import frozen
from ..upstream import version_at_least

if TYPE_CHECKING:
    from .software import Software

__all__ = ["Platform", "PlatformGpu", "Tf32", "bitsandbytes_since"]


class PlatformGpu(Protocol):
    """A GPU as a vendor's rules read it: what `Gpu` (hardware.py) has that the rules need, and nothing more."""

    @property
    def index(self) -> int:
        """The ordinal torch uses: `cuda:{index}`."""
        ...

    @property
    def name(self) -> str:
        """The device name ("NVIDIA A100-SXM4-80GB")."""
        ...

    @property
    def capability(self) -> tuple[int, int]:
        """CUDA compute capability (major, minor)."""
        ...

    @property
    def arch(self) -> str:
        """The architecture: "sm_90" for NVIDIA, the gfx target ("gfx942") for AMD."""
        ...

    @property
    def sm(self) -> str:
        """The architecture as messages show it."""
        ...


Tf32 = tuple[bool | None, str, str]
"""(planned, why, why not the other value; "" for none) for TrainingArguments' tf32, or (None, "", "") when the
plan sets nothing (a GPU without TF32, where transformers' default is already off)."""


@frozen
class Platform:
    """One GPU vendor's rules, as the policy asks them.

    Attributes:
        vendor: The key a `Gpu.vendor` names ("nvidia", "amd").
        label: The vendor as messages name it ("NVIDIA", "AMD").
        runtime: The torch build that drives these GPUs ("CUDA", "ROCm"), as reasons name it.
        torch_build: (Software) -> the version of that build in the installed torch, None when torch is not built
            for it (a CPU build, or another vendor's).
        simulate_build: (Software) -> the Software of a simulated machine with these GPUs (torch built for them).
        bf16: (GPU) -> whether it runs bf16 natively.
        bf16_since: The first architecture with native bf16, as reasons name it ("sm80").
        bf16_missing: (GPU) -> why an asked-for bf16 cannot run there (the error's middle).
        fp16_tensor_cores: (GPU) -> whether fp16 matmuls run on matrix units (else fp16 only halves the memory).
        matrix_since: The first architecture with those matrix units, as reasons name it ("sm70").
        device_type: torch's device type for these GPUs ("cuda" on NVIDIA and on ROCm, "xpu", "mps"): what a
            device_map names.
        tf32: (weakest GPU, GPU current when TrainingArguments is built or None) -> TrainingArguments' tf32.
        paged_optimizers: None when bitsandbytes' paged optimizers run here; else why they are not planned.
        quant_backend: (distribution) -> None when that quantization package has a backend for these GPUs; else
            why it is not planned.
        quant_installed: (distribution, Software) -> why the installed release of that package cannot run on
            these GPUs under the installed torch (too old for the vendor, no build for its runtime); None when it can
            or nothing is known.
        flash_order: (GPU) -> FlashAttention versions (upstream_flash.FLASH_OPTIONS names) in the order tried there.
        flash_generation: (weakest GPU, FlashAttention name, installed version or None for the Hub kernel) ->
            why that version has no kernels for this architecture; None when it has.
        flash_note: (GPU, FlashAttention name) -> what an installed package runs as on these GPUs, appended to
            the reason that plans it ("" when nothing is worth saying).
        flash_arch_rules: The version records' own architecture rules (upstream.FlashOption head_dims / sinks,
            written for CUDA architectures) apply to these GPUs.
        min_driver: The oldest driver each major of the runtime runs on ({} when not checked).
        sources: Where the rules come from, for docs/platforms.md and the reasons.
    """

    vendor: str
    label: str
    runtime: str
    torch_build: Callable[[Software], str | None]
    simulate_build: Callable[[Software], Software]
    bf16: Callable[[PlatformGpu], bool]
    bf16_since: str
    bf16_missing: Callable[[PlatformGpu], str]
    fp16_tensor_cores: Callable[[PlatformGpu], bool]
    tf32: Callable[[PlatformGpu, PlatformGpu | None], Tf32]
    paged_optimizers: str | None
    quant_backend: Callable[[str], str | None]
    flash_order: Callable[[PlatformGpu], tuple[str, ...]]
    flash_generation: Callable[[PlatformGpu, str, str | None], str | None]
    flash_note: Callable[[PlatformGpu, str], str] = lambda gpu, name: ""
    matrix_since: str = "sm70"
    device_type: str = "cuda"
    quant_installed: Callable[[str, Software], str | None] = lambda package, software: None
    flash_arch_rules: bool = True
    min_driver: Mapping[int, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()


def bitsandbytes_since(minimum: str, runtime: str) -> Callable[[str, Software], str | None]:
    """A `Platform.quant_installed` rule: bitsandbytes older than `minimum`, the first release planned on
    `runtime` ("XPU", "Metal"), cannot run there; other packages and an absent bitsandbytes pass."""

    def rule(package: str, software: Software) -> str | None:
        version = software.version(package)
        if package != "bitsandbytes" or version is None or version_at_least(version, minimum):
            return None
        return (
            f"bitsandbytes {version} is older than {minimum}, the first release planned on {runtime} "
            f"(pip install 'bitsandbytes>={minimum}')"
        )

    return rule
