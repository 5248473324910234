"""The platform seam (issue 41 item 3): a GPU has a vendor and an architecture, and the policy asks the vendor's
record. ROCm proves it: a HIP torch's GPUs are detected as AMD GPUs (amdsmi, else torch's device properties)
and planned from the rules AMD's stack documents; a made-up vendor is a record, a probe and catalog entries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import cudaload
from cudaload.capability import GPU_PROBES, detect_uncached, software
from cudaload.capability.gpus import ProbeFailed, TorchProbe, probe_gpus
from cudaload.capability.module_constants import TorchBuilds
from cudaload.capability.rocm import AmdSmiProbe, RocmTorchProbe, gfx_capability, gfx_target
from cudaload.capability.usable_gpus import gpus_unusable
from cudaload.errors import DtypeUnsupportedError, UnknownGpuError
from cudaload.facts.catalog import CATALOGS, CatalogGpu
from cudaload.facts.hardware import GiB, Gpu
from cudaload.facts.machine import Machine, Software
from cudaload.facts.platform import Platform
from cudaload.facts.platforms import PLATFORMS

# --- detection: a HIP torch's GPUs are AMD GPUs -----------------------------------------------------------------


class FakeAmdSmi:
    """amdsmi as ROCm installs it, for two MI300X; records every call, so a test sees what was asked."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        answers = {
            "amdsmi_init": None,
            "amdsmi_shut_down": None,
            "amdsmi_get_processor_handles": ["h0", "h1"],
            "amdsmi_get_gpu_asic_info": {
                "market_name": "AMD Instinct MI300X",
                "target_graphics_version": "gfx942",
                "num_compute_units": 304,
            },
            "amdsmi_get_gpu_vram_usage": {"vram_total": 196592, "vram_used": 592},  # MB
            "amdsmi_get_gpu_device_uuid": "1d00-74a1",
            "amdsmi_get_gpu_device_bdf": "0000:0c:00.0",
        }
        if name not in answers:
            raise AttributeError(name)

        def call(*args: object) -> Any:
            self.calls.append(name)
            return answers[name]

        return call


def _no_nvidia() -> TorchProbe:
    raise ProbeFailed("no NVIDIA driver", no_driver=True)


def _hip_torch(arch: str = "gfx90a:sramecc+:xnack-", count: int = 2) -> SimpleNamespace:
    """A ROCm torch as its device properties show it: nothing but what the probe may read (any other call,
    a kernel launch or mem_get_info, is an AttributeError)."""
    props = SimpleNamespace(
        name="AMD Instinct MI250X",
        gcnArchName=arch,
        major=9,
        minor=0,
        total_memory=64 * GiB,
        multi_processor_count=110,
    )
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: count, get_device_properties=lambda i: props)
    return SimpleNamespace(version=SimpleNamespace(hip="6.4.43484", cuda=None), cuda=cuda)


def test_gfx_names_and_the_capability_hip_reports() -> None:
    assert gfx_target("gfx90a:sramecc+:xnack-") == "gfx90a"
    assert gfx_target("GFX942") == "gfx942"
    assert gfx_target("") is None
    assert gfx_capability("gfx942") == (9, 4)
    assert gfx_capability("gfx90a") == (9, 0)
    assert gfx_capability("gfx1100") == (11, 0)


