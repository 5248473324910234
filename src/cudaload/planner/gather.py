"""The facts plan() gathers: the model's (read through the files from_pretrained will read), this machine's
measurements, and where transformers itself will place a spread model."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..capability.model_config import read_model_facts
from ..errors import ModelConfigError, SettingError
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..facts.placer import Landing, Placer
from ..request import Request
from ..upstream_imports import import_transformers

__all__ = ["SOURCE_KWARGS", "read_facts", "upstream_placer", "with_measurements"]


# from_pretrained's arguments that choose which files it reads: transformers 5.22-5.25
# `_BaseAutoModelClass.from_pretrained` (models/auto/auto_factory.py) passes its `hub_kwargs` (these first
# six, and `revision`, which plan() passes on its own) with `code_revision` to AutoConfig.from_pretrained, and
# `gguf_file` among the rest of its kwargs. The facts are read through the same ones.
SOURCE_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "proxies",
    "subfolder",
    "token",
    "code_revision",
    "gguf_file",
)


def read_facts(model: Any, model_class: str | None, overrides: Mapping[str, Any]) -> ModelFacts:
    """The facts of what from_pretrained will read with these overrides: the same subfolder, cache,
    GGUF file and config, so that the model planned is the model loaded."""
    name = str(model) if isinstance(model, os.PathLike) else model
    # "" is transformers' own default for subfolder (and reads no GGUF file): the same as unset.
    where = {key: overrides[key] for key in SOURCE_KWARGS if overrides.get(key) not in (None, "")}
    for key in ("subfolder", "gguf_file"):
        if key in where and not isinstance(where[key], (str, os.PathLike)):
            raise SettingError(
                f"{key}={where[key]!r} ({type(where[key]).__name__}): pass a file or folder name, or leave it unset."
            )
    trust = overrides.get("trust_remote_code", False) is True
    given_config = overrides.get("config")
    if given_config is not None:
        import_transformers()
        from transformers import PretrainedConfig

        if not isinstance(given_config, PretrainedConfig):
            # AutoModel*.from_pretrained reads the checkpoint's own config when config= is not a config object
            # (auto_factory.py), so a path given here would be planned and then silently not used.
            raise SettingError(
                f"config={given_config!r:.60} ({type(given_config).__name__}): from_pretrained uses config= only "
                "as a PretrainedConfig (an Auto class ignores anything else). Pass "
                "AutoConfig.from_pretrained(...) built the way you want, or leave it unset."
            )
        # from_pretrained builds the model from this config and reads only the weights from `model`.
        facts = read_model_facts(given_config, auto_class=model_class, trust_remote_code=trust)
        return replace(facts, source=str(name))
    local = isinstance(name, str) and os.path.isdir(name)
    if local:
        for key in ("cache_dir", "force_download", "local_files_only", "proxies", "token"):
            where.pop(key, None)  # Hub-only: transformers reads a local folder as it is
    if local and "subfolder" in where:
        # transformers' cached_file reads <folder>/<subfolder>/<file>; so do the facts (and cache them).
        inner = os.path.join(name, where.pop("subfolder"))
        if not os.path.isdir(inner):
            raise ModelConfigError(
                f"subfolder={overrides['subfolder']!r}: {name!r} has no such folder. Its folders: "
                f"{sorted(e for e in os.listdir(name) if os.path.isdir(os.path.join(name, e)))[:6]}."
            )
        facts = read_model_facts(
            inner,
            auto_class=model_class,
            trust_remote_code=trust,
            revision=overrides.get("revision"),
            config_kwargs=where or None,
        )
        return replace(facts, source=name)
    return read_model_facts(
        name,
        auto_class=model_class,
        trust_remote_code=trust,
        revision=overrides.get("revision"),
        config_kwargs=where or None,
    )


def upstream_placer(model: Any, facts: ModelFacts, overrides: Mapping[str, Any]) -> Placer | None:
    """The `Placer` fact provider decide_plan asks where transformers' own device_map="auto" puts `model`
    (capability/upstream_placement.py, run on a meta model built from the config), with its source,
    Auto class, revision and trust bound; answers are kept per (dtype, max_memory), so the policy's
    rounds (policy/settle.py) build each meta model once. None when the meta model would not be the model
    loaded: a subfolder, GGUF file, cache or config of yours (the meta model is built from the root's)."""
    if any(overrides.get(key) not in (None, "") for key in (*SOURCE_KWARGS, "config")):
        return None
    source = str(model) if isinstance(model, os.PathLike) else model
    trust = overrides.get("trust_remote_code", False) is True
    revision = overrides.get("revision")
    answers: dict[tuple[str, str], Landing | None] = {}

    def place(dtype: str, max_memory: Mapping[Any, Any]) -> Landing | None:
        from ..capability.upstream_placement import upstream_placement

        key = (dtype, repr(sorted(max_memory.items(), key=str)))
        if key not in answers:
            answers[key] = upstream_placement(
                source, facts.auto_class, dtype, max_memory, trust_remote_code=trust, revision=revision
            )
        return answers[key]

    return place


def with_measurements(machine: Machine, facts: ModelFacts, probe: bool, request: Request) -> Machine:
    """This machine with the measurements that apply to `facts` (tuning records, the CPU dtype probe)."""
    from ..capability import measure_for

    on_cpu = not machine.usable().gpus
    return measure_for(machine, facts, probe=probe, dtype_chosen=request.dtype is not None, on_cpu=on_cpu)
