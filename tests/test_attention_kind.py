"""attn_implementation strings classified once, as transformers classifies them."""

from __future__ import annotations

import pytest

import cudaload
from cudaload.policy.attention import is_flash_attention
from cudaload.upstream_flash import attention_kind


@pytest.mark.parametrize(
    ("implementation", "kind", "flash"),
    [
        ("flash_attention_2", "flash", True),
        ("flash_attention_3", "flash", True),
        ("kernels-community/flash-attn3", "hub_kernel", True),
        ("kernels-community/vllm-flash-attn3", "hub_kernel", True),
        ("kernels-community/flash-attn2@v1", "hub_kernel", True),  # revision, as `is_kernel` accepts
        ("my-org/paged-attention:forward", "hub_kernel", False),  # a function of a repo
        ("sdpa", "sdpa", False),
        ("flex_attention", "flex", False),
        ("eager", "eager", False),
        ("paged|sdpa", "other", False),
        ("flash_attention_9", "other", False),  # not a FlashAttention transformers knows
        ("a/b/c", "other", False),  # not transformers' org/repo pattern
    ],
)
def test_kinds_follow_transformers(implementation: str, kind: str, flash: bool) -> None:
    assert attention_kind(implementation) == kind
    assert is_flash_attention(implementation) is flash


def test_any_hub_repository_needs_the_kernels_package_not_only_kernels_community(tiny_models) -> None:
    # A Hub kernel outside kernels-community is still code fetched through `kernels`: checked, not
    # passed through as an unknown name (before, only the kernels-community/ prefix was).
    bare = cudaload.Machine.simulated("H100", packages={"kernels": None})
    with pytest.raises(cudaload.AttentionUnavailableError, match="the `kernels` package is not installed"):
        cudaload.plan(str(tiny_models["qwen3"]), machine=bare, attn_implementation="my-org/attention")
