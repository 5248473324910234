"""launch.sbatch where no SLURM runs: the script run by bash with fake scontrol, srun and torchrun on PATH, for
node 0's address and what must stop it before srun starts a rank (a failing scontrol, no NodeAddr, no manifest
where the ranks read it). The script under a real SLURM: tests/test_launch_slurm.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import cudaload
from cudaload.launch import MANIFEST

H100 = cudaload.Machine.simulated("H100", count=8)
RECORD = """#!/usr/bin/env bash
{python} - "$@" <<'PY'
import json, os, sys
with open(os.path.join(os.environ["RECORD_DIR"], "{name}.json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in ("MASTER_ADDR", "CUDALOAD_LAUNCH")}}}}, f)
PY
"""


def _scontrol(hosts: str, address: str = "$4") -> str:
    """A fake scontrol: `show hostnames` runs `hosts`; `show node --oneliner NAME` answers as Slurm 22.05 does
    (tests/test_launch_slurm.py runs the real one), with NodeAddr `address`."""
    node = f"NodeName=$4 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 NodeAddr={address} NodeHostName=$4 Version=22.05.8"
    return f'case "$2" in hostnames) {hosts};; node) echo "{node}";; *) exit 2;; esac'


def _fake_bin(where: Path, scontrol: str) -> Path:
    """srun (records, then runs its command as node 0), torchrun (records) and `scontrol` as given."""
    bin_dir = where / "bin"
    bin_dir.mkdir()
    python = shlex.quote(sys.executable)
    (bin_dir / "srun").write_text(RECORD.format(python=python, name="srun") + 'SLURM_NODEID=0 exec "$@"\n')
    (bin_dir / "torchrun").write_text(RECORD.format(python=python, name="torchrun"))
    (bin_dir / "scontrol").write_text(f"#!/usr/bin/env bash\n{scontrol}\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir


def _sbatch(tmp: Path, folder: Path, submit_dir: Path, scontrol: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run `folder`/launch.sbatch as the batch step of a 2-node job submitted from `submit_dir`; what ran."""
    records = tmp / "records"
    records.mkdir()
    env = {
        "PATH": f"{_fake_bin(tmp, scontrol)}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "RECORD_DIR": str(records),
        "SLURM_JOB_NODELIST": "node-[0-1]",
        "SLURM_SUBMIT_DIR": str(submit_dir),
    }
    done = subprocess.run(
        ["bash", str(folder / "launch.sbatch")], cwd=submit_dir, env=env, capture_output=True, text=True, timeout=60
    )
    return done, {p.stem: json.loads(p.read_text()) for p in records.iterdir()}


def _written(tmp: Path, tiny_models: dict[str, Path], **kwargs: object) -> Path:
    folder = tmp / "launch"
    cudaload.launch_files(tiny_models["llama"], machine=H100, nodes=2, emit=["slurm"], **kwargs).write(folder)
    return folder


def test_a_failing_scontrol_stops_the_job_before_srun(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """Before: `export MASTER_ADDR="$(scontrol ... | head -n 1)"` returned 0 whatever scontrol did, and srun
    started every node's torchrun with --master-addr ''."""
    folder = _written(tmp_path, tiny_models)
    done, ran = _sbatch(tmp_path, folder, folder, "echo 'scontrol: error: Invalid node name specified' >&2; exit 1")
    assert done.returncode == 1 and "Invalid node name specified" in done.stderr
    assert ran == {}


def test_node_0_of_a_long_node_list_is_the_address(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """scontrol writes every host of the job (more than a pipe holds here: 20000 lines), and the first is node 0."""
    folder = _written(tmp_path, tiny_models)
    done, ran = _sbatch(tmp_path, folder, folder, _scontrol('for i in $(seq 0 19999); do echo "node-$i"; done'))
    assert done.returncode == 0, done.stderr
    assert ran["torchrun"]["env"]["MASTER_ADDR"] == "node-0"
    assert ran["torchrun"]["argv"][ran["torchrun"]["argv"].index("--master-addr") + 1] == "node-0"


def test_the_address_is_node_0s_nodeaddr_not_its_name(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """A node's name need not resolve (NodeName=gpu001 NodeAddr=10.1.2.3); SLURM reaches it at its NodeAddr.
    Before: --master-addr gpu001 (`scontrol show hostnames`' first line)."""
    folder = _written(tmp_path, tiny_models)
    done, ran = _sbatch(tmp_path, folder, folder, _scontrol("echo gpu001; echo gpu002", address="10.1.2.3"))
    assert done.returncode == 0, done.stderr
    argv = ran["torchrun"]["argv"]
    assert ran["torchrun"]["env"]["MASTER_ADDR"] == argv[argv.index("--master-addr") + 1] == "10.1.2.3"


def test_no_nodeaddr_stops_the_job_before_srun(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    folder = _written(tmp_path, tiny_models)
    no_address = 'case "$2" in hostnames) echo gpu001;; node) echo "NodeName=$4";; esac'
    done, ran = _sbatch(tmp_path, folder, folder, no_address)
    assert done.returncode == 1 and ran == {}
    assert "no NodeAddr in `scontrol show node` of node 0: NodeName=gpu001" in done.stderr


@pytest.mark.parametrize("given", [False, True], ids=["beside-the-script", "manifest_path"])
def test_no_manifest_where_the_ranks_read_it_stops_before_srun(
    tmp_path: Path, tiny_models: dict[str, Path], given: bool
) -> None:
    """Before: srun started every rank, and each rank raised on its own that the manifest cannot be read. Now the
    batch step says where it looked and what to do (submitted from another folder: submit from the script's)."""
    manifest = tmp_path / "elsewhere" / MANIFEST
    folder = _written(tmp_path, tiny_models, **({"manifest_path": str(manifest)} if given else {}))
    away = tmp_path / "home"
    away.mkdir()
    done, ran = _sbatch(tmp_path, folder, away, _scontrol("echo node-0"))
    assert done.returncode == 1 and ran == {}
    where = manifest if given else away / MANIFEST
    assert f"no launch manifest at {where}:" in done.stderr
    hint = "copy cudaload-launch.json of the launch files there" if given else "cd FOLDER && sbatch launch.sbatch"
    assert hint in done.stderr
