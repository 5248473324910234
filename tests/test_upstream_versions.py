"""Version strings as installed packages spell them: local tags and pre-releases."""

from __future__ import annotations

import pytest

from cudaload.upstream_kernels import hub_kernel_version


@pytest.mark.parametrize(
    ("repo", "torch", "transformers", "branch"),
    [
        ("kernels-community/flash-attn2", "2.13.0+cpu", None, 4),
        ("kernels-community/flash-attn2", "2.9.1+cu121", None, 3),
        ("kernels-community/flash-attn2", "2.10.0a0+git1234", None, 4),
        ("kernels-community/flash-attn4", "2.13.0", "5.25.0rc1", 1),
        ("kernels-community/flash-attn4", "2.13.0", "5.24.0", 0),
        ("kernels-community/flash-attn4", "2.13.0", "5.26.0.dev0", 1),
        ("kernels-community/vllm-flash-attn3", "2.13.0", "5.25.0", 1),
        ("kernels-community/unknown", "2.13.0", "5.25.0", None),
    ],
)
def test_hub_kernel_branch_reads_local_tags_and_prereleases(repo, torch, transformers, branch) -> None:
    assert hub_kernel_version(repo, torch, transformers) == branch
