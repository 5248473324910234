"""A newcomer's first day, round 3 (issue 46): nothing reaches the network unasked (`--offline` is
HF_HUB_OFFLINE for the whole command; a Hub id without network fails at once with the `hf download` command;
a `./path` is a path), missing packages are said evenly (peft in a fine-tuning plan, both packages of a
QLoRA load, `--with` for a simulated machine), and doctor opens with Python, the OS and the C library."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cudaload.cli import main

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).parents[1]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name lookup and connection is refused at once and recorded (what the command asked for)."""
    asked: list[str] = []

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(f"resolve {host}")
        raise socket.gaierror(socket.EAI_NONAME, "test: no network")

    def connect(self: socket.socket, address: Any) -> Any:
        asked.append(f"connect {address}")
        raise OSError("test: no network")

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    monkeypatch.setenv("HF_HUB_CACHE", str(Path(os.environ["CUDALOAD_CACHE"]) / "empty-hub-cache"))
    return asked


def test_offline_reads_nothing_from_the_network_and_gives_the_download_command(
    no_network: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert main(["plan", "Qwen/Qwen3-0.6B", "--offline"]) == 2
    err = capsys.readouterr().err
    assert no_network == []  # before: --offline only simulated the Hub state for kernels; the config was fetched
    assert "hf download Qwen/Qwen3-0.6B" in " ".join(err.split())
    assert os.environ.get("HF_HUB_OFFLINE") is None  # restored for the caller


def test_a_hub_id_without_network_is_asked_once_and_ends_with_the_download_command(
    no_network: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert main(["plan", "Qwen/Qwen3-0.6B"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert len(no_network) == 1, no_network  # before: huggingface_hub's retries, one lookup each
    assert "cannot be reached" in err and "hf download Qwen/Qwen3-0.6B" in err


def test_a_dot_path_that_is_not_there_fails_before_transformers_is_imported() -> None:
    code = (
        "import sys; from cudaload.cli import main; rc = main(['plan', './no-such-model']); "
        "print(rc, 'transformers' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=os.environ)
    assert run.stdout.split() == ["2", "False"], run.stderr  # before: read as a Hub id, after transformers' import
    assert "no such file or folder" in run.stderr and "Hugging Face Hub" not in run.stderr


def test_a_finetune_plan_without_peft_says_so_as_a_quantize_without_bitsandbytes_does(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tiny_models["qwen3"])
    assert main(["plan", path, "--gpu", "A10G", "--finetune"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "WARNING: the simulated machine has no peft" in out  # before: exit 0 and nothing said
    assert "--with peft==0.21.2" in out and "pip install" not in out  # the CLI's way to give a simulated machine peft


def test_a_simulated_machine_is_given_packages_with_the_with_flag(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", str(tiny_models["qwen3"]), "--gpu", "A10G", "--finetune", "--quantize", "4bit"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--with bitsandbytes==0.50.2 --with peft==0.21.2" in err, err  # before: pip install bitsandbytes peft
    assert "pip install" not in err


def test_load_for_finetune_names_every_missing_package_of_a_qlora_load(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import cudaload

    find_spec, version = importlib.util.find_spec, importlib.metadata.version

    def without_peft(name: str, *args: Any) -> Any:
        return None if name == "peft" else find_spec(name, *args)

    def without_bitsandbytes(name: str) -> str:
        if name == "bitsandbytes":
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.util, "find_spec", without_peft)
    monkeypatch.setattr(importlib.metadata, "version", without_bitsandbytes)
    with pytest.raises(cudaload.MissingPackageError, match=r"needs peft \(LoRA\) and bitsandbytes") as raised:
        cudaload.load_for_finetune(str(tiny_models["qwen3"]), quantize="4bit")
    assert "pip install bitsandbytes peft" in str(raised.value)  # before: only peft, then bitsandbytes next time


def test_doctor_opens_with_python_the_os_and_the_c_library(capsys: pytest.CaptureFixture[str]) -> None:
    import platform

    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith(f"Python {platform.python_version()} ")  # before: the GPUs came first
    libc, libc_version = platform.libc_ver()
    assert f"{libc} {libc_version}" in lines[2] and platform.machine() in lines[2]


def test_the_classifiers_list_every_python_requires_python_admits_up_to_the_newest_tested() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    listed = {
        c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")
    }
    assert {"3.10", "3.11", "3.12", "3.13"} <= listed  # before: 3.11 only


def test_reasons_shown_by_the_cli_name_its_flag_for_hub_kernels() -> None:
    from cudaload.plans.layout import cli_hints

    assert cli_hints("pass use_kernels=True to enable") == "pass --hub-kernels to enable"  # before: use_kernels=True


def test_a_multi_node_ddp_plan_shows_what_each_rank_passes(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = str(tiny_models["qwen3"])
    argv = ["plan", path, "--gpu", "H100", "--count", "8", "--finetune", "--nodes", "2", "--parallelism", "ddp"]
    assert main([*argv, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["kwargs"]["device_map"] == {"": 0}  # before: "cuda:0", one process's placement for 16 ranks
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert 'each rank passes device_map={"": LOCAL_RANK}' in text and "rank 0/16" in text


def test_every_plan_command_ends_with_the_next_one(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tiny_models["qwen3"])
    assert main(["plan", path, "--finetune"]) == 0
    last = capsys.readouterr().out.split("\n\n")[-1]
    assert last.startswith("Next: ") and "load_for_finetune" in last  # before: the plan stopped at its call
    layout = ["--gpu", "H100", "--count", "8", "--nodes", "2"]
    assert main(["plan", path, "--finetune", *layout, "--attn", "sdpa"]) == 0
    last = " ".join(capsys.readouterr().out.split("\n\n")[-1].split())
    assert f"Next: cudaload launch {path} {' '.join(layout)} writes" in last  # the same job, launch's flags only


def test_the_demo_ends_with_the_next_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--tiny", "--dir", str(tmp_path / "tiny")]) == 0
    captured = capsys.readouterr()
    assert captured.out.rstrip().split("\n\n")[-1].startswith("Next: cudaload plan MODEL")  # before: no next step
    assert "[demo] building (once), planning and loading the tiny model" in captured.err  # said before the wait


@pytest.mark.parametrize("width", [80, 100])
def test_every_command_fits_the_terminal(
    width: int, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Every line a command prints, stdout and stderr, fits COLUMNS but for one word that cannot be broken (a
    path, as in a command to copy: `node 0: bash /a/long/folder/torchrun-node0.sh`)."""
    monkeypatch.setenv("COLUMNS", str(width))
    path = str(tiny_models["qwen3"])
    commands = [
        (["doctor"], 0),
        (["plan", path], 0),
        (["plan", path, "--finetune", "--gpu", "H100", "--count", "8", "--nodes", "2"], 0),
        (["demo", "--tiny", "--dir", str(tmp_path / "tiny")], 0),
        (["launch", path, "--gpu", "H100", "--count", "8", "--nodes", "2", "--out", str(tmp_path / "job")], 0),
        (["plan", "./no/such/model/folder/anywhere/on/this/machine/at/all"], 2),  # an error line
        (["plan", path, "--gpu", "A10G", "--finetune", "--quantize", "4bit"], 2),
    ]
    for argv, status in commands:
        assert main(argv) == status, argv
        captured = capsys.readouterr()
        for line in (captured.out + captured.err).splitlines():
            longest = max((len(word) for word in line.split()), default=0)
            assert len(line) - longest < width or len(line) <= width, f"{argv}: {len(line)} > {width}: {line!r}"


def test_a_flag_typo_gets_the_subcommands_usage_and_the_closest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "some/model", "--finetun"])  # before: accepted by prefix as --finetune
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith("usage: cudaload plan ")
    assert "unrecognized arguments: --finetun (did you mean --finetune?)" in err


def test_the_help_lists_every_command_and_groups_the_plan_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = " ".join(capsys.readouterr().out.split())
    assert "Commands: doctor, plan, launch, bench, demo, probe" in top  # before: "doctor | plan | bench | demo"
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    groups = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith(" ")]
    titles = [g for g in groups if g.endswith(":")]
    assert titles[0] == "positional arguments:" and len(titles) == 6, titles  # before: one flat list of options
    assert any(t.startswith("fine-tuning") for t in titles) and any(t.startswith("the job's layout") for t in titles)


def test_one_layout_vocabulary_the_old_flags_are_aliases_that_say_so(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path, gpus = str(tiny_models["qwen3"]), ["--gpu", "H100", "--count", "8", "--json"]
    assert main(["plan", path, *gpus, "--ranks-per-node", "8"]) == 0  # before: "add --finetune"
    new = capsys.readouterr()
    assert main(["plan", path, *gpus, "--world-size", "8"]) == 0
    old = capsys.readouterr()
    assert json.loads(new.out) == json.loads(old.out)
    assert "deprecated alias: use --ranks-per-node" in old.err and "deprecated" not in new.err


def test_communication_times_read_in_their_unit(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", str(tiny_models["qwen3"]), "--gpu", "H100", "--count", "8", "--nodes", "2", "--finetune"]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "comm ~" in text and "~0.00 s" not in text  # before: "comm ~0.00 s vs ~0.00 s"


def test_the_bench_speed_up_header_names_each_number_under_it() -> None:
    from cudaload.bench import report

    row = {
        "ok": True,
        "finite_logits": True,
        "plan_speedup": {"load": 1.0, "prefill": 2.0, "decode": 3.0, "end_to_end": 4.0},
        "plan_speedup_paired": {"load": 1.5, "prefill": 2.5, "decode": 3.5},
    }
    medians, paired = report._ratios(row).split("|")
    header_medians, header_paired = report._SPEEDUP.split("|")
    for numbers, header in ((medians, header_medians), (paired, header_paired)):
        assert len(numbers.split("/")) == len(header.split()[-1].split("/")), (numbers, header)  # before: 3 under 4
