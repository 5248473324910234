"""`cudaload launch`: plan a training job on nodes x GPUs and write its launch files (torchrun, accelerate,
DeepSpeed, SLURM) into a folder, or print them; it ends with the commands that run them on each node."""

from __future__ import annotations

import argparse
from typing import Any

from ..announce import fitted
from .plan_command import check_model_source, machine_for, parallel_overrides

__all__ = ["launch_command", "lora_overrides"]


def lora_overrides(args: argparse.Namespace) -> dict[str, Any] | None:
    """load_for_finetune's `lora=` from --lora-r, --lora-alpha, --lora-dropout, --target-modules (those given)."""
    lora: dict[str, Any] = {}
    for flag, key in (("lora_r", "r"), ("lora_alpha", "lora_alpha"), ("lora_dropout", "lora_dropout")):
        if getattr(args, flag) is not None:
            lora[key] = getattr(args, flag)
    if args.target_modules is not None:
        names = [name.strip() for name in args.target_modules.split(",")]
        lora["target_modules"] = "all-linear" if names == ["all-linear"] else names
    return lora or None


def launch_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    from ..launch import EMITTERS, launch_files

    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("dtype",) if getattr(args, k)}
    lora = lora_overrides(args)
    if lora is not None:
        overrides["lora"] = lora
    quantize = args.quantize or "auto"
    # As plan does: a path that is not there fails before transformers is imported, then the flags' usage errors,
    # then the Hub, asked only for an id whose config is not cached (issue 46).
    check_model_source(args.model, local_only=True)
    machine = machine_for(args, parser)
    check_model_source(args.model)
    files = launch_files(
        args.model,
        machine=machine,
        emit=args.emit or EMITTERS[:2],
        script=args.script,
        script_args=args.script_args,
        main_address=args.main_address,
        port=args.port,
        manifest_path=args.manifest_path,
        train=args.train,
        quantize=None if quantize == "none" else quantize,
        seq_len=args.seq_len or 2048,
        batch_size=args.batch_size or 1,
        gradient_checkpointing=args.gradient_checkpointing,
        **parallel_overrides(args),
        **overrides,
    )
    if args.out is None:
        text = "\n".join(f"==> {name} <==\n{content}" for name, content in files.files.items())
        steps = files.commands()
        return (
            text + "\nWrite them with --out FOLDER, copy the folder to every node, then run:\n  " + "\n  ".join(steps)
        )
    written = files.write(args.out, force=args.force)
    strategy = files.plan.decision("parallelism").value
    steps = files.commands(args.out)
    wrote = f"{strategy}: wrote {len(written)} files into {args.out}: " + ", ".join(p.name for p in written)
    return fitted(wrote) + "\nCopy the folder to every node (the same path), then run:\n  " + "\n  ".join(steps)