def test_a_hip_torch_with_amdsmi_is_a_machine_of_amd_gpus_planned_from_rocm_rules(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = FakeAmdSmi()
    hip_build = TorchBuilds(cuda=None, hip="6.4.43484", xpu=None)  # torch.version (or torch/version.py) says hip = ...
    monkeypatch.setattr(software, "torch_builds", lambda: hip_build)
    machine = detect_uncached(
        {"HIP_VISIBLE_DEVICES": "1"},
        vendor_probes={"nvidia": (_no_nvidia,), "amd": (lambda: AmdSmiProbe(smi, exists=lambda path: True),)},
    )
    assert machine.source == "amdsmi"
    assert [(g.index, g.vendor, g.arch, g.name) for g in machine.gpus] == [(0, "amd", "gfx942", "AMD Instinct MI300X")]
    gpu = machine.gpus[0]
    assert gpu.total_memory == 196592 * 2**20 and gpu.free_memory == (196592 - 592) * 2**20
    assert (gpu.physical_index, gpu.uuid, gpu.capability) == (1, "GPU-1d00-74a1", (9, 4))  # HIP_VISIBLE_DEVICES=1
    assert machine.software.torch_hip == "6.4.43484" and machine.gpus_unusable is None
    assert smi.calls[0] == "amdsmi_init" and smi.calls[-1] == "amdsmi_shut_down"
    assert len(machine.gpu_notes) == 1 and "no NVIDIA driver" in machine.gpu_notes[0]  # amdsmi answered

    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=machine)
    assert plan.dtype == "bfloat16"
    assert plan.decision("dtype").reason.startswith("AMD Instinct MI300X (gfx942) runs bf16 natively")
    # No flash-attn here: transformers would fetch the ROCm Hub build, which no source documents for gfx942.
    assert plan.attn_implementation == "sdpa"
    rejected = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}
    assert "kernels-community/aiter-flash-attn" in rejected["flash_attention_2"]
    assert all("not documented for ROCm" in why for why in rejected.values()), rejected
    assert plan.kwargs["device_map"] == "cuda:0"


def test_without_amdsmi_the_rocm_torch_device_properties_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "amdsmi", None)  # `import amdsmi` raises ImportError
    torch = _hip_torch()
    report = probe_gpus(
        {"CUDA_VISIBLE_DEVICES": "0"},  # torch applied it already: the two it lists are the visible ones
        [lambda: AmdSmiProbe(exists=lambda path: True), lambda: RocmTorchProbe(torch, exists=lambda path: True)],
    )
    assert report.source == "rocm-torch"
    assert "amdsmi is not importable" in report.notes[0]
    assert [(g.vendor, g.arch, g.capability, g.total_memory) for g in report.gpus] == [
        ("amd", "gfx90a", (9, 0), 64 * GiB)
    ] * 2


def test_each_vendors_torch_probe_refuses_the_other_vendors_torch() -> None:
    with pytest.raises(ProbeFailed, match="not a ROCm build"):
        RocmTorchProbe(SimpleNamespace(version=SimpleNamespace(hip=None)), exists=lambda path: True)
    with pytest.raises(ProbeFailed, match="no AMD ROCm driver"):
        RocmTorchProbe(_hip_torch(), exists=lambda path: False)


def test_the_cuda_torch_probe_leaves_a_rocm_torch_to_the_amd_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "torch", _hip_torch())
    with pytest.raises(ProbeFailed, match="ROCm build"):
        TorchProbe()


def test_amd_probes_are_asked_only_when_no_nvidia_probe_answered() -> None:
    def never() -> AmdSmiProbe:
        raise AssertionError("the AMD probes were asked although NVML answered")

    class NoGpus(AcmeProbe):
        name = "nvml"

        def devices(self) -> list[Any]:
            return []  # NVML answered: CUDA_VISIBLE_DEVICES="" hides every GPU

    machine = detect_uncached({"CUDA_VISIBLE_DEVICES": ""}, vendor_probes={"nvidia": (NoGpus,), "amd": (never,)})
    assert (machine.source, machine.gpus, machine.gpu_notes) == ("nvml", (), ())


def test_amd_gpus_under_a_torch_not_built_for_rocm_are_planned_around() -> None:
    mi300x = Machine.simulated("MI300X").gpus
    cpu_torch = Software(packages=(("torch", "2.13.0"),))
    assert gpus_unusable(mi300x, cpu_torch) == (
        "1 AMD GPU(s) (AMD Instinct MI300X) are present, but torch 2.13.0 is a CPU-only build"
    )
    cuda_torch = replace(cpu_torch, torch_cuda="12.8")
    assert gpus_unusable(mi300x, cuda_torch) == (
        "1 AMD GPU(s) (AMD Instinct MI300X) are present, but torch 2.13.0 is built for CUDA 12.8, not ROCm"
    )
    assert gpus_unusable(mi300x, replace(cpu_torch, torch_hip="6.4", driver="1.0")) is None  # no CUDA driver rule
    # NVIDIA as before: a ROCm torch cannot drive an H100.
    h100 = Machine.simulated("H100").gpus
    assert "built for ROCm 6.4, not CUDA" in str(gpus_unusable(h100, replace(cpu_torch, torch_hip="6.4")))


