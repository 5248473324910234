"""A one-host SLURM cluster for the tests: Debian's slurm-wlm and munge (22.05 and 0.5.15 on Debian 12), started
from a folder of their own (their own munge key and socket, slurm.conf, state, spool, logs and ports) and stopped
with every process they started. The node is this host (`hostname -s`) with its CPUs, in one partition; no
cgroups (proctrack/linuxproc, task/none), no accounting storage, SlurmUser and SlurmdUser root (slurmd runs a job
as its submitter, which needs root).

Memory is a consumable resource, as on most shared clusters: a job that asks for none gets DefMemPerCPU per CPU
(100 MiB here), and a step over its limit is killed (jobacct_gather/linux polls every second, OverMemoryKill)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
DEFAULT_MEMORY_MIB = 100
START_TIMEOUT_S = 60


def missing() -> str | None:
    """Why a cluster cannot be started here, or None."""
    absent = [name for name in (*DAEMONS, "sbatch", "srun", "sinfo", "scontrol") if shutil.which(name) is None]
    if absent:
        return f"{', '.join(absent)} not on PATH (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return f"the daemons run as root (slurmd starts each job as its user), but this is uid {os.geteuid()}"
    return None


@dataclass(frozen=True)
class Cluster:
    conf: Path
    node: str
    folder: Path
    memory_mib: int

    def env(self) -> dict[str, str]:
        """What a client (sbatch, sinfo, scontrol) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def logs(self) -> str:
        """The daemons' logs, for a failure message."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.folder.glob("*.log")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_memory_mib() -> int:
    """The node's RealMemory: 90 % of MemTotal (slurmd drains a node that has less than slurm.conf says)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 9 // 10 // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def _conf(folder: Path, node: str, munge_socket: Path, memory_mib: int) -> str:
    """slurm.conf (Slurm 22.05 keys): one node, this host, all of its CPUs, reached on loopback."""
    return "\n".join(
        [
            "ClusterName=cudaloadtest",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd.log'}",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            f"DefMemPerCPU={DEFAULT_MEMORY_MIB}",
            "SchedulerType=sched/builtin",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherParams=OverMemoryKill",
            "JobAcctGatherFrequency=task=1",
            "MpiDefault=none",
            "ReturnToService=2",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory={memory_mib} State=UNKNOWN",
            f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _pids(name: str, mentioning: tuple[str, ...] = ()) -> set[int]:
    """The processes whose command is `name` (as ps lists them), those whose arguments hold one of `mentioning`
    if given."""
    out = subprocess.run(["ps", "-eo", "pid=,comm=,args="], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        pid, comm, *args = line.split(None, 2)
        if comm == name and (not mentioning or any(m in " ".join(args) for m in mentioning)):
            found.add(int(pid))
    return found


def _wait_idle(cluster: Cluster, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        dead = [f"{name} exited with {p.returncode}" for name, p in procs.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"SLURM did not start: {', '.join(dead)}\n{cluster.logs()}")
        found = subprocess.run(
            ["sinfo", "--noheader", "--nodes", cluster.node, "--format", "%T"],
            env={**os.environ, **cluster.env()},
            capture_output=True,
            text=True,
        )
        state = (found.stdout + found.stderr).strip()
        if found.returncode == 0 and state == "idle":
            return
        time.sleep(0.5)
    raise RuntimeError(f"node {cluster.node} not idle after {START_TIMEOUT_S} s (sinfo: {state!r})\n{cluster.logs()}")


@contextmanager
def running(folder: Path) -> Iterator[Cluster]:
    """munged, slurmctld and slurmd started in `folder`, the node idle; all stopped on the way out, and no
    process of theirs left (slurmstepd included)."""
    node = socket.gethostname().split(".")[0]
    # munged wants its socket's folder and every folder above it searchable by all (pytest's tmp root is 0700).
    munge = Path(tempfile.mkdtemp(prefix="cudaload-munge-"))
    munge.chmod(0o755)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(mode=0o700)
    cluster = Cluster(folder / "slurm.conf", node, folder, node_memory_mib())
    cluster.conf.write_text(_conf(folder, node, munge / "munge.sock", cluster.memory_mib))
    steps_before = _pids("slurmstepd")
    commands = {
        "munged": [
            "munged", "--foreground", f"--key-file={key}", f"--socket={munge / 'munge.sock'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ],
        "slurmctld": ["slurmctld", "-D", "-i", "-f", str(cluster.conf)],
        "slurmd": ["slurmd", "-D", "-f", str(cluster.conf)],
    }  # fmt: skip
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in commands.items():
            procs[name] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **cluster.env()}
            )
            if name == "munged":
                _wait_for(munge / "munge.sock", procs[name], cluster)
        _wait_idle(cluster, procs)
        yield cluster
    finally:
        if all(p.poll() is None for p in procs.values()) and len(procs) == len(DAEMONS):
            _cancel_jobs(cluster, steps_before)
        for proc in reversed(procs.values()):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(munge, ignore_errors=True)
    left = {name: _pids(name, mentioning=(str(cluster.conf), str(munge))) for name in DAEMONS}
    steps = _pids("slurmstepd") - steps_before
    if any(left.values()) or steps:
        raise RuntimeError(f"SLURM processes left running: {left}, slurmstepd {sorted(steps)}")


def _cancel_jobs(cluster: Cluster, steps_before: set[int]) -> None:
    """Cancel what is still queued or running (a test that timed out), and wait for its slurmstepd to end."""
    subprocess.run(["scancel", "--partition", "debug"], env={**os.environ, **cluster.env()}, capture_output=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while _pids("slurmstepd") - steps_before and time.monotonic() < deadline:
        time.sleep(0.5)


def _wait_for(path: Path, proc: subprocess.Popen[bytes], cluster: Cluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"munged did not create {path} (exit {proc.poll()})\n{cluster.logs()}")
        time.sleep(0.1)
