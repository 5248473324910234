"""`cudaload plan`: the machine planned for (this one, or one simulated from the flags) and the plan,
as text or JSON."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from packaging.version import InvalidVersion, Version

from ..facts.machine import Launch, Machine

__all__ = ["PARALLEL_OPTIONS", "machine_for", "parallel_overrides", "plan_command", "simulates"]


_AS_LAUNCHED: dict[str, tuple[Any, int | None]] = {
    "auto": ("ddp", None),
    "ddp": ("ddp", None),
    "fsdp": ("fsdp", None),
    "fsdp-hybrid": ("fsdp", None),
    "deepspeed": ("deepspeed", None),
    "deepspeed-zero1": ("deepspeed", 1),
    "deepspeed-zero2": ("deepspeed", 2),
    "deepspeed-zero3": ("deepspeed", 3),
    "deepspeed-zero3-offload": ("deepspeed", 3),
}
"""--parallelism as the launch a rank of an inference plan runs under (tp+fsdp: fine-tuning only)."""


def _say_deprecated(args: argparse.Namespace) -> None:
    """--world-size/--strategy/--zero-stage: still honoured in `plan`, and the line says the one vocabulary."""
    import sys

    from ..announce import fitted
    from .output import emit

    old = [f for f, given in (("--world-size", args.world_size > 1), ("--strategy", args.strategy),
                               ("--zero-stage", args.zero_stage is not None)) if given]  # fmt: skip
    if old and getattr(args, "command", None) == "plan":
        emit(
            fitted(
                f"cudaload: {', '.join(old)} {'is a deprecated alias' if len(old) == 1 else 'are deprecated aliases'}"
                ": use --ranks-per-node N (and --nodes M for several machines) and --parallelism "
                "(ddp, fsdp, deepspeed-zero2, ...): the same job in the flags plan --finetune and launch share"
            ),
            sys.stderr,
        )


def _layout_launch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Launch | None:
    """`plan --nodes/--ranks-per-node` without --finetune: each rank's inference plan under that launch."""
    if getattr(args, "command", None) != "plan" or args.finetune or not (args.nodes or args.ranks_per_node):
        return None
    if args.world_size > 1 or args.strategy or args.zero_stage is not None:
        parser.error("--world-size/--strategy/--zero-stage are the deprecated form of --nodes/--ranks-per-node/"
                     "--parallelism: pass one set")  # fmt: skip
    ranks = args.ranks_per_node or 1
    if args.parallelism not in (None, *_AS_LAUNCHED):
        parser.error(f"--parallelism {args.parallelism} is planned for fine-tuning: add --finetune")
    strategy, stage = _AS_LAUNCHED[args.parallelism or "auto"]
    world = (args.nodes or 1) * ranks
    if world <= 1:
        return None
    return Launch(launcher="torchrun", world_size=world, local_world_size=ranks, strategy=strategy, zero_stage=stage)


def _launch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Launch | None:
    _say_deprecated(args)
    layout = _layout_launch(args, parser)
    if layout is not None:
        return layout
    if args.world_size <= 1:
        if args.strategy or args.zero_stage is not None:
            parser.error("--strategy and --zero-stage describe a distributed launch: add --world-size N (N > 1)")
        return None
    if args.zero_stage is not None and args.strategy != "deepspeed":
        parser.error("--zero-stage goes with --strategy deepspeed")
    return Launch(
        launcher="torchrun",
        world_size=args.world_size,
        local_world_size=args.world_size,
        strategy=args.strategy or "ddp",
        zero_stage=args.zero_stage,
    )


def simulates(args: argparse.Namespace) -> bool:
    """Whether the flags describe a simulated machine (a GPU, CPU flags, packages, Hub state) rather than this one."""
    simulated = args.packages or args.without or args.default_packages or args.cached_kernel
    return bool(args.gpu or args.cpu_flags is not None or simulated)


