"""Hold cudaload's copies of upstream tables against the installed transformers, so a release
that changes them fails here instead of misleading users."""

from __future__ import annotations

from cudaload.capability.software import probe_software
from cudaload.upstream_flash import FLASH_OPTIONS
from cudaload.upstream_kernels import KERNELS_RANGES, hub_kernel_version


def test_flash_tables_match_transformers() -> None:
    import torch
    import transformers
    from transformers import modeling_flash_attention_utils as fa

    for name, option in FLASH_OPTIONS.items():
        version = int(name[-1])
        assert fa.FLASH_ATTN_KERNEL_FALLBACK[name] == option.hub_repo
        assert fa.FLASH_ATTN_KERNEL_VERSIONS[option.hub_repo] == hub_kernel_version(
            option.hub_repo, torch.__version__, transformers.__version__
        )
        check = fa.FLASH_ATTENTION_COMPATIBILITY_MATRIX[version]
        minimum = check.get("cuda_min_major_version")
        if minimum is not None:
            assert min(option.majors) == minimum


def test_kernels_range_matches_the_installed_transformers() -> None:
    import transformers
    from transformers.utils import import_utils

    installed = (import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION)
    assert probe_software().kernels_range == installed
    minor = ".".join(transformers.__version__.split(".")[:2])
    assert minor in KERNELS_RANGES, f"transformers {minor}: add its kernels range {installed} to KERNELS_RANGES"
    assert KERNELS_RANGES[minor] == installed


def test_compileable_quant_methods_are_the_installed_quantizers_own() -> None:
    # generate() compiles a quantized model only where its quantizer's `is_compileable` is True
    # (`_valid_auto_compile_criteria`); the table must list exactly those of the installed transformers.
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING

    from cudaload.upstream import COMPILEABLE_QUANT_METHODS

    upstream = {
        method
        for method, quantizer in AUTO_QUANTIZER_MAPPING.items()
        if quantizer.is_compileable.fget(object.__new__(quantizer))  # a constant in every 5.22-5.25 quantizer
    }
    assert upstream == set(COMPILEABLE_QUANT_METHODS)