# --- simulated AMD machines ----------------------------------------------------------------------------------------


def test_simulated_mi300x_and_mi250x_are_amd_machines_with_a_rocm_torch() -> None:
    mi300x = Machine.simulated("MI300X")
    assert [(g.vendor, g.arch, round(g.total_memory / GiB)) for g in mi300x.gpus] == [("amd", "gfx942", 192)]
    assert (mi300x.software.torch_hip, mi300x.software.torch_cuda) == ("6.4", None)
    mi250x = Machine.simulated("MI250X")  # one board: two GCDs, each its own device of 64 GB
    assert [(g.index, g.arch, round(g.total_memory / GiB)) for g in mi250x.gpus] == [
        (0, "gfx90a", 64),
        (1, "gfx90a", 64),
    ]
    assert mi250x.describe() == "2x AMD Instinct MI250X (gfx90a)"
    h100 = Machine.simulated("H100").gpus[0]  # NVIDIA keeps its compute capability as its architecture
    assert (h100.vendor, h100.arch, h100.sm, h100.capability, h100.platform.runtime) == (
        "nvidia",
        "sm_90",
        "sm_90",
        (9, 0),
        "CUDA",
    )


def test_flash_attn_s_rocm_build_runs_on_the_ck_architectures(tiny_models: dict[str, Path]) -> None:
    path = str(tiny_models["qwen3"])
    plan = cudaload.plan(path, machine=Machine.simulated("MI250X", packages={"flash-attn": "2.8.3"}))
    assert plan.attn_implementation == "flash_attention_2"
    assert "its ROCm build: the CK backend on gfx90a" in plan.decision("attn_implementation").reason
    rejected = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}
    assert "kernels-community/aiter-flash-attn" in rejected["flash_attention_3"]  # flash-attn-3 not installed
    assert "CuTe DSL for NVIDIA" in rejected["flash_attention_4"]
    # An architecture the CK backend does not list is not guessed at: the Triton backend is invisible here.
    gfx1100 = replace(
        Machine.simulated("MI210", packages={"flash-attn": "2.8.3"}),
        gpus=(Gpu(0, "AMD Radeon RX 7900 XTX", (11, 0), 24 * GiB, vendor="amd", arch_name="gfx1100"),),
    )
    rdna = cudaload.plan(path, machine=gfx1100, dtype="float16")
    assert rdna.attn_implementation == "sdpa"
    fa2 = next(r.reason for r in rdna.decision("attn_implementation").rejected if r.value == "flash_attention_2")
    assert "Triton backend" in fa2 and "not documented for ROCm" in fa2
    # gfx906 (MI50/MI60, Vega 20) has neither bf16 nor matrix cores: an asked-for bf16 is refused.
    gfx906 = replace(gfx1100, gpus=(Gpu(0, "AMD Instinct MI60", (9, 0), 32 * GiB, vendor="amd", arch_name="gfx906"),))
    with pytest.raises(DtypeUnsupportedError, match=r"documented here for gfx1100, gfx908, .* only and AMD Instinct"):
        cudaload.plan(path, machine=gfx906, dtype="bfloat16")


def test_qlora_on_rocm_keeps_bitsandbytes_and_its_paged_optimizer_but_no_tf32(tiny_models: dict[str, Path]) -> None:
    machine = Machine.simulated("MI300X", packages={"peft": "0.21.2", "bitsandbytes": "0.50.2"})
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=machine, finetune=True, quantize="4bit")
    assert plan.decision("quantize").value == "4bit"
    # bitsandbytes 0.50.2's README lists 8-bit optimizers on AMD GPUs; a ROCm build has cget_managed_ptr.
    assert plan.decision("training.optim").value == "paged_adamw_8bit"
    tf32 = plan.decision("training.tf32")
    assert tf32.value is False and "is_torch_tf32_available" in tf32.reason
    # NVIDIA unchanged: paged 8-bit AdamW and TF32 on an H100.
    h100 = cudaload.plan(
        str(tiny_models["qwen3"]),
        machine=Machine.simulated("H100", packages={"peft": "0.21.2", "bitsandbytes": "0.50.2"}),
        finetune=True,
        quantize="4bit",
    )
    assert (h100.decision("training.optim").value, h100.decision("training.tf32").value) == ("paged_adamw_8bit", True)


