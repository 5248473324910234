"""cudaload: load a Transformers model the right way for the machine it runs on, and say why.

Importing cudaload has no side effects: nothing here imports torch or transformers,
touches CUDA or the network. Names resolve lazily on first use.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from .version import __version__

# A library logs and the application decides what is shown: silent until you configure logging
# (e.g. logging.basicConfig(level=logging.INFO)), and no "No handlers" fallback printing its warnings.
logging.getLogger(__name__).addHandler(logging.NullHandler())

# public name -> the private module that defines it
_EXPORTS = {
    "plan": "cudaload.planner",
    "load": "cudaload.facade",
    "from_pretrained_kwargs": "cudaload.loaders",
    "load_for_finetune": "cudaload.finetune",
    "launch_files": "cudaload.launch",
    "LaunchFiles": "cudaload.launch",
    "LaunchMismatchError": "cudaload.errors",
    "training_arguments": "cudaload.finetune",
    "AppliedPlan": "cudaload.loaders",
    "Fallback": "cudaload.loaders",
    "CudaloadWarning": "cudaload.errors",
    "tokenizer_for": "cudaload.tokenizer",
    "pipeline": "cudaload.pipelines",
    "GenerationPlan": "cudaload.plans",
    "FinetunePlan": "cudaload.plans",
    "detect": "cudaload.capability",
    "Plan": "cudaload.plans",
    "Decision": "cudaload.plans",
    "Rejected": "cudaload.plans",
    "Machine": "cudaload.facts.machine",
    "Gpu": "cudaload.facts.machine",
    "Cpu": "cudaload.facts.machine",
    "Software": "cudaload.facts.machine",
    "Hub": "cudaload.facts.machine",
    "HubKernel": "cudaload.facts.machine",
    "Launch": "cudaload.facts.machine",
    "ModelFacts": "cudaload.facts.model",
    "read_model_facts": "cudaload.capability.model_config",
    "CudaloadError": "cudaload.errors",
    "AttentionUnavailableError": "cudaload.errors",
    "DtypeUnsupportedError": "cudaload.errors",
    "FinetuneConfigError": "cudaload.errors",
    "LoadFailedError": "cudaload.errors",
    "MissingPackageError": "cudaload.errors",
    "ModelConfigError": "cudaload.errors",
    "PlacementError": "cudaload.errors",
    "QuantizationError": "cudaload.errors",
    "RemoteCodeError": "cudaload.errors",
    "SettingError": "cudaload.errors",
    "UnknownGpuError": "cudaload.errors",
    "WorkloadError": "cudaload.errors",
    "Workload": "cudaload.request",
    "DtypeProbe": "cudaload.facts.machine",
    "TuningRecord": "cudaload.facts.machine",
}

__all__ = [
    "AppliedPlan",
    "AttentionUnavailableError",
    "Cpu",
    "CudaloadError",
    "CudaloadWarning",
    "Decision",
    "DtypeProbe",
    "DtypeUnsupportedError",
    "Fallback",
    "FinetuneConfigError",
    "FinetunePlan",
    "GenerationPlan",
    "Gpu",
    "Hub",
    "HubKernel",
    "Launch",
    "LaunchFiles",
    "LaunchMismatchError",
    "LoadFailedError",
    "Machine",
    "MissingPackageError",
    "ModelConfigError",
    "ModelFacts",
    "PlacementError",
    "Plan",
    "QuantizationError",
    "Rejected",
    "RemoteCodeError",
    "SettingError",
    "Software",
    "TuningRecord",
    "UnknownGpuError",
    "Workload",
    "WorkloadError",
    "__version__",
    "detect",
    "from_pretrained_kwargs",
    "launch_files",
    "load",
    "load_for_finetune",
    "pipeline",
    "plan",
    "read_model_facts",
    "tokenizer_for",
    "training_arguments",
]

if TYPE_CHECKING:
    from .capability import detect
    from .capability.model_config import read_model_facts
    from .errors import (
        AttentionUnavailableError,
        CudaloadError,
        CudaloadWarning,
        DtypeUnsupportedError,
        FinetuneConfigError,
        LaunchMismatchError,
        LoadFailedError,
        MissingPackageError,
        ModelConfigError,
        PlacementError,
        QuantizationError,
        RemoteCodeError,
        SettingError,
        UnknownGpuError,
        WorkloadError,
    )
    from .facade import load
    from .facts.machine import Cpu, DtypeProbe, Gpu, Hub, HubKernel, Launch, Machine, Software, TuningRecord
    from .facts.model import ModelFacts
    from .finetune import load_for_finetune, training_arguments
    from .launch import LaunchFiles, launch_files
    from .loaders import AppliedPlan, Fallback, from_pretrained_kwargs
    from .pipelines import pipeline
    from .planner import plan
    from .plans import Decision, FinetunePlan, GenerationPlan, Plan, Rejected
    from .request import Workload
    from .tokenizer import tokenizer_for


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cudaload' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
