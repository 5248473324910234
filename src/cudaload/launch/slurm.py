"""The SLURM launch: an sbatch script that starts one torchrun per node with `srun`. The torchrun line runs
inside `bash -c` (so that each node expands its own $SLURM_NODEID): it is quoted once as a line of values
(`shell_line`) and once more as the single argument of `bash -c`."""

from __future__ import annotations

import shlex

from .job import LAUNCH_ENV, Job, Word, shell_line
from .torchrun import torchrun_argv

__all__ = ["slurm_files"]


def _sbatch(job: Job) -> str:
    node = Word('"$SLURM_NODEID"')  # expanded by the `bash -c` srun starts on each node
    per_node = "exec " + shell_line(torchrun_argv(job, node))
    manifest = job.manifest_word('"$SLURM_SUBMIT_DIR"')
    address = job.address_variable
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=cudaload-{job.strategy.replace('+', '-')}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={job.ranks}"] if job.gpus else []),
        "#SBATCH --exclusive",
        "set -euo pipefail",
        "# One torchrun per node (srun starts one task on each); node 0 is the rendezvous endpoint.",
        *(
            [f'export {address}="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"']
            if address is not None
            else []
        ),
        # sbatch runs a spooled copy of this script: the files are where it was submitted from.
        f"export {LAUNCH_ENV}={shell_line([manifest])}",
        f"srun bash -c {shlex.quote(per_node)}",
        "",
    ]
    return "\n".join(lines)


def slurm_files(job: Job) -> dict[str, str]:
    """launch.sbatch."""
    return {"launch.sbatch": _sbatch(job)}
