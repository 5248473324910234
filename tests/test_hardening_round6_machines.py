"""Hardening round 6 (issue 49), one machine is one vendor: items 5 and 7 and the simulated-machine API.

- item 5: a simulated machine with NVIDIA and AMD GPUs is refused (one torch build drives one vendor; `detect()`
  asks the AMD probes only when no NVIDIA probe answered, so a detected machine is one vendor already);
- item 7: ROCR_VISIBLE_DEVICES is applied before HIP_VISIBLE_DEVICES, as torch 2.13 reads them, each warning names
  its variable, and an AMD GPU outside the catalog is described by its gfx target ("custom:gfx942:192GiB");
- the API: a count with a list, a launch with more local ranks than the named GPUs, a launch given as a dict,
  and `--with X --without X`.

Each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

import cudaload
from cudaload.capability.gpus import probe_gpus
from cudaload.capability.rocm import AmdSmiProbe, hip_visible_gpus
from cudaload.capability.visible import RawDevice
from cudaload.cli import main
from cudaload.errors import SettingError, UnknownGpuError
from cudaload.facts.hardware import GiB
from cudaload.facts.machine import Launch, Machine

# --- item 5: one machine, one vendor --------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [["H100", "MI300X"], ["MI300X", "custom:sm90:80GiB"], ["custom:gfx942:192GiB", "T4"]])
def test_a_simulated_machine_of_two_vendors_is_refused(gpus: list[str]) -> None:
    # Before: planned with a CUDA 12.8 and a ROCm 6.4 torch at once, 131 GiB placed on the MI300X.
    with pytest.raises(SettingError, match=r"mixes GPU vendors .*one torch build drives one vendor"):
        Machine.simulated(gpus)


def test_the_cli_refuses_a_gpu_list_of_two_vendors(
    capsys: pytest.CaptureFixture[str], tiny_models: dict[str, Path]
) -> None:
    assert main(["plan", str(tiny_models["qwen3"]), "--gpu", "MI300X,H100"]) == 2
    err = capsys.readouterr().err
    assert "cudaload: error:" in err and "mixes GPU vendors" in err and "Simulate each vendor" in err


def test_one_vendor_lists_still_make_a_machine() -> None:
    assert len(Machine.simulated(["A100", "T4"]).gpus) == 2
    assert [g.vendor for g in Machine.simulated(["MI300X", "custom:gfx950:288GiB"]).gpus] == ["amd", "amd"]


# --- item 7: ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES -----------------------------------------------------


def _amd(index: int, arch: str, gib: int) -> RawDevice:
    return RawDevice(
        nvml_index=index,
        name=f"AMD {arch}",
        uuid=f"GPU-{index}aaa",
        capability=(9, 4),
        total_memory=gib * GiB,
        pci_bus_id=f"0000:{index + 1:02x}:00.0",
        vendor="amd",
        arch=arch,
    )


RAW = [_amd(0, "gfx942", 192), _amd(1, "gfx942", 192), _amd(2, "gfx942", 192), _amd(3, "gfx1100", 24)]


@pytest.mark.parametrize(
    ("env", "physical"),
    [
        ({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, [3]),  # HIP numbers ROCR's devices 0, 1
        ({"ROCR_VISIBLE_DEVICES": "3,1"}, [3, 1]),
        ({"ROCR_VISIBLE_DEVICES": "GPU-3aaa"}, [3]),
        ({"HIP_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0"}, [3]),  # HIP wins over CUDA
        ({"CUDA_VISIBLE_DEVICES": "2"}, [2]),
        ({}, [0, 1, 2, 3]),
    ],
)
def test_rocr_then_hip_visible_devices_choose_the_gpus(env: dict[str, str], physical: list[int]) -> None:
    gpus, _ = hip_visible_gpus(RAW, env)
    assert [g.physical_index for g in gpus] == physical
    assert [g.index for g in gpus] == list(range(len(physical)))


def test_detection_budgets_the_gpu_rocr_and_hip_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    class Smi(AmdSmiProbe):
        def __init__(self) -> None:
            self._started = False

        def devices(self) -> list[RawDevice]:
            return list(RAW)

    # Before: ROCR was not read, HIP_VISIBLE_DEVICES=1 picked physical GPU 1, a 192 GB MI300X.
    report = probe_gpus({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, [Smi])
    assert [(g.arch_name, g.total_memory) for g in report.gpus] == [("gfx1100", 24 * GiB)]


@pytest.mark.parametrize(
    ("env", "variable", "words"),
    [
        ({"HIP_VISIBLE_DEVICES": "0,0"}, "HIP_VISIBLE_DEVICES='0,0'", "names device 0 twice"),
        ({"ROCR_VISIBLE_DEVICES": "1,1"}, "ROCR_VISIBLE_DEVICES='1,1'", "names device 1 twice"),
        ({"ROCR_VISIBLE_DEVICES": "0,9"}, "ROCR_VISIBLE_DEVICES='0,9'", "entry 2 matches no GPU"),
        ({"CUDA_VISIBLE_DEVICES": "x"}, "CUDA_VISIBLE_DEVICES='x'", "amd-smi"),
        (
            {"ROCR_VISIBLE_DEVICES": "2", "HIP_VISIBLE_DEVICES": "0,1"},
            "HIP_VISIBLE_DEVICES='0,1' lists more devices than ROCR_VISIBLE_DEVICES='2'",
            "Index HIP_VISIBLE_DEVICES into ROCR's list",
        ),
        (
            {"ROCR_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"},
            "ROCR_VISIBLE_DEVICES='2,3' and CUDA_VISIBLE_DEVICES='1' are both set",
            "Use HIP_VISIBLE_DEVICES",
        ),
    ],
)
def test_visibility_warnings_name_the_variable_the_value_came_from(
    env: dict[str, str], variable: str, words: str
) -> None:
    # Before: "CUDA_VISIBLE_DEVICES='0,0' names device 0 twice" for a HIP value; ROCR said nothing.
    _, warnings = hip_visible_gpus(RAW, env)
    assert any(variable in w and words in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("spec", "arch", "gib", "cus"),
    [
        ("custom:gfx942:192GiB", "gfx942", 192, None),
        ("custom:gfx950:288GB:256cu", "gfx950", 268, 256),
        ("custom:GFX908:32GiB", "gfx908", 32, None),
        ("custom:gfx1100:24GiB", "gfx1100", 24, None),
    ],
)
def test_an_amd_gpu_outside_the_catalog_is_described_by_its_gfx_target(
    spec: str, arch: str, gib: int, cus: int | None
) -> None:
    gpu = Machine.simulated(spec).gpus[0]
    assert (gpu.vendor, gpu.arch, round(gpu.total_memory / GiB), gpu.multiprocessors) == ("amd", arch, gib, cus)
    assert Machine.simulated(spec).software.torch_hip is not None


def test_a_gfx_target_without_rules_gets_the_amd_records_conservative_default(tiny_models: dict[str, Path]) -> None:
    # gfx1036 (an RDNA2 APU) has no rule in the AMD record: bf16 is not planned, and the reason names the target.
    plan = cudaload.plan(tiny_models["qwen3"], machine=Machine.simulated("custom:gfx1036:8GiB"))
    assert plan.dtype == "float16"
    rejected = {r.value: r.reason for r in plan.decision("dtype").rejected}
    assert "(gfx1036) has no native bf16" in rejected["bfloat16"]
    assert plan.attn_implementation == "sdpa"


@pytest.mark.parametrize(
    ("spec", "words"),
    [("custom:gfx942:192GiB:304sm", "counts SMs, but an AMD GPU has compute units"), ("custom:gfx:80GiB", "gfx942")],
)
def test_a_wrong_gfx_description_says_the_form(spec: str, words: str) -> None:
    with pytest.raises(UnknownGpuError, match=words):
        Machine.simulated(spec)


# --- the simulated-machine API -----------------------------------------------------------------------------------


def test_a_launch_with_more_local_ranks_than_the_counted_gpus_is_refused() -> None:
    launch = Launch(launcher="torchrun", world_size=4, local_world_size=4, strategy="ddp")
    # Before: planned silently, two of the four ranks without a GPU.
    with pytest.raises(SettingError, match=r"4 ranks on this node .* 2 GPU\(s\).* Pass count=4"):
        Machine.simulated("A100", count=2, launch=launch)
    with pytest.raises(SettingError, match="2 would have none"):
        Machine.simulated(["A100", "A100"], launch=launch)
    # A single name with a launch is the GPU each rank has (the CLI's `--gpu A10G --world-size 4`).
    assert Machine.simulated("A10G", launch=launch).launch.world_size == 4


def test_a_gpu_list_with_a_count_is_refused() -> None:
    # Before: the count was ignored (two GPUs, not four).
    with pytest.raises(SettingError, match=r"count=2 with the GPU list .*\(pass gpu='A100', count=2"):
        Machine.simulated(["A100", "A100"], count=2)


def test_a_launch_that_is_not_a_launch_is_refused() -> None:
    # Before: accepted, then AttributeError "'dict' object has no attribute 'world_size'" when planning.
    with pytest.raises(SettingError, match=r"launch=\{'world_size': 2\}: pass a cudaload.Launch"):
        Machine.simulated("A100", launch={"world_size": 2})  # type: ignore[arg-type]


def test_with_and_without_the_same_package_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: --with won silently.
    with pytest.raises(SystemExit):
        main(["plan", "x", "--gpu", "T4", "--with", "bitsandbytes==0.50.2", "--without", "bitsandbytes"])
    assert "--with bitsandbytes==0.50.2 and --without bitsandbytes" in capsys.readouterr().err
