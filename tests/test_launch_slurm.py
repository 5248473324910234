"""The SLURM launch cudaload writes, submitted to a real one-host SLURM (Debian's slurm-wlm 22.05 and munge, started
by the test: tests/slurm_cluster.py): `sbatch --wait launch.sbatch` from the folder it was written to, 1 node x 2
CPU ranks (gloo), a few LoRA steps of DDP. The job must end with exit 0, each rank's launch check pass (the rank
raises otherwise) and the losses equal one process's on the same global batch. The cluster counts memory as
most shared ones do (a job that asks for none gets DefMemPerCPU per CPU, and a step over it is killed).

Where slurmctld is not on PATH (or the test is not root) this module skips at import, except where
CUDALOAD_SLURM=required (.ci/run sets it where it installed slurm-wlm): there it fails."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import cudaload
import slurm_cluster
from cudaload.launch import launch_invariants

_why = slurm_cluster.missing()
if _why is not None:
    if os.environ.get("CUDALOAD_SLURM") == "required":
        pytest.fail(f"CUDALOAD_SLURM=required but {_why}", pytrace=False)
    pytest.skip(f"no SLURM here: {_why}", allow_module_level=True)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKERS = Path(__file__).parent / "distributed"
WORKER = WORKERS / "launched_worker.py"  # the DDP launch test's training script (tests/test_launch_runs.py)
TIMEOUT_S = 300
SEQ = 64  # launched_worker.SEQ


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.Cluster]:
    with slurm_cluster.running(tmp_path_factory.mktemp("slurm")) as started:
        yield started


def _env(cluster: slurm_cluster.Cluster) -> dict[str, str]:
    """sbatch's environment, which the job gets whole (sbatch --export=ALL, srun the same)."""
    here = str(Path(cudaload.__file__).resolve().parents[1])  # the ranks import the cudaload under test
    return {
        **os.environ,
        **cluster.env(),
        "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),  # torchrun
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "CUDALOAD_PROBE": "0",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _single(model: Path, rows: int, out: Path, env: dict[str, str]) -> list[float]:
    """The reference: one process, the whole global batch."""
    subprocess.run(
        [sys.executable, str(WORKER), str(model), "single", str(rows), str(out)],
        env=env, cwd=WORKERS, check=True, capture_output=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    return list(json.loads((out / "single-0.json").read_text())["losses"])


def _job(cluster: slurm_cluster.Cluster, job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields (slurmctld keeps a finished job for MinJobAge, 300 s by default)."""
    shown = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id], env=_env(cluster), capture_output=True, text=True, check=True
    )
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


def test_sbatch_runs_the_ddp_launch_on_a_real_slurm(
    cluster: slurm_cluster.Cluster, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    model, out, folder = tiny_models["llama"], tmp_path / "out", tmp_path / "launch"
    out.mkdir()
    files = cudaload.launch_files(
        model,
        machine=cudaload.detect(),
        nodes=1,
        ranks_per_node=2,
        emit=["slurm"],
        quantize=None,
        dtype="float32",
        lora={"lora_dropout": 0.0},
        gradient_checkpointing=False,
        seq_len=SEQ,
        batch_size=1,
        script=str(WORKER),
        script_args=[str(model), "ddp", "2", str(out)],
        port=_free_port(),
    )  # the default main_address, "$MASTER_ADDR": the script reads node 0 from `scontrol show hostnames`
    assert files.plan.decision("parallelism").value == "ddp"
    files.write(folder)
    env = _env(cluster)
    submitted = subprocess.run(
        ["sbatch", "--wait", "--parsable", "launch.sbatch"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    output = "\n".join(p.read_text()[-4000:] for p in folder.glob("slurm-*.out"))
    assert submitted.returncode == 0, f"sbatch --wait: {submitted.returncode} {submitted.stderr}\n{output}"
    job = _job(cluster, job_id)
    assert (job["JobState"], job["ExitCode"], job["NodeList"]) == ("COMPLETED", "0:0", cluster.node)
    # The node's memory, not DefMemPerCPU x CPUs (before `#SBATCH --mem=0`: 200 MiB here, and the step killed).
    assert f"mem={cluster.memory_mib}M" in job["TRES"].split(",")
    assert sorted(p.name for p in out.glob("ddp-*.json")) == ["ddp-0.json", "ddp-1.json"], output
    reports = [json.loads((out / f"ddp-{rank}.json").read_text()) for rank in (0, 1)]
    reference = _single(model, 2, out, env)
    planned = launch_invariants(files.plan)
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world"], report["layout"]) == (rank, 2, [1, 2])
        assert report["parallelism"] == "ddp" and report["invariants"] == planned
        assert report["manifest"] == str(folder / "cudaload-launch.json")  # $SLURM_SUBMIT_DIR's, the one checked
        # As in tests/test_launch_runs.py: DDP averages the gradients in another order than one process sums them.
        assert report["losses"] == pytest.approx(reference, rel=1e-4, abs=0)
