"""Intel XPU and Apple MPS as the third and fourth vendors, through the platform seam: one record each
(facts/platform_xpu.py, facts/platform_mps.py), one probe each (capability/xpu_mps.py), catalog lines. Simulated
machines plan them without the hardware; detection is tested with a fake torch at the probe boundary."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import cudaload
from cudaload.capability import detect_uncached
from cudaload.capability.gpus import ProbeFailed
from cudaload.capability.xpu_mps import MpsProbe, XpuTorchProbe, apple_chip, intel_arch
from cudaload.errors import MissingPackageError
from cudaload.facts.hardware import GiB
from cudaload.facts.machine import Machine

QLORA = {"peft": "0.21.2", "bitsandbytes": "0.50.2"}


def test_an_m3_max_plans_mps_bf16_and_sdpa(tiny_models: dict[str, Path]) -> None:
    machine = Machine.simulated("M3 Max")
    gpu = machine.gpus[0]
    assert (gpu.vendor, gpu.arch, gpu.device, round(gpu.total_memory / GiB)) == ("apple", "m3", "mps", 128)
    assert machine.software.torch_mps and machine.software.torch_cuda is None
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=machine)
    assert (plan.dtype, plan.attn_implementation, plan.kwargs["device_map"]) == ("bfloat16", "sdpa", "mps")
    rejected = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}
    assert "kernels-community/metal-flash-sdpa" in rejected["flash_attention_2"]


def test_qlora_on_mps_keeps_bitsandbytes_without_paged_optimizers_nor_tf32(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(
        str(tiny_models["qwen3"]),
        machine=Machine.simulated("M3 Max", packages=QLORA),
        finetune=True,
        quantize="4bit",
    )
    assert plan.decision("quantize").value == "4bit"
    assert plan.decision("training.optim").value == "adamw_torch_fused"
    assert "in progress on Metal" in plan.decision("training.optim").rejected[0].reason
    assert "training.tf32" not in {d.setting for d in plan.decisions}


@pytest.mark.parametrize(("name", "devices"), [("Arc A770", ["xpu:0"]), ("Max 1550", ["xpu:0", "xpu:1"])])
def test_intel_gpus_plan_xpu_bf16_and_qlora_with_paged_adamw(
    tiny_models: dict[str, Path], name: str, devices: list[str]
) -> None:
    machine = Machine.simulated(name, packages=QLORA)
    assert [g.device for g in machine.gpus] == devices and machine.software.torch_xpu
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=machine, finetune=True, quantize="4bit")
    assert (plan.dtype, plan.kwargs["device_map"]) == ("bfloat16", "xpu:0")
    assert plan.decision("training.optim").value == "paged_adamw_8bit"  # XpuBNBNativeLibrary: SYCL USM paging
    tf32 = plan.decision("training.tf32")
    assert tf32.value is False and "is_torch_tf32_available" in tf32.reason
    inference = cudaload.plan(str(tiny_models["qwen3"]), machine=Machine.simulated(name))
    rejected = {r.value: r.reason for r in inference.decision("attn_implementation").rejected}
    assert 'Hub build for "cuda" only' in rejected["flash_attention_4"]


def test_bitsandbytes_older_than_its_xpu_backend_is_refused(tiny_models: dict[str, Path]) -> None:
    machine = Machine.simulated("Arc A770", packages={**QLORA, "bitsandbytes": "0.47.0"})
    with pytest.raises(MissingPackageError, match=r"bitsandbytes 0\.47\.0 is older than 0\.48\.0, the first .* XPU"):
        cudaload.plan(str(tiny_models["qwen3"]), machine=machine, finetune=True, quantize="4bit")


def test_architecture_names() -> None:
    assert intel_arch("Intel(R) Arc(TM) A770 Graphics", True) == "xe-hpg"
    assert intel_arch("Intel(R) Data Center GPU Max 1550", True) == "xe-hpc"
    assert intel_arch("Intel(R) Arc(TM) B580 Graphics", True) == "xe2"
    assert intel_arch("Intel(R) UHD Graphics 770", False) == "xe-lp"
    assert (apple_chip("Apple M3 Max"), apple_chip("Apple M1"), apple_chip("Apple Paravirtual device")) == (
        "m3",
        "m1",
        "apple",
    )


# --- detection, with a fake torch at the probe boundary ------------------------------------------------------------


def _no_gpu() -> Any:
    raise ProbeFailed("no driver here", no_driver=True)


class FakeXpu:
    """torch.xpu of an XPU build with one Arc A770; records calls, so a test sees the count came first."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def device_count(self) -> int:
        self.calls.append("device_count")
        return 1

    def get_device_properties(self, index: int) -> SimpleNamespace:
        self.calls.append("get_device_properties")  # torch starts the XPU runtime here (_lazy_init)
        return SimpleNamespace(
            name="Intel(R) Arc(TM) A770 Graphics",
            total_memory=16225243136,
            max_compute_units=512,
            has_subgroup_matrix_multiply_accumulate=True,
        )