def machine_for(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Machine | None:
    """The machine to plan for: simulated when any simulation flag is given, this one under a
    simulated launch with only --world-size, else None (this machine as detected)."""
    launch = _launch(args, parser)
    gpus = None if args.gpu is None else [name.strip() for name in args.gpu.split(",")]
    if gpus is not None and not all(gpus):
        parser.error(
            f"--gpu {args.gpu!r} {'has an empty name in its list' if len(gpus) > 1 else 'names no GPU'}: pass a GPU "
            "name (e.g. T4, A100, 'H100 PCIe', custom:sm90:80GiB) or a comma list of them (drop --gpu to plan for "
            "this machine)"
        )
    if args.count < 1:
        parser.error(f"--count {args.count}: a simulated machine has at least one GPU (drop --gpu for a CPU)")
    if args.count != 1 and not args.gpu:
        parser.error("--count needs --gpu: it repeats a simulated GPU")
    if args.count != 1 and gpus is not None and len(gpus) > 1:
        parser.error(
            f"--count {args.count} with the GPU list --gpu {args.gpu!r}: a list names every GPU, --count repeats a "
            f"single one (e.g. --gpu {gpus[0]} --count {args.count}, or repeat the name in the list)"
        )
    # `--gpu A10G --world-size 4` names the GPU kind each rank has (the docs' form); a count or a list
    # names the machine's GPUs, and then a launch cannot run more processes than it has GPUs.
    simulated_gpus = 0 if gpus is None else len(gpus) if len(gpus) > 1 else args.count if args.count > 1 else 0
    if launch is not None and simulated_gpus and args.world_size > simulated_gpus:
        parser.error(
            f"--world-size {args.world_size} with {simulated_gpus} simulated GPU(s): a launch on one machine runs one "
            f"process per GPU, so {args.world_size - simulated_gpus} would have none. Pass --count {args.world_size} "
            f"(or --world-size {simulated_gpus})."
        )
    if not simulates(args):
        if launch is None and not args.offline:
            return None
        from ..capability import detect

        machine = detect()
        if args.offline:  # this machine, its Hub offline (plan also runs the whole command under HF_HUB_OFFLINE=1)
            machine = dataclasses.replace(machine, hub=dataclasses.replace(machine.hub, offline=True))
        return machine if launch is None else dataclasses.replace(machine, launch=launch)
    packages: dict[str, str | None] = dict.fromkeys(args.without)
    for spec in args.packages:
        name, sep, version = spec.partition("==")
        if not sep or not name:
            parser.error(f"--with expects PKG==VERSION, got {spec!r}")
        try:
            Version(version)
        except InvalidVersion:
            parser.error(f"--with {spec!r}: {version!r} is not a version (e.g. flash-attn==2.8.3)")
        if name in args.without:
            parser.error(f"--with {spec} and --without {name} name the same package: keep one of the two")
        packages[name] = version
    return Machine.simulated(
        gpus if gpus is None or len(gpus) > 1 else gpus[0],
        count=args.count,
        packages=packages,
        installed_packages=not args.default_packages,
        offline=args.offline,
        cached_kernels=args.cached_kernel,
        cpu_flags=args.cpu_flags.split(",") if args.cpu_flags else ("avx2",),
        launch=launch or Launch(),
    )


PARALLEL_OPTIONS = ("nodes", "ranks-per-node", "interconnect", "node-memory", "parallelism")


def parallel_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """plan()'s layout arguments from --nodes, --ranks-per-node, --interconnect, --node-memory and --parallelism
    (those given)."""
    names = [name.replace("-", "_") for name in PARALLEL_OPTIONS]
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


@contextlib.contextmanager
def offline_mode(offline: bool) -> Iterator[None]:
    """--offline: HF_HUB_OFFLINE=1 for the whole command (nothing is read from the network, as with the
    variable), restored afterwards for a caller that runs `main()` in its own process."""
    if not offline or hub_offline():
        yield
        return
    import sys

    before = os.environ.get("HF_HUB_OFFLINE")
    constants = sys.modules.get("huggingface_hub.constants")  # read at import: already imported, set it there too
    was = getattr(constants, "HF_HUB_OFFLINE", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if constants is not None:
        setattr(constants, "HF_HUB_OFFLINE", True)  # noqa: B010 (a module attribute mypy does not see)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before
        if constants is not None:
            setattr(constants, "HF_HUB_OFFLINE", was)  # noqa: B010


def check_model_source(model: str, *, local_only: bool = False) -> None:
    """Where MODEL is read from, settled before transformers is imported: a path (`/`, `./`, `~`) that is not
    there fails at once; a Hub id is read from the local cache, or from the Hub when it answers (asked once, in
    at most 3 s), else the error gives the `hf download` command. Said on stderr as it happens."""
    import sys

    from ..capability.hub_access import download_command, hub_reachable, in_local_cache, looks_like_a_path
    from ..errors import ModelConfigError
    from .output import emit

    if looks_like_a_path(model):
        if not os.path.exists(os.path.expanduser(model)):
            raise ModelConfigError(
                f"{model!r}: no such file or folder (a path; a Hub id has the form owner/name). Check the path."
            )
        return
    if local_only or in_local_cache(model):
        return
    if hub_offline():
        raise ModelConfigError(
            f"{model!r} is not a local folder and not in the Hub cache, and HF_HUB_OFFLINE (or --offline) reads "
            f"nothing from the network: download it first where there is a network: {download_command(model)}"
        )
    reachable, why = hub_reachable()
    if not reachable:
        raise ModelConfigError(
            f"{model!r} is not a local folder and not in the Hub cache, and the Hub cannot be reached ({why}). "
            f"Download it first where there is a network: {download_command(model)} (or pass a local folder)"
        )
    from ..announce import fitted

    said = f"cudaload: reading {model}'s config from the Hugging Face Hub (no local folder has that name)"
    emit(fitted(said), sys.stderr)


def plan_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    from ..planner import plan

    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("dtype", "attn_implementation") if getattr(args, k)}
    if args.hub_kernels:
        overrides["hub_kernels"] = True
    if args.gguf_file:
        overrides["gguf_file"] = args.gguf_file
    if args.context is not None and not args.generate:
        parser.error("--context goes with --generate")
    # Generation is planned as load() plans it (for a model that generates), so the plan shows the generation block
    # that `model.cudaload_plan.explain()` shows (issue 46); --generate requires it and takes --context.
    overrides["generate"] = True if args.generate else False if args.finetune else None  # a fine-tuning plan trains
    if args.generate:
        overrides["context"] = args.context
    # --nodes etc. alone: each rank's inference plan; these describe a fine-tuning one
    named = ("train", "quantize", "seq-len", "batch-size", "interconnect", "node-memory")
    given = [f"--{name}" for name in named if getattr(args, name.replace("-", "_"))]
    if given and not args.finetune:
        parser.error(
            f"{' and '.join(given)} describe{'s' if len(given) == 1 else ''} a fine-tuning plan: add --finetune"
        )
    if args.finetune:
        quantize = args.quantize or "auto"
        overrides |= {
            "finetune": True,
            "train": args.train,
            "quantize": None if quantize == "none" else quantize,
            "seq_len": args.seq_len or 2048,
            "batch_size": args.batch_size or 1,
            **parallel_overrides(args),
        }
    with offline_mode(args.offline):
        # A path that is not there fails before anything is imported; then the flags' usage errors (as argparse's
        # own), then the Hub, asked only for an id whose config is not cached.
        check_model_source(args.model, local_only=True)
        machine = machine_for(args, parser)
        check_model_source(args.model)
        result = plan(args.model, machine=machine, **overrides)
    if args.json:
        return result.to_json()
    from .doctor_command import fit

    return result.explain(cli=True) + (f"\n\n{fit([next_step(args, result)])}" if args.finetune else "")


# `cudaload launch` takes the plan's machine, layout and training options, not these (plan-only or output flags).
_NOT_FOR_LAUNCH = {"plan", "--finetune", "--json", "--generate", "--debug"}
_NOT_FOR_LAUNCH_WITH_VALUE = {"--attn", "--context", "--gguf-file"}


def next_step(args: argparse.Namespace, result: Any) -> str:
    """What to run after a fine-tuning plan: the load that applies it, and for a job of several ranks the
    `cudaload launch` command with the same options, which writes its launch files."""
    import shlex

    load = f"cudaload.load_for_finetune({args.model!r}{', train=' + repr(args.train) if args.train else ''})"
    parallel = result.finetune.parallelism if result.finetune is not None else None
    if parallel is None or int(parallel["nodes"]) * int(parallel["ranks_per_node"]) <= 1:
        return f"Next: in your training script, model = {load} applies this plan; cudaload bench --finetune times it."
    words: list[str] = []
    value_follows = False
    for word in getattr(args, "argv", []):
        if value_follows:
            value_follows = False
        elif word in _NOT_FOR_LAUNCH_WITH_VALUE:
            value_follows = True
        elif word not in _NOT_FOR_LAUNCH and word.split("=", 1)[0] not in _NOT_FOR_LAUNCH_WITH_VALUE:
            words.append(word)
    return (
        f"Next: cudaload launch {shlex.join(words)} writes this job's torchrun/accelerate files (--emit deepspeed, "
        f"--emit slurm too); each rank's script calls {load} and checks it plans the same."
    )
