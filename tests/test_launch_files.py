"""The launch files as code a cluster admin runs without reading (issue 47): every value quoted or serialized
by its own serializer, the inputs checked where they enter, read back by each engine's own parser, run with fake
launchers on PATH that record the argv they get, and written as a whole set that never follows a link."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import cudaload
from cudaload.errors import SettingError
from cudaload.launch import MANIFEST, launch_invariants

H100 = cudaload.Machine.simulated("H100", count=8)
HOSTILE_ARGS = [
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned; #",
    'it\'s "quoted"',
    "line\nbreak; touch pwned",
    "ünïcødé ✓ 模型",
    "x" * 5000,
    "--lr",
    "1e-4",
    "",
    "*",
    "$HOME",
]
RECORDER = """#!{python}
import json, os, sys
record = {{"argv": sys.argv[1:], "launch": os.environ.get("CUDALOAD_LAUNCH"), "env": {{
    k: os.environ.get(k) for k in ("ACCELERATE_USE_CPU", "SLURM_NODEID", "MASTER_ADDR")}}}}
with open(os.path.join(os.environ["RECORD_DIR"], "{name}-%d.json" % os.getpid()), "w") as f:
    json.dump(record, f)
"""
SRUN = """#!/usr/bin/env bash
# srun: one task, on node 0, as SLURM starts it (the argv recorded like the others)
{python} - "$@" <<'PY'
import json, os, sys
with open(os.path.join(os.environ["RECORD_DIR"], "srun-%d.json" % os.getpid()), "w") as f:
    json.dump({{"argv": sys.argv[1:]}}, f)
PY
SLURM_NODEID=0 exec "$@"
"""
# scontrol: `show hostnames` lists the job's nodes, `show node --oneliner NAME` gives its NodeAddr (Slurm 22.05)
SCONTROL = """#!/usr/bin/env bash
case "$2" in
  hostnames) echo node-a; echo node-b;;
  node) echo "NodeName=$4 Arch=x86_64 NodeAddr=$4 NodeHostName=$4";;
esac
"""


def _fake_bin(where: Path) -> Path:
    """torchrun, accelerate, srun and scontrol that record what they were given, and nothing else on PATH
    but the shell's own tools."""
    bin_dir = where / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "accelerate"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable, name=name))
    (bin_dir / "srun").write_text(SRUN.format(python=shlex.quote(sys.executable)))
    (bin_dir / "scontrol").write_text(SCONTROL)
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir


def _run(script: Path, tmp: Path, **env: str) -> list[dict]:
    """Run `script` with the fake launchers in a clean working folder; what each recorded."""
    records = tmp / "records"
    records.mkdir(exist_ok=True)
    for old in records.iterdir():
        old.unlink()
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    path = f"{_fake_bin(tmp) if not (tmp / 'bin').exists() else tmp / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"
    full = {"PATH": path, "RECORD_DIR": str(records), "HOME": str(work), **env}
    subprocess.run(["bash", str(script)], cwd=work, env=full, check=True, capture_output=True, timeout=60)
    return [json.loads(p.read_text()) for p in sorted(records.iterdir())]


def _hostile_model(tmp: Path, tiny_models: dict[str, Path]) -> Path:
    """The tiny Llama in a folder whose name holds a newline, a YAML key, a quote and a command."""
    folder = tmp / 'm\ngpu_ids: "7" # $(touch pwned) \'q'
    shutil.copytree(tiny_models["llama"], folder)
    return folder


