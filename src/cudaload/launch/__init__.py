"""The launch of a planned training job (`launch_files()`), one emitter module per engine (torchrun, accelerate,
DeepSpeed, SLURM) on its serializer, the folder writer, and the check every launched rank makes
(`check_launch`, called by `load_for_finetune()`).

Nothing here starts a job: torchrun, accelerate, DeepSpeed and SLURM do."""

from __future__ import annotations

from .agree import check_launch
from .check import check_launched_environment, check_launched_plan, manifest_plan_arguments
from .deepspeed import deepspeed_config
from .files import EMITTERS, LaunchFiles, launch_files
from .job import LAUNCH_ENV, MANIFEST
from .manifest import launch_invariants, model_identity, read_manifest

__all__ = [
    "EMITTERS",
    "LAUNCH_ENV",
    "MANIFEST",
    "LaunchFiles",
    "check_launch",
    "check_launched_environment",
    "check_launched_plan",
    "deepspeed_config",
    "launch_files",
    "launch_invariants",
    "manifest_plan_arguments",
    "model_identity",
    "read_manifest",
]
