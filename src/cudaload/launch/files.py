"""`launch_files()`: plan a training job and write its launch for each engine (one emitter module each:
torchrun.py, accelerate.py, deepspeed.py, slurm.py), with the manifest that lists every file's digest and that
every launched rank checks its own plan against (check.py, agree.py). A fifth engine is one more module and one
line in EMITTERS' table."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PlacementError, SettingError
from ..facts.machine import Machine
from ..frozen import frozen
from ..plans import Plan
from .accelerate import accelerate_files
from .deepspeed import deepspeed_files
from .folder import write_set
from .job import MANIFEST, Job, shell_line
from .manifest import MANIFEST_VERSION, launch_invariants, model_identity, sha256
from .slurm import slurm_files
from .torchrun import torchrun_files

__all__ = ["EMITTERS", "LaunchFiles", "launch_files"]

_EMITTERS: dict[str, Callable[[Plan, Job], dict[str, str]]] = {
    "torchrun": lambda plan, job: torchrun_files(job),
    "accelerate": accelerate_files,
    "deepspeed": lambda plan, job: deepspeed_files(plan, job.strategy),
    "slurm": lambda plan, job: slurm_files(job),
}
EMITTERS = tuple(_EMITTERS)


@frozen
class LaunchFiles:
    """The launch of one planned job (`launch_files()`): file name -> text, and the plan it was written from.

    Attributes:
        plan: The fine-tuning plan the files launch (its "parallelism" decision is the strategy).
        manifest: What `cudaload-launch.json` holds: the layout, the link, the decisions and the model every
            rank must reach too, and the sha256 digest of every other file.
        files: File name -> text (scripts, configs, the manifest); `write(folder)` writes them.
    """

    plan: Plan
    manifest: Mapping[str, Any]
    files: Mapping[str, str]

    def write(self, folder: str | os.PathLike[str], *, force: bool = False) -> list[Path]:
        """Write the whole set as `folder` (made if missing; an earlier set there is replaced whole), through a
        temporary folder beside it renamed into place; the scripts executable. The paths written.

        Raises:
            SettingError: `folder` is a symbolic link, not a folder, or holds files cudaload did not write
                (unless `force`).
        """
        return write_set(folder, self.files, force=force)

    def commands(self, folder: str | os.PathLike[str] | None = None) -> list[str]:
        """What to run, one line per node and engine, each path quoted for the shell: the files in `folder`
        (default None: the folder they were copied to, as the working directory)."""
        where = Path(folder) if folder is not None else None

        def path(name: str) -> str:
            return shell_line([str(where / name) if where is not None else f"./{name}"])

        nodes = int(self.manifest["nodes"])
        lines = [
            f"node {n}: bash {path(f'torchrun-node{n}.sh')}"
            for n in range(nodes)
            if f"torchrun-node{n}.sh" in self.files
        ]
        if "accelerate-launch.sh" in self.files:
            lines += [f"node {n} (accelerate): NODE_RANK={n} bash {path('accelerate-launch.sh')}" for n in range(nodes)]
        if "launch.sbatch" in self.files:
            cd = f"cd {shell_line([str(where)])} && " if where is not None else ""
            lines.append(f"SLURM (once, from a login node): {cd}sbatch launch.sbatch")
        return lines


def launch_files(
    model: Any,
    *,
    machine: Machine | None = None,
    nodes: int = 1,
    ranks_per_node: int | None = None,
    interconnect: str | None = None,
    parallelism: str | None = None,
    node_memory: int | str | None = None,
    emit: Iterable[str] = EMITTERS,
    script: str = "train.py",
    script_args: Sequence[str] = (),
    main_address: str = "$MASTER_ADDR",
    port: int = 29500,
    manifest_path: str | None = None,
    **plan_kwargs: Any,
) -> LaunchFiles:
    """Plan the fine-tuning of `model` on `nodes` x `ranks_per_node` and write its launch for each engine.

    The plan is `cudaload.plan(model, finetune=True, nodes=..., ...)`: its `parallelism` decision picks DDP,
    FSDP2 (full or hybrid shard), DeepSpeed ZeRO or tensor parallel; the files launch that strategy, and
    `cudaload-launch.json` records the plan and the model, which `load_for_finetune()` in every launched rank
    checks its own against, all ranks together (`LaunchMismatchError` on every rank when any differs).

    Every value reaches a shell line through `shlex.quote`, the YAML through `yaml.safe_dump` and the JSON
    through `json.dumps`; the address, port, script and its arguments are checked first.

    Args:
        model: A local path or Hub id, a `PretrainedConfig` or `ModelFacts` (as `plan()` takes).
        machine: One node of the job (default None: this machine; e.g. `Machine.simulated("H100", count=8)`).
        nodes: Nodes in the job (default 1).
        ranks_per_node: Processes per node (default None: one per GPU; 1 on a CPU).
        interconnect: The link between nodes (`--interconnect`; default None: "ethernet-100g").
        parallelism: "auto" (default None), "deepspeed" or one strategy, validated and kept.
        node_memory: Each node's RAM (`--node-memory`), bytes or a size such as "512GiB" (default None: this
            machine's); ZeRO-3 offload's CPU state must fit it.
        emit: Which launches to write: "torchrun" (a script per node), "accelerate" (config + script),
            "deepspeed" (ds_config.json; needs a DeepSpeed plan), "slurm" (an sbatch script). Default: all
            that apply.
        script: The training script the launch runs (default "train.py").
        script_args: Its arguments, a list of strings.
        main_address: Node 0's host name or IP address, the rendezvous endpoint, or "$NAME" for a variable the
            shell reads where the script runs (default "$MASTER_ADDR").
        port: The rendezvous port, 1-65535 (default 29500).
        manifest_path: Where the ranks read the manifest (default None: beside the launch files).
        **plan_kwargs: More `plan()` arguments (train, quantize, lora, seq_len, batch_size, dtype, ...): train="full"
            launches full training (each rank's `load_for_finetune(..., train="full")` checks it plans the same).

    Returns:
        `LaunchFiles`: the plan, the manifest and every file's text; `.write(folder)` writes them.

    Raises:
        PlacementError: nothing fits the ranks (or the nodes' RAM), or the strategy asked for does not fit or
            cannot be applied (tensor parallel for training).
        SettingError: an unknown `emit`, interconnect or strategy, "deepspeed" for a plan that is not, or an
            address, port, script or script arguments that are not one.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> h100 = cudaload.Machine.simulated("H100", count=8)
        >>> files = cudaload.launch_files(path, machine=h100, nodes=2, emit=["torchrun"], main_address="10.0.0.1")
        >>> files.plan.decision("parallelism").value, sorted(files.files)
        ('ddp', ['cudaload-launch.json', 'torchrun-node0.sh', 'torchrun-node1.sh'])
        >>> files.files["torchrun-node1.sh"].splitlines()[-1]  # doctest: +ELLIPSIS
        'exec torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1 --master-port 29500 train.py'
    """
    from ..planner import plan as make_plan

    wanted = tuple(emit) if not isinstance(emit, str) else (emit,)
    unknown = [e for e in wanted if e not in EMITTERS]
    if unknown or not wanted:
        raise SettingError(f"emit={wanted!r}: pass some of {list(EMITTERS)}.")
    # Checked before planning (seconds): a bad address or argument list fails at once.
    checked = Job.checked(
        nodes=1, ranks=1, strategy="", address=main_address, port=port, manifest=manifest_path, script=script,
        args=script_args, gpus=False,
    )  # fmt: skip
    the_plan = make_plan(
        model,
        machine=machine,
        finetune=True,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        interconnect=interconnect,
        parallelism=parallelism,
        node_memory=node_memory,
        **plan_kwargs,
    )
    section = the_plan.finetune
    assert section is not None and section.parallelism is not None  # a fine-tuning plan with a layout
    layout = section.parallelism
    strategy = layout["strategy"]
    if strategy is None:
        raise PlacementError(
            f"{the_plan.model} does not fit {layout['nodes']} x {layout['ranks_per_node']} ranks with any strategy "
            f"({the_plan.decision('parallelism').reason}). Add nodes, pass quantize='4bit', or shorten seq_len."
        )
    if "deepspeed" in wanted and not strategy.startswith("deepspeed"):
        raise SettingError(
            f"emit deepspeed, but the plan chose {strategy}: pass parallelism='deepspeed' for a DeepSpeed launch."
        )
    job = Job(
        layout["nodes"], layout["ranks_per_node"], strategy, checked.address, checked.port, checked.manifest,
        checked.script, checked.args, gpus="no CUDA GPU" not in the_plan.machine,
    )  # fmt: skip
    if strategy.startswith("deepspeed") and "deepspeed" not in wanted:
        wanted = (*wanted, "deepspeed")  # accelerate's and torchrun's DeepSpeed launch read ds_config.json
    files: dict[str, str] = {}
    for engine in EMITTERS:
        if engine in wanted:
            files |= _EMITTERS[engine](the_plan, job)
    manifest = {
        "cudaload_launch": MANIFEST_VERSION,
        "model": the_plan.model,
        "nodes": layout["nodes"],
        "ranks_per_node": layout["ranks_per_node"],
        "interconnect": layout["interconnect"] if not layout["interconnect_assumed"] else None,
        # Yours only (`node_memory=`): a rank otherwise reads its own node's RAM, not the planning machine's.
        "node_memory": layout["node_memory"] if node_memory is not None else None,
        "parallelism": parallelism or "auto",
        "decisions": launch_invariants(the_plan),
        "model_identity": model_identity(the_plan),
        "files": {name: sha256(text.encode()) for name, text in sorted(files.items())},
    }
    files = {MANIFEST: json.dumps(manifest, indent=2) + "\n", **files}
    return LaunchFiles(the_plan, manifest, files)