def test_every_emitter_quotes_every_hostile_value(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """Each script parses (bash -n) and, run with fake launchers, passes exactly the intended argv, with the
    manifest path as given; no command inside a value runs (no `pwned` file anywhere)."""
    model = _hostile_model(tmp_path, tiny_models)
    manifest_path = str(tmp_path / "$(touch pwned)" / "a b;c" / MANIFEST)
    script = "my train $(touch pwned).py"
    files = cudaload.launch_files(
        model,
        machine=H100,
        nodes=2,
        parallelism="deepspeed",
        script=script,
        script_args=HOSTILE_ARGS,
        manifest_path=manifest_path,
        quantize=None,
    )
    out = tmp_path / "out"
    files.write(out)
    scripts = ["torchrun-node0.sh", "torchrun-node1.sh", "accelerate-launch.sh", "launch.sbatch"]
    assert sorted(files.files) == sorted([MANIFEST, *scripts, "accelerate-config.yaml", "ds_config.json"])
    for name in scripts:
        subprocess.run(["bash", "-n", str(out / name)], check=True)
    tail = [script, *HOSTILE_ARGS]
    hostile_address = "$(touch pwned); echo INJECTED"
    from torch.distributed.run import get_args_parser

    for node in (0, 1):
        (record,) = _run(out / f"torchrun-node{node}.sh", tmp_path, MASTER_ADDR=hostile_address)
        assert record["launch"] == manifest_path
        read = get_args_parser().parse_args(record["argv"])  # torchrun's own parser, torch 2.13
        assert (read.node_rank, read.master_addr, read.training_script) == (node, hostile_address, script)
        assert read.training_script_args == HOSTILE_ARGS
        assert record["argv"] == [
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "8", "--master-addr", hostile_address,
            "--master-port", "29500", *tail,
        ]  # fmt: skip
    (record,) = _run(out / "accelerate-launch.sh", tmp_path, MASTER_ADDR=hostile_address, NODE_RANK="1")
    assert record["launch"] == manifest_path
    assert record["argv"] == [
        "launch", "--config_file", str(out / "accelerate-config.yaml"),
        "--deepspeed_config_file", str(out / "ds_config.json"), "--machine_rank", "1",
        "--main_process_ip", hostile_address, *tail,
    ]  # fmt: skip
    Path(manifest_path).parent.mkdir(parents=True)  # the sbatch script stops before srun where it is missing
    shutil.copy(out / MANIFEST, manifest_path)
    srun, torchrun = _run(out / "launch.sbatch", tmp_path, SLURM_JOB_NODELIST="node-[a-b]", SLURM_SUBMIT_DIR=str(out))
    assert srun["argv"][:2] == ["bash", "-c"]
    assert torchrun["launch"] == manifest_path and torchrun["env"]["MASTER_ADDR"] == "node-a"
    assert torchrun["argv"] == [
        "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "8", "--master-addr", "node-a",
        "--master-port", "29500", *tail,
    ]  # fmt: skip
    assert not list(tmp_path.rglob("pwned")) and not list(Path.cwd().glob("pwned"))


def test_the_yaml_is_serialized_not_assembled(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """A model folder whose name holds a newline and a YAML key adds no key: accelerate's own reader gets the
    config cudaload meant, and the DeepSpeed JSON reads back with json.load."""
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    model = _hostile_model(tmp_path, tiny_models)
    files = cudaload.launch_files(model, machine=H100, nodes=2, parallelism="deepspeed", quantize=None)
    files.write(tmp_path / "out")
    text = (tmp_path / "out" / "accelerate-config.yaml").read_text()
    config = load_config_from_file(str(tmp_path / "out" / "accelerate-config.yaml"))
    assert config.gpu_ids is None and "gpu_ids" not in yaml.safe_load(text)
    assert config.distributed_type.value == "DEEPSPEED" and config.num_processes == 16
    ds = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert f"deepspeed-zero{ds['zero_optimization']['stage']}" == files.plan.decision("parallelism").value
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["model"] == str(model)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"main_address": "$(touch pwned)"}, "main_address"),
        ({"main_address": "$MASTER_ADDR; echo INJECTED; #"}, "main_address"),
        ({"main_address": ""}, "main_address"),
        ({"main_address": "node 0"}, "main_address"),
        ({"port": "29500; cmd"}, "port"),
        ({"port": 70000}, "port"),
        ({"port": 0}, "port"),
        ({"port": True}, "port"),
        ({"script": ""}, "script"),
        ({"script": "   "}, "script"),
        ({"script_args": "--lr 1e-4"}, "script_args"),
        ({"script_args": ["--lr", 1e-4]}, "script_args"),
        ({"manifest_path": ""}, "manifest_path"),
    ],
)
def test_launch_inputs_are_checked_where_they_enter(kwargs: dict, named: str) -> None:
    from cudaload.facts.shapes import LLAMA_SHAPES

    with pytest.raises(SettingError, match=named):
        cudaload.launch_files(LLAMA_SHAPES["7B"], machine=H100, nodes=2, **kwargs)


