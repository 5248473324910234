"""Plans decided before, read back instead of decided again: a process that plans a model this machine planned
before with the same inputs (a script's `load()` of a checkpoint it loads every run) reads the plan from
cudaload's cache, and never imports or runs the policy (~5 ms of a fresh load()'s ~25 ms of its own: 21 modules).

The policy is pure: `decide_plan` reads the Machine, the ModelFacts, the Request and, for a spread model, where
transformers' own device_map="auto" places it (a meta model built from the config, by the installed
transformers, accelerate and torch), and nothing else. So the key is those inputs, each encoded exactly
(plans/exact_json.py): the machine as detected with its measurements (GPUs, CPU, packages and their versions,
cached Hub kernels, the launch, the dtype probe and tuning records that apply), the model's facts, the request,
the bytes of config.json and generation_config.json, and cudaload's own code (`code_identity`). A change in any
of them is another key.

All but one of those inputs stay put between processes; the RAM available does not (it moved by ~0.5 GB between
two runs here). The policy compares it (does the model fit, is there room beside it) and a generation section
sizes its KV cache from it (the largest batch, its budget, the reason saying how much was available). So the key
leaves it out, and a plan is stored with the range of RAM it holds over: decided again at a fifth less and a
quarter more (`RAM_RANGE`), it is stored only when both apply the same settings (`applied`: the from_pretrained
kwargs, the attention chain, the warnings, the generation settings and the tokenizer's), and read back only while
the RAM available is in that range. Its reasons and its KV-cache arithmetic are then those of the RAM available
when it was stored. A GPU's free memory is kept in the key as it is (two GPUs' free memory compared would not be
bounded by the range's ends).

Stored and read only where the key holds every input: a local folder planned for this machine (detected), an
inference plan, without remote code (its modeling files place the meta model) or an override that chooses other
files (`SOURCE_KWARGS`, `config=`), and whose request encodes exactly (an object of yours passed through, e.g. a
BitsAndBytesConfig, has no exact form: that plan is decided each time). A file that is unreadable, of another
schema or key, or that does not rebuild into a Plan, is decided again and rewritten. Files live in
`<cache>/plans/` as the other records do (capability/cache.py: atomic, 0600, folders 0700, not read from a folder
others can write).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..capability.cache import cache_dir, read_json, read_regular_file, write_json
from ..facts.kv_cache import GenerationFacts, KvLayers
from ..facts.machine import Machine
from ..facts.model import ModelFacts
from ..plans import Decision, GenerationPlan, Plan, Rejected
from ..plans.exact_json import NotExact, decode, encode
from ..plans.sections import TokenizerPlan
from ..request import Request
from ..version import __version__
from .gather import SOURCE_KWARGS

__all__ = [
    "PLAN_RECORDS",
    "PLAN_STORE_SCHEMA",
    "RAM_RANGE",
    "applied",
    "code_identity",
    "plan_key",
    "store_plan",
    "stored_plan",
]

logger = logging.getLogger("cudaload.planner")

PLAN_STORE_SCHEMA = 1
"""The layout of a stored plan; another schema is decided again."""

RAM_RANGE = (0.8, 1.25)
"""A stored plan is decided again at these multiples of the RAM available, and read back while the RAM available
stays between them."""

PLAN_RECORDS: Mapping[str, type] = {
    cls.__qualname__: cls
    for cls in (Plan, Decision, Rejected, GenerationPlan, GenerationFacts, KvLayers, TokenizerPlan)
}
"""The records an inference plan is made of: the only classes a stored plan may name."""


@functools.cache
def code_identity(package: str | None = None) -> str:
    """cudaload's code, as the plans it decides depend on it. Installed (an installer's `RECORD` beside the package):
    that RECORD's size and modification time, which every install rewrites, the same version built again included
    (one stat). A source tree (PYTHONPATH, an editable install, a checkout switching branches, where the version
    stays while the policy changes): every module's size and modification time (~2 ms in a fresh process).
    `package`: the package folder (default: this cudaload's)."""
    package = package or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        record = os.stat(os.path.join(os.path.dirname(package), f"cudaload-{__version__}.dist-info", "RECORD"))
    except OSError:
        pass
    else:
        return f"cudaload {__version__} installed, RECORD {record.st_size} bytes at {record.st_mtime_ns}"
    stamps = []
    for folder, folders, files in os.walk(package):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                info = os.stat(os.path.join(folder, name))
                stamps.append(f"{os.path.relpath(folder, package)}/{name} {info.st_size} {info.st_mtime_ns}")
    return hashlib.sha256("\n".join(stamps).encode()).hexdigest()


def plan_key(
    model: Any, machine: Machine, facts: ModelFacts, request: Request, overrides: Mapping[str, Any]
) -> str | None:
    """The key of the plan `decide_plan(machine, facts, request, placer=...)` gives for `model`, or None where no
    stored plan applies (not a local folder with a config.json, a fine-tuning plan, remote code, an override that
    chooses other files, a value with no exact form)."""
    if not isinstance(model, (str, os.PathLike)) or request.training is not None:
        return None
    if overrides.get("trust_remote_code") is True or any(
        overrides.get(key) not in (None, "") for key in (*SOURCE_KWARGS, "config")
    ):
        return None
    folder = os.fspath(model)
    config = read_regular_file(os.path.join(folder, "config.json")) if os.path.isdir(folder) else None
    if config is None:
        return None
    generation_config = read_regular_file(os.path.join(folder, "generation_config.json"))
    try:
        inputs = {
            "schema": PLAN_STORE_SCHEMA,
            "code": code_identity(),
            "config": hashlib.sha256(config).hexdigest(),
            "generation_config": hashlib.sha256(generation_config).hexdigest() if generation_config else None,
            "machine": encode(_with_ram(machine, None)),
            "facts": encode(facts),
            "request": encode(request),
        }
    except NotExact as exc:
        logger.debug("plan of %s not stored: %s", folder, exc)
        return None
    return hashlib.sha256(json.dumps(inputs, separators=(",", ":")).encode()).hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / "plans" / f"{key[:32]}.json"


def applied(plan: Plan) -> Any:
    """What `load()` applies of `plan`, encoded: the from_pretrained kwargs, the attention chain, the classes, the
    warnings it issues, what is consented to, each generation section's settings (generate kwargs, padding side,
    cache implementation, compile, its warnings) and the tokenizer's; not the reasons, nor the KV-cache arithmetic
    behind a generation section (its largest batch and budget, which follow the RAM available)."""

    def settings(section: GenerationPlan | None) -> Any:
        if section is None:
            return None
        return (
            section.generate_kwargs,
            section.padding_side,
            section.cache_implementation,
            section.compile,
            section.dtype,
            section.warnings,
        )

    tokenizer = plan.tokenizer
    return encode(
        (
            plan.kwargs,
            plan.attention_chain,
            plan.explicit,
            plan.model_class,
            plan.auto_class,
            plan.warnings,
            plan.hub_code,
            settings(plan.generation),
            tuple((link, settings(section)) for link, section in plan.generation_fallbacks),
            None
            if tokenizer is None
            else tuple(d.value for d in (tokenizer.padding_side, tokenizer.training_padding_side, tokenizer.pad_token)),
        )
    )


def _with_ram(machine: Machine, available: int | None) -> Machine:
    return replace(machine, cpu=replace(machine.cpu, memory_available=available))


def _ram_range(machine: Machine) -> tuple[int, int] | None:
    """The RAM available a plan stored now is checked at and holds over (never past the RAM installed)."""
    available = machine.cpu.memory_available
    if available is None:
        return None
    low, high = (int(available * share) for share in RAM_RANGE)
    return low, min(high, machine.cpu.memory_total or high)


def stored_plan(key: str, machine: Machine) -> Plan | None:
    """The plan stored under `key` when `machine`'s RAM available is in the range it holds over; None: none
    there, another schema or key, another RAM range, or a file that does not rebuild into a Plan (then
    `store_plan` writes it again)."""
    path = _path(key)
    data = read_json(path, {"schema": int, "key": str, "ram": Any, "plan": Any})
    if data is None or data["schema"] != PLAN_STORE_SCHEMA or data["key"] != key:
        return None
    available, ram = machine.cpu.memory_available, data["ram"]
    if available is None or ram is None:
        if available is not None or ram is not None:
            return None
    elif not (isinstance(ram, list) and len(ram) == 2 and all(type(end) is int for end in ram)):
        return None
    elif not ram[0] <= available <= ram[1]:
        logger.debug("stored plan %s holds for %s to %s bytes of RAM available, not %s", path, *ram, available)
        return None
    try:
        plan = decode(data["plan"], PLAN_RECORDS)
    except (TypeError, ValueError, RecursionError) as exc:
        logger.debug("stored plan %s not read: %s", path, exc)
        return None
    if not isinstance(plan, Plan):
        return None
    logger.debug("plan read from %s", path)
    return plan


def store_plan(key: str, plan: Plan, machine: Machine, decide: Callable[[Machine], Plan]) -> bool:
    """Store `plan`, which `decide(machine)` gave, under `key` with the RAM range it holds over (`decide` run at
    both ends applies the same settings). False when it does not hold over the range (a limit is near), has no
    exact form (a value of yours in its kwargs), does not read back as itself, or cannot be
    written: it is then decided next time, a cost, not an error."""
    try:
        encoded = encode(plan)
        exact = encode(decode(encoded, PLAN_RECORDS)) == encoded
    except (NotExact, TypeError, ValueError) as exc:
        logger.debug("plan of %s not stored: %s", plan.model, exc)
        return False
    if not exact:
        logger.debug("plan of %s not stored: it does not read back as itself", plan.model)
        return False
    ram = _ram_range(machine)
    settings = applied(plan)
    for end in ram or ():
        try:
            same = applied(decide(_with_ram(machine, end))) == settings
        except Exception:  # any refusal at another RAM: not stored; the plan made here stands
            same = False
        if not same:
            logger.debug(
                "plan of %s not stored: it applies other settings at %s bytes of RAM available", plan.model, end
            )
            return False
    return write_json(_path(key), {"schema": PLAN_STORE_SCHEMA, "key": key, "ram": ram, "plan": encoded})
