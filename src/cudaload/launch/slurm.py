"""The SLURM launch: an sbatch script that starts one torchrun per node with `srun`. The torchrun line runs
inside `bash -c` (so that each node expands its own $SLURM_NODEID): it is quoted once as a line of values
(`shell_line`) and once more as the single argument of `bash -c`. Run under a real one-host SLURM 22.05
(Debian 12's slurm-wlm) by tests/test_launch_slurm.py."""

from __future__ import annotations

import shlex

from .job import LAUNCH_ENV, MANIFEST, Job, Word, shell_line
from .torchrun import torchrun_argv

__all__ = ["slurm_files"]


def _address_lines(variable: str) -> list[str]:
    """Node 0's address into `variable`: its NodeAddr, the address SLURM itself reaches it at (a node's name,
    what `scontrol show hostnames` lists, need not resolve: NodeName=gpu001 NodeAddr=10.0.0.1).

    Each value is assigned apart from `export`, so that a failing scontrol stops the script (set -e; `export`
    would return 0), and the first host is cut in the shell, not by `head`, whose early exit fails scontrol
    under pipefail."""
    no_address = shlex.quote("launch.sbatch: no NodeAddr in `scontrol show node` of node 0:")
    return [
        'hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"',
        'node0="$(scontrol show node --oneliner "${hosts%%$' + "'\\n'" + '*}")"',
        f'[[ "$node0" == *" NodeAddr="* ]] || {{ echo {no_address} "$node0" >&2; exit 1; }}',
        'node0="${node0#* NodeAddr=}"',
        f'export {variable}="${{node0%% *}}"',
    ]


def _sbatch(job: Job) -> str:
    node = Word('"$SLURM_NODEID"')  # expanded by the `bash -c` srun starts on each node
    per_node = "exec " + shell_line(torchrun_argv(job, node))
    manifest = job.manifest_word('"$SLURM_SUBMIT_DIR"')
    address = job.address_variable
    # Checked on the batch host before srun starts a rank: each rank would raise it later, one by one.
    hint = (
        f"submit launch.sbatch from the folder it was written to (cd FOLDER && sbatch launch.sbatch): the ranks "
        f"read {MANIFEST} from the folder sbatch was run in."
        if job.manifest is None
        else f"copy {MANIFEST} of the launch files there (manifest_path / --manifest-path)."
    )
    stop = f'"launch.sbatch: no launch manifest at ${LAUNCH_ENV}:" {shlex.quote(hint)}'
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=cudaload-{job.strategy.replace('+', '-')}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={job.ranks}"] if job.gpus else []),
        "#SBATCH --exclusive",
        # --exclusive gives the job every CPU of its nodes but not their memory where memory is a consumable
        # resource (SelectTypeParameters=CR_*_Memory): there the job gets DefMemPerCPU x CPUs and the ranks are
        # killed loading the model (seen under Slurm 22.05: 200 MiB). 0 is "all the memory of each node"
        # (sbatch --mem); a --mem given to sbatch on its command line still wins over this line.
        "#SBATCH --mem=0",
        "set -euo pipefail",
        "# One torchrun per node (srun starts one task on each); node 0 is the rendezvous endpoint.",
        *(_address_lines(address) if address is not None else []),
        # sbatch runs a spooled copy of this script: the files are where it was submitted from.
        f"export {LAUNCH_ENV}={shell_line([manifest])}",
        f'[[ -f "${LAUNCH_ENV}" ]] || {{ echo {stop} >&2; exit 1; }}',
        f"srun bash -c {shlex.quote(per_node)}",
        "",
    ]
    return "\n".join(lines)


def slurm_files(job: Job) -> dict[str, str]:
    """launch.sbatch."""
    return {"launch.sbatch": _sbatch(job)}