def test_real_addresses_are_taken_and_others_refused() -> None:
    """Host names, IP addresses and $VARIABLES are addresses; a command, a list of words or nothing is not."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    def written(address: str) -> str:
        files = cudaload.launch_files(
            LLAMA_SHAPES["7B"], machine=H100, nodes=2, emit=["torchrun"], main_address=address
        )
        return files.files["torchrun-node0.sh"].splitlines()[-1]

    for address in ("10.0.0.1", "fe80::1", "node-0.cluster.example"):
        assert f"--master-addr {address} " in written(address)
    for variable in ("$HEAD_NODE", "${HEAD_NODE}"):
        assert '--master-addr "${HEAD_NODE}" ' in written(variable)
    for bad in ("$(hostname)", "${HEAD_NODE:-$(id)}", "a b", "-rf", "node_0!"):
        with pytest.raises(SettingError, match="main_address"):
            written(bad)


# ---- the folder ------------------------------------------------------------------------------------------------


def _small(**kwargs: object) -> cudaload.LaunchFiles:
    from cudaload.facts.shapes import LLAMA_SHAPES

    return cudaload.launch_files(LLAMA_SHAPES["7B"], machine=H100, emit=["torchrun"], **kwargs)  # type: ignore[arg-type]


def test_the_manifest_lists_every_file_with_its_digest(tmp_path: Path) -> None:
    import hashlib

    files = _small(nodes=2)
    files.write(tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "out").iterdir()}
    assert manifest["files"] == {k: v for k, v in on_disk.items() if k != MANIFEST}
    assert manifest["cudaload_launch"] == 3 and manifest["model_identity"]["model_class"] == "LlamaForCausalLM"


def test_a_symlinked_script_is_never_followed(tmp_path: Path) -> None:
    """A torchrun-node0.sh that links to a private file: the file keeps its text and its 0600 mode."""
    out = tmp_path / "out"
    out.mkdir()
    private = tmp_path / "private"
    private.write_text("secret\n")
    private.chmod(0o600)
    (out / "torchrun-node0.sh").symlink_to(private)
    with pytest.raises(SettingError, match="did not write"):
        _small(nodes=2).write(out)
    _small(nodes=2).write(out, force=True)  # forced: the link is replaced by a file, its target untouched
    assert private.read_text() == "secret\n" and stat.S_IMODE(private.stat().st_mode) == 0o600
    assert not (out / "torchrun-node0.sh").is_symlink()


def test_a_symlinked_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "out").symlink_to(real)
    with pytest.raises(SettingError, match="symbolic link"):
        _small(nodes=2).write(tmp_path / "out", force=True)
    assert list(real.iterdir()) == []


def test_a_rerun_replaces_the_whole_set_and_foreign_files_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _small(nodes=4).write(out)
    assert (out / "torchrun-node3.sh").exists()
    _small(nodes=2).write(out)  # cudaload's own earlier set: replaced whole
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "torchrun-node0.sh", "torchrun-node1.sh"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SettingError, match=r"notes\.txt"):
        _small(nodes=2).write(out)
    (out / "notes.txt").unlink()
    (out / "torchrun-node0.sh").write_text("#!/bin/bash\necho edited\n")
    with pytest.raises(SettingError, match="changed since cudaload wrote it"):
        _small(nodes=2).write(out)
    _small(nodes=2).write(out, force=True)
    assert "echo edited" not in (out / "torchrun-node0.sh").read_text()


def test_an_interrupted_write_leaves_the_earlier_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the middle of writing: the folder holds the earlier set, whole, and no temporary folder stays."""
    from cudaload.launch import folder

    out = tmp_path / "out"
    _small(nodes=4).write(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = folder._write_file
    calls: list[Path] = []

    def interrupted(path: Path, text: str, mode: int) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, text, mode)

    monkeypatch.setattr(folder, "_write_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _small(nodes=2).write(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ---- the CLI ---------------------------------------------------------------------------------------------------


def test_the_cli_writes_lora_and_checkpointing_and_says_what_to_run(
    tmp_path: Path, tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from cudaload.cli import main

    out = tmp_path / "launch out"
    argv = [
        "launch", str(tiny_models["llama"]), "--gpu", "H100", "--count", "2", "--nodes", "2", "--quantize", "none",
        "--lora-r", "64", "--lora-alpha", "128", "--lora-dropout", "0", "--target-modules", "q_proj,v_proj",
        "--no-gradient-checkpointing", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / MANIFEST).read_text())
    lora = manifest["decisions"]["lora"]
    assert (lora["r"], lora["lora_alpha"], lora["lora_dropout"]) == (64, 128.0, 0.0)
    assert sorted(lora["target_modules"]) == ["q_proj", "v_proj"]
    plan = cudaload.plan(
        tiny_models["llama"], machine=cudaload.Machine.simulated("H100", count=2), finetune=True, nodes=2,
        quantize=None, gradient_checkpointing=False,
        lora={"r": 64, "lora_alpha": 128, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    )  # fmt: skip
    assert launch_invariants(plan) == manifest["decisions"]
    for node in (0, 1):
        assert f"node {node}: bash {shlex.quote(str(out / f'torchrun-node{node}.sh'))}" in printed
        assert f"NODE_RANK={node} bash {shlex.quote(str(out / 'accelerate-launch.sh'))}" in printed
    (out / "mine.txt").write_text("x")
    assert main([*argv]) != 0  # a folder with a file cudaload did not write
    assert main([*argv, "--force"]) == 0 and not (out / "mine.txt").exists()


def test_a_cpu_plan_writes_a_cpu_accelerate_launch(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """accelerate's reader sees use_cpu, and the script sets ACCELERATE_USE_CPU so each rank's Accelerator() is
    MULTI_CPU (accelerate 1.16 `multi_gpu_launcher` does not pass use_cpu on: measured in the module's note)."""
    from accelerate.commands.config.config_args import load_config_from_file

    cpu = cudaload.Machine.simulated(None)  # no GPU: a CPU machine
    files = cudaload.launch_files(
        tiny_models["llama"], machine=cpu, nodes=1, ranks_per_node=2, emit=["accelerate"], quantize=None
    )
    assert "no CUDA GPU" in files.plan.machine
    files.write(tmp_path / "out")
    config = load_config_from_file(str(tmp_path / "out" / "accelerate-config.yaml"))
    assert config.use_cpu is True and config.num_processes == 2
    (record,) = _run(tmp_path / "out" / "accelerate-launch.sh", tmp_path)
    assert record["env"]["ACCELERATE_USE_CPU"] == "true"


def test_a_one_process_accelerate_launch_is_one_accelerate_accepts(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """accelerate 1.16 refuses MULTI_GPU below 2 processes ("You need to use at least 2 processes"): one rank is
    distributed_type NO, which its launcher runs as one process."""
    from accelerate.commands.config.config_args import load_config_from_file

    files = cudaload.launch_files(tiny_models["llama"], machine=cudaload.Machine.simulated("H100"), emit=["accelerate"])
    files.write(tmp_path / "out")
    config = load_config_from_file(str(tmp_path / "out" / "accelerate-config.yaml"))
    assert (config.distributed_type.value, config.num_processes) == ("NO", 1)
