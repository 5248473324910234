"""The cudaload exception tree.

Every error says what was asked, what was found and what to do. Each class also
subclasses the builtin a caller would naturally catch (ValueError for bad input,
ImportError for a missing package, RuntimeError for a failure while loading).
"""

from __future__ import annotations

__all__ = [
    "AttentionUnavailableError",
    "CudaloadError",
    "CudaloadWarning",
    "DtypeUnsupportedError",
    "FinetuneConfigError",
    "LoadFailedError",
    "MissingPackageError",
    "ModelConfigError",
    "PlacementError",
    "QuantizationError",
    "RemoteCodeError",
    "SettingError",
    "UnknownGpuError",
    "WorkloadError",
]


class CudaloadError(Exception):
    """Base class of every error cudaload raises."""


class ModelConfigError(CudaloadError, ValueError):
    """The model's config could not be read (missing path, offline hub id, bad config)."""


class RemoteCodeError(CudaloadError, ValueError):
    """The model needs `trust_remote_code=True` and the user did not pass it."""


class AttentionUnavailableError(CudaloadError, ValueError):
    """An explicitly requested attention implementation cannot work on this machine."""


class DtypeUnsupportedError(CudaloadError, ValueError):
    """An explicitly requested dtype cannot work on this machine or with these settings."""


class PlacementError(CudaloadError, ValueError):
    """An explicitly requested placement (device_map) cannot work here."""


class QuantizationError(CudaloadError, ValueError):
    """A quantization request is invalid or cannot run on this machine."""


class FinetuneConfigError(CudaloadError, ValueError):
    """A fine-tuning (LoRA) setting is invalid for this model."""


class MissingPackageError(CudaloadError, ImportError):
    """A package a requested feature needs is not installed (or not an accepted version)."""


class LoadFailedError(CudaloadError, RuntimeError):
    """Loading failed for an option the plan could not fall back from (or strict=True)."""


class UnknownGpuError(CudaloadError, ValueError):
    """A simulated machine named a GPU the catalog does not know."""


class SettingError(CudaloadError, ValueError):
    """A setting has the wrong type or an impossible value (e.g. use_kernels="yes")."""


class WorkloadError(SettingError):
    """`workload=` names no known workload and is not a (prompt_tokens, new_tokens) pair."""


class CudaloadWarning(UserWarning):
    """A setting works but costs you (CPU offload, fp16 on a fragile family, an unwritable cache, ...)."""