# --- a made-up vendor: its record, its probe and its catalog, nothing else ---------------------------------------


def _acme() -> Platform:
    return Platform(
        vendor="acme",
        label="Acme",
        runtime="AcmeRT",
        torch_build=lambda software: software.version("acme-torch"),
        simulate_build=lambda software: replace(software, packages=(*software.packages, ("acme-torch", "1.0"))),
        bf16=lambda gpu: gpu.arch == "ax2",
        bf16_since="ax2",
        bf16_missing=lambda gpu: f"{gpu.name} ({gpu.arch}) has no bf16",
        fp16_tensor_cores=lambda gpu: True,
        tf32=lambda gpu, current: (None, "", ""),
        paged_optimizers="AcmeRT has no managed memory",
        quant_backend=lambda package: f"{package} has no AcmeRT backend",
        flash_order=lambda gpu: ("flash_attention_2",),
        flash_generation=lambda gpu, name, installed: f"no FlashAttention for {gpu.arch}",
    )


class AcmeProbe:
    """The made-up vendor's probe: one X2 board."""

    name = "acme-smi"

    def __enter__(self) -> AcmeProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def driver_version(self) -> str | None:
        return "acme 1"

    def devices(self) -> list[Any]:
        from cudaload.capability.visible import RawDevice

        return [RawDevice(0, "Acme X2", "GPU-acme", (1, 0), 48 * GiB, vendor="acme", arch="ax2")]


def test_a_registered_vendor_is_detected_and_planned_with_no_edit_elsewhere(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PLATFORMS, "acme", _acme())  # its record
    monkeypatch.setitem(GPU_PROBES, "acme", (AcmeProbe,))  # its probe
    x1 = CatalogGpu("Acme X1", (1, 0), 32, 64, ("acme-x1",), "made up", vendor="acme", arch="ax1")
    x2 = replace(x1, name="Acme X2", aliases=("acme-x2",), arch="ax2")
    monkeypatch.setitem(CATALOGS, "acme", (x1, x2))  # its catalog
    path = str(tiny_models["qwen3"])

    plan = cudaload.plan(path, machine=Machine.simulated("acme-x1"))
    assert plan.dtype == "float16"  # no bf16 on ax1, fp16 on its matrix units
    assert plan.decision("dtype").reason == "Acme X1 (ax1) predates bf16 (ax2): fp16 runs on its tensor cores"
    assert plan.attn_implementation == "sdpa"
    assert ("flash_attention_2", "no FlashAttention for ax1") in {
        (r.value, r.reason) for r in plan.decision("attn_implementation").rejected
    }
    assert plan.kwargs["device_map"] == "cuda:0"
    with pytest.raises(DtypeUnsupportedError, match=r"Acme X1 \(ax1\) has no bf16"):
        cudaload.plan(path, machine=Machine.simulated("acme-x1"), dtype="bfloat16")

    tuned = cudaload.plan(
        path,
        machine=Machine.simulated("acme-x2", packages={"peft": "0.21.2", "bitsandbytes": "0.50.2"}),
        finetune=True,
    )
    assert tuned.dtype == "bfloat16"
    assert tuned.decision("training.optim").value == "adamw_torch_fused"
    assert "training.tf32" not in {d.setting for d in tuned.decisions}

    detected = detect_uncached({}, vendor_probes={"nvidia": (_no_nvidia,), "acme": (AcmeProbe,)})
    assert (detected.source, detected.gpus[0].arch, detected.gpus_unusable) == (
        "acme-smi",
        "ax2",
        f"1 Acme GPU(s) (Acme X2) are present, but torch {detected.software.version('torch')} is a CPU-only build",
    )


def test_a_gpu_of_a_vendor_without_a_record_says_so() -> None:
    with pytest.raises(UnknownGpuError, match="No platform record for GPU vendor 'acme'"):
        _ = Gpu(0, "Acme X1", (1, 0), GiB, vendor="acme").bf16
