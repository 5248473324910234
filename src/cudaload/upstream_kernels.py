"""Which Hub kernel builds and `kernels` releases each transformers accepts, kept as data so tests can hold them
against the installed transformers: the `v<N>` branch it loads for a Hub attention kernel
(`hub_kernel_version`) and the `kernels` range each transformers minor gates its Hub-kernel path on
(`KERNELS_RANGES`).

Sources: transformers `modeling_flash_attention_utils` (FLASH_ATTN_KERNEL_VERSIONS), `utils/import_utils`
(KERNELS_MIN_VERSION, KERNELS_MAX_VERSION). Imports nothing of cudaload.
"""

from __future__ import annotations

from packaging.version import Version

__all__ = ["KERNELS_RANGES", "TESTED_KERNELS_RANGE", "hub_kernel_version"]


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string: "2.13.0+cpu" -> (2, 13), "5.25.0rc1" -> (5, 25)."""
    return Version(version).release[:2]


def hub_kernel_version(repo: str, torch_version: str | None, transformers_version: str | None = None) -> int | None:
    """The `v<N>` branch transformers loads for a Hub attention kernel (FLASH_ATTN_KERNEL_VERSIONS).

    `transformers_version` None means the tested set's (5.22); the table moved in 5.25 (flash-attn2 v4 on
    any torch, flash-attn4 v1). Both versions decide: pass the installed transformers as well as torch.
    """
    if repo == "kernels-community/flash-attn2":
        # FLASH_ATTN_KERNEL_VERSIONS (modeling_flash_attention_utils.py): 5.22-5.24 have
        # `4 if is_torch_greater_or_equal("2.10", accept_dev=True) else 3` ("v4 was only tested on 2.10 and
        # upwards"); 5.25 has a plain `"kernels-community/flash-attn2": 4` whatever the torch.
        if _release(transformers_version or "5.22") >= (5, 25) or torch_version is None:
            return 4
        return 4 if _release(torch_version) >= (2, 10) else 3
    if repo == "kernels-community/flash-attn4":
        # transformers 5.25 moved FLASH_ATTN_KERNEL_VERSIONS["kernels-community/flash-attn4"] from 0 to 1.
        return 1 if _release(transformers_version or "5.22") >= (5, 25) else 0
    return {"kernels-community/vllm-flash-attn3": 1}.get(repo)


# `kernels` versions each transformers minor accepts: [KERNELS_MIN_VERSION, KERNELS_MAX_VERSION).
# A detected machine reads the installed transformers' range; these are for simulated machines
# and for the test that holds them against the installed transformers.
KERNELS_RANGES: dict[str, tuple[str, str]] = {
    "5.22": ("0.17.2", "0.18.0"),
    "5.23": ("0.18.2", "0.19.0"),
    "5.24": ("0.18.2", "0.19.0"),
    "5.25": ("0.19.1", "0.20.0"),
}
# The tested set's (transformers 5.22.x, constraints/tested.txt).
TESTED_KERNELS_RANGE = KERNELS_RANGES["5.22"]
