"""`cudaload launch`: plan a training job on nodes x GPUs and write its launch files (torchrun, accelerate,
DeepSpeed, SLURM) into a folder, or print them."""

from __future__ import annotations

import argparse
from typing import Any

from .plan_command import machine_for, parallel_overrides

__all__ = ["launch_command"]


def launch_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    from ..launch_writer import EMITTERS, launch_files

    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("dtype",) if getattr(args, k)}
    quantize = args.quantize or "auto"
    files = launch_files(
        args.model,
        machine=machine_for(args, parser),
        emit=args.emit or EMITTERS[:2],
        script=args.script,
        script_args=args.script_args,
        main_address=args.main_address,
        port=args.port,
        manifest_path=args.manifest_path,
        quantize=None if quantize == "none" else quantize,
        seq_len=args.seq_len or 2048,
        batch_size=args.batch_size or 1,
        **parallel_overrides(args),
        **overrides,
    )
    if args.out is None:
        return "\n".join(f"==> {name} <==\n{text}" for name, text in files.files.items())
    written = files.write(args.out)
    strategy = files.plan.decision("parallelism").value
    return f"{strategy}: wrote " + ", ".join(str(p) for p in written)