def test_an_xpu_torch_s_gpus_are_intel_gpus_counted_before_the_runtime_starts() -> None:
    xpu = FakeXpu()
    torch = SimpleNamespace(version=SimpleNamespace(xpu="20250101"), xpu=xpu)
    machine = detect_uncached({}, vendor_probes={"nvidia": (_no_gpu,), "intel": (lambda: XpuTorchProbe(torch),)})
    assert machine.source == "xpu-torch"
    assert [(g.vendor, g.arch, g.device, g.name) for g in machine.gpus] == [
        ("intel", "xe-hpg", "xpu:0", "Intel(R) Arc(TM) A770 Graphics")
    ]
    assert xpu.calls[0] == "device_count" and "get_device_properties" in xpu.calls
    no_gpu = SimpleNamespace(version=SimpleNamespace(xpu="20250101"), xpu=SimpleNamespace(device_count=lambda: 0))
    with pytest.raises(ProbeFailed, match="sees no GPU"):
        XpuTorchProbe(no_gpu)


def test_the_mps_backend_is_the_apple_gpu_sharing_the_mac_s_memory() -> None:
    mps = SimpleNamespace(is_available=lambda: True, get_name=lambda: "Apple M3 Max", get_core_count=lambda: 40)
    torch = SimpleNamespace(
        backends=SimpleNamespace(mps=mps), mps=SimpleNamespace(recommended_max_memory=lambda: 96 * GiB)
    )
    machine = detect_uncached({}, vendor_probes={"nvidia": (_no_gpu,), "apple": (lambda: MpsProbe(torch),)})
    assert [(g.vendor, g.arch, g.device, g.total_memory, g.multiprocessors) for g in machine.gpus] == [
        ("apple", "m3", "mps", 96 * GiB, 40)
    ]
    unavailable = SimpleNamespace(backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: False)))
    with pytest.raises(ProbeFailed, match="is_available"):
        MpsProbe(unavailable)


def test_on_this_machine_neither_probe_starts_torch() -> None:
    """A CPU torch on Linux: both probes refuse from torch/version.py and the platform, as 'no driver'."""
    for probe in (XpuTorchProbe, MpsProbe):
        with pytest.raises(ProbeFailed) as failed:
            probe()
        assert failed.value.no_driver


@pytest.mark.parametrize(
    ("gpu", "device_map", "wrong"),
    [("M3 Max", "mps", "cuda:0"), ("Arc A770", "xpu:0", "cuda:0"), ("H100", "cuda:0", "xpu:0")],
)
def test_a_device_map_you_pass_names_the_machine_s_own_device_type(
    tiny_models: dict[str, Path], gpu: str, device_map: str, wrong: str
) -> None:
    machine = Machine.simulated(gpu)
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=machine, device_map=device_map)
    assert plan.kwargs["device_map"] == device_map
    with pytest.raises(cudaload.PlacementError, match=f"is a '{wrong.partition(':')[0]}' device"):
        cudaload.plan(str(tiny_models["qwen3"]), machine=machine, device_map=wrong)
