"""The torchrun launch: one script per node, each one `exec torchrun ...` line whose every value is quoted
(torch 2.13 `torch.distributed.run` options: --nnodes, --node-rank, --nproc-per-node, --master-addr,
--master-port, then the script and its arguments)."""

from __future__ import annotations

from ..facts.launch import zero_stage
from .job import HERE, LAUNCH_ENV, Job, Word, shell_line

__all__ = ["deepspeed_exports", "torchrun_argv", "torchrun_files"]


def torchrun_argv(job: Job, node: int | str) -> list[str]:
    """torchrun's argv for `node` (an int, or a `Word` the shell expands); the address as `job.address_word()`."""
    return [
        "torchrun", "--nnodes", str(job.nodes), "--node-rank", node if isinstance(node, Word) else str(node),
        "--nproc-per-node", str(job.ranks), "--master-addr", job.address_word(), "--master-port", str(job.port),
        *job.command_tail(),
    ]  # fmt: skip


def _script(job: Job, node: int) -> str:
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# Node {node} of {job.nodes}: {job.ranks} ranks, {job.strategy} (planned by cudaload; run the script of",
            "# each node on that node). The training script applies the strategy itself.",
            "set -euo pipefail",
            f"export {LAUNCH_ENV}={shell_line([job.manifest_word(HERE)])}",
            *deepspeed_exports(job.strategy, job.gpus),
            f"exec {shell_line(torchrun_argv(job, node))}",
            "",
        ]
    )


def deepspeed_exports(strategy: str, gpus: bool) -> list[str]:
    """What `accelerate launch` sets for a DeepSpeed job (accelerate 1.16 `utils/launch.py`
    `prepare_deepspeed_cmd_env`: ACCELERATE_USE_DEEPSPEED, and ACCELERATE_DEEPSPEED_ZERO_STAGE, which it sets only
    from the YAML's zero_stage, not from a deepspeed_config_file), so that a rank is placed as a DeepSpeed rank of
    its stage (ZeRO-3: no device_map, the weights partitioned at load); a CPU plan's ranks on DeepSpeed's CPU
    accelerator."""
    stage = zero_stage(strategy)
    if stage is None:
        return []
    cpu = [] if gpus else ["export DS_ACCELERATOR=cpu  # DeepSpeed's CPU accelerator (gloo)"]
    return [
        "export ACCELERATE_USE_DEEPSPEED=true",
        f"export ACCELERATE_DEEPSPEED_ZERO_STAGE={shell_line([str(stage)])}",
        *cpu,
    ]


def torchrun_files(job: Job) -> dict[str, str]:
    """torchrun-node<N>.sh for every node."""
    return {f"torchrun-node{n}.sh": _script(job, n) for n in range(job.nodes)}
