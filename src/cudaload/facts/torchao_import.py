"""What an installed torchao costs every process that loads a model, for `cudaload doctor`.

transformers imports torchao whenever it is installed, not only for a torchao model: modeling_utils.py imports
quantizers/auto.py, which imports quantizer_torchao.py, which imports torchao when `is_torchao_available()`
(transformers 5.22-5.25 quantizers/quantizer_torchao.py: TorchAoHfQuantizer). torchao's import then loads its
`_C*.so` extensions (torchao 0.18.0's __init__.py calls `torch.ops.load_library` for each), the registry's wheels
building them for CUDA: on a torch without CUDA each fails and torchao logs "Failed to load ..." in every such
process. Measured (AMD EPYC, 2 cores, torch 2.13.0 CPU, transformers 5.22.2, torchao 0.18.0, load average 4-8,
2026-12-06): `import torchao` alone 1.6-2.0 s of CPU; on top of transformers.modeling_utils' own imports, which
share most of it, 0.15-0.3 s of CPU (0.4-1.5 s wall under that load). int8 weight-only does not need the
extensions: it loads and trains on that CPU (tests/test_torchao_load.py).
"""

from __future__ import annotations

from .software import Software

__all__ = ["torchao_import_note"]


def torchao_import_note(software: Software) -> str | None:
    """One line for doctor when torchao is installed and its extensions cannot load under this torch; None
    otherwise (no torchao, its files not read, or a GPU build of torch)."""
    version = software.version("torchao")
    extensions = software.torchao_extensions
    if version is None or not extensions or software.torch_cuda or software.torch_hip:
        return None
    return (
        f"torchao {version}: transformers imports it in every process that loads a model (is_torchao_available), "
        f"0.15-0.3 s of CPU on top of its own imports (measured on a 2-core AMD EPYC; 1.6-2.0 s alone), and its "
        f"{len(extensions)} C extension(s) ({', '.join(extensions)}) are CUDA builds this CPU torch cannot load: "
        "torchao logs 'Failed to load' each time. quantize='torchao-int8' does not need them; uninstall torchao "
        "if you do not use it."
    )
