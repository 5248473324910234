"""GPU names as people type them: what nvidia-smi prints (with or without "NVIDIA "), the common
aliases, a "did you mean" for near misses, and a GPU described by its facts ("custom:sm90:80GiB")."""

from __future__ import annotations

import re

import pytest

from cudaload import Machine, UnknownGpuError
from cudaload.cli import main
from cudaload.facts.catalog import KNOWN_GPUS, _normalise, lookup_gpu

GiB = 1024**3


@pytest.mark.parametrize(
    ("typed", "name", "capability"),
    [
        ("H100 PCIe", "NVIDIA H100 PCIe", (9, 0)),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", (9, 0)),
        ("H100-SXM", "NVIDIA H100 80GB HBM3", (9, 0)),
        ("H100 80GB HBM3", "NVIDIA H100 80GB HBM3", (9, 0)),
        ("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", (8, 0)),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", (8, 0)),
        ("A100 80GB PCIe", "NVIDIA A100 80GB PCIe", (8, 0)),
        ("L40", "NVIDIA L40", (8, 9)),
        ("A6000", "NVIDIA RTX A6000", (8, 6)),
        ("NVIDIA RTX A6000", "NVIDIA RTX A6000", (8, 6)),
        ("H800", "NVIDIA H800", (9, 0)),
        ("H20", "NVIDIA H20", (9, 0)),
        ("GH200", "NVIDIA GH200 480GB", (9, 0)),
        ("NVIDIA GH200 480GB", "NVIDIA GH200 480GB", (9, 0)),
        ("Tesla T4", "Tesla T4", (7, 5)),
        ("T4", "Tesla T4", (7, 5)),
        ("GeForce RTX 4090", "NVIDIA GeForce RTX 4090", (8, 9)),
    ],
)
def test_names_as_people_type_them(typed: str, name: str, capability: tuple[int, int]) -> None:
    gpu = Machine.simulated(typed).gpus[0]
    assert (gpu.name, gpu.capability) == (name, capability)


def test_every_spelling_names_one_gpu_and_every_entry_cites_its_source() -> None:
    owners: dict[str, str] = {}
    for gpu in KNOWN_GPUS:
        for spelling in (gpu.name, *gpu.aliases):
            assert owners.setdefault(_normalise(spelling), gpu.name) == gpu.name, spelling
        assert "developer.nvidia.com/cuda-gpus" in gpu.source, gpu.name  # the capability's source
        assert re.search(r"memory: \S", gpu.source), gpu.name
        assert lookup_gpu(gpu.name) is gpu and lookup_gpu(gpu.name.removeprefix("NVIDIA ")) is gpu


@pytest.mark.parametrize(("typed", "suggested"), [("H10", "'h100'"), ("L4O", "'l40'"), ("a100-sxm4-8gb", "a100")])
def test_a_near_miss_gets_did_you_mean(typed: str, suggested: str) -> None:
    with pytest.raises(UnknownGpuError, match="Did you mean") as info:
        Machine.simulated(typed)
    assert suggested in str(info.value).split("Known GPUs")[0]
    assert "custom:sm90:80GiB" in str(info.value)  # and how to describe a GPU the catalog lacks


def test_an_unlisted_gpu_described_by_its_facts() -> None:
    machine = Machine.simulated("custom:sm90:80GiB", count=2)
    assert [g.capability for g in machine.gpus] == [(9, 0), (9, 0)]
    assert machine.gpus[0].total_memory == 80 * GiB and machine.gpus[0].multiprocessors is None
    gb = Machine.simulated("custom:8.6:24GB:84sm").gpus[0]  # GB as datasheets write it: 10**9 bytes
    assert (gb.capability, gb.total_memory, gb.multiprocessors) == ((8, 6), 24 * 10**9, 84)
    assert Machine.simulated("custom:sm_120:32GiB").gpus[0].sm == "sm_120"
    with pytest.raises(UnknownGpuError, match="custom:sm<major><minor>:<memory>GiB"):
        Machine.simulated("custom:90:80")


def test_the_cli_takes_nvidia_smi_names_and_custom_gpus(tiny_models, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tiny_models["llama"]), "--gpu", "NVIDIA H100 PCIe,custom:sm80:40GiB", "--json"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 PCIe" in out and "custom sm_80 40GiB" in out
    assert main(["plan", str(tiny_models["llama"]), "--gpu", "A100-SXM4-8GB"]) == 2
    assert "Did you mean" in capsys.readouterr().err
