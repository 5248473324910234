"""What the Hugging Face Hub side allows, as frozen data: offline mode and the attention kernels cached here."""

from __future__ import annotations

from ..frozen import frozen

__all__ = ["Hub", "HubKernel"]


@frozen
class HubKernel:
    """Local availability of one Hub attention kernel repository.

    Attributes:
        repo: The Hub repository, e.g. "kernels-community/flash-attn2".
        version: The kernel version transformers asks for with this torch; None when unknown.
        cached_variant: The build variant found in the local cache for this torch/CUDA, if any
            ("simulated" when `Machine.simulated(cached_kernels=...)` names it); None: not cached.
        detail: A human note on what was found (e.g. "not in the local cache").
        revision: The cached snapshot's commit the variant comes from; None when unknown (not cached, a
            LOCAL_KERNELS folder, simulated). A new revision proves the test forward anew (plans/check_proof.py).

    Examples:
        >>> import cudaload
        >>> machine = cudaload.Machine.simulated("H100", cached_kernels=["kernels-community/flash-attn2"])
        >>> machine.hub.kernel("kernels-community/flash-attn2").cached
        True
    """

    repo: str
    version: int | None
    cached_variant: str | None = None
    """The build variant found in the local cache for this torch/CUDA, if any."""
    detail: str = ""
    revision: str | None = None

    @property
    def cached(self) -> bool:
        return self.cached_variant is not None


@frozen
class Hub:
    """What the Hugging Face Hub side allows: offline mode and the attention kernels in the cache.

    Attributes:
        offline: True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: nothing can be fetched.
        kernels: One `HubKernel` per Hub attention kernel repository cudaload knows.
        layer_kernels_disabled: "USE_HUB_KERNELS=<value>" when that variable turns transformers' Hub layer
            kernels off (use_kernels); None when it does not.

    Examples:
        >>> import cudaload
        >>> hub = cudaload.Machine.simulated(offline=True).hub
        >>> hub.offline, hub.kernel("kernels-community/flash-attn2").cached
        (True, False)
    """

    offline: bool = False
    kernels: tuple[HubKernel, ...] = ()
    layer_kernels_disabled: str | None = None

    def kernel(self, repo: str) -> HubKernel | None:
        for kernel in self.kernels:
            if kernel.repo == repo:
                return kernel
        return None
