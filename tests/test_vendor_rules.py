"""Round 6 of the vendor rules, each from its own source: ROCm's newest and oldest parts (gfx950, gfx908, gfx1100)
and bitsandbytes under a ROCm torch (a release with a ROCm backend, a build for torch's HIP version)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import cudaload
from cudaload.capability.native_libraries import builds_in
from cudaload.errors import MissingPackageError
from cudaload.facts.bnb_rocm import rocm_build
from cudaload.facts.catalog import lookup_gpu
from cudaload.facts.hardware import GiB, Gpu
from cudaload.facts.machine import Machine

QLORA = {"peft": "0.21.2", "bitsandbytes": "0.50.2"}
BNB_0_50_2 = ("cpu", "cuda128", "rocm64", "rocm70", "rocm71", "rocm714", "rocm715", "rocm72", "xpu2025")
"""The builds the bitsandbytes 0.50.2 manylinux x86_64 wheel ships (its libbitsandbytes_*.so files)."""


# --- ROCm's newest and oldest parts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arch", "memory"),
    [
        ("MI350X", "gfx950", 288),
        ("MI355X", "gfx950", 288),
        ("MI100", "gfx908", 32),
        ("RX 7900 XTX", "gfx1100", 24),
        ("W7900", "gfx1100", 48),
    ],
)
def test_amd_parts_plan_bf16_from_their_gfx_target(
    tiny_models: dict[str, Path], name: str, arch: str, memory: int
) -> None:
    machine = Machine.simulated(name)
    gpu = machine.gpus[0]
    assert (gpu.vendor, gpu.arch, round(gpu.total_memory / GiB)) == ("amd", arch, memory)
    assert "amd.com" in lookup_gpu(name).source
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=machine)
    assert plan.dtype == "bfloat16"
    assert plan.decision("dtype").reason.startswith(f"{gpu.name} ({arch}) runs bf16 natively")


def test_flash_attn_s_ck_build_covers_gfx950(tiny_models: dict[str, Path]) -> None:
    """flash-attention 2.8.3 setup.py: validate_and_update_archs lists gfx950 with gfx90a and gfx942."""
    plan = cudaload.plan(
        str(tiny_models["qwen3"]), machine=Machine.simulated("MI355X", packages={"flash-attn": "2.8.3"})
    )
    assert plan.attn_implementation == "flash_attention_2"
    assert "the CK backend on gfx950" in plan.decision("attn_implementation").reason


def test_an_amd_gpu_without_matrix_cores_names_amd_s_first_matrix_architecture(tiny_models: dict[str, Path]) -> None:
    gfx906 = replace(
        Machine.simulated("MI210"),
        gpus=(Gpu(0, "AMD Instinct MI60", (9, 0), 32 * GiB, vendor="amd", arch_name="gfx906"),),
    )
    reason = cudaload.plan(str(tiny_models["qwen3"]), machine=gfx906).decision("dtype").reason
    assert (
        reason == "AMD Instinct MI60 (gfx906) predates bf16 (gfx90a) and tensor cores (gfx908): fp16 halves the memory"
    )


# --- bitsandbytes under a ROCm torch ---------------------------------------------------------------------------------


def test_the_wheel_s_builds_are_read_from_its_file_names(tmp_path: Path) -> None:
    for name in ("libbitsandbytes_rocm64.so", "libbitsandbytes_cuda128.so", "libbitsandbytes_cpu.so", "__init__.py"):
        (tmp_path / name).write_text("")
    assert builds_in(tmp_path) == ("cpu", "cuda128", "rocm64")
    assert builds_in(tmp_path / "missing") == ()


def test_only_a_library_file_name_is_read_as_a_build(tmp_path: Path) -> None:
    """The name rule is bitsandbytes' own pattern, `libbitsandbytes_<a-z letters><digits>.<so|dylib|dll>`, read with
    string methods: every other name is no build, whatever it starts or ends with."""
    import re

    names = [
        "libbitsandbytes_xpu2025.dll",
        "libbitsandbytes_mps.dylib",
        "libbitsandbytes_.so",
        "libbitsandbytes_123.so",
        "libbitsandbytes_CUDA128.so",
        "libbitsandbytes_cuda12a.so",
        "libbitsandbytes_cudä128.so",
        "libbitsandbytes_cuda128.so.bak",
        "libbitsandbytes_cuda128.pyd",
        "libbitsandbytes_cuda 128.so",
        "xlibbitsandbytes_cpu.so",
        "libbitsandbytes_cpu",
    ]
    for name in names:
        (tmp_path / name).write_text("")
    pattern = re.compile(r"libbitsandbytes_([a-z]+[0-9]*)\.(?:so|dylib|dll)")
    expected = tuple(sorted(m[1] for m in map(pattern.fullmatch, names) if m is not None))
    assert builds_in(tmp_path) == expected == ("mps", "xpu2025")


@pytest.mark.parametrize(
    ("hip", "build"),
    [
        ("7.1.25424-4179531dcd", "rocm71"),  # exact
        ("6.4.43482-0f2d60242", "rocm64"),  # exact
        ("6.3.42131-fa1d09cbd", "rocm64"),  # same major, the lowest above
        ("7.3.0", "rocm72"),  # same major, the highest below
        ("5.7.31921", None),  # no build of major 5: no cross-major fallback
    ],
)
def test_the_rocm_build_bitsandbytes_loads(hip: str, build: str | None) -> None:
    assert rocm_build(BNB_0_50_2, hip)[0] == build


def test_our_build_rule_is_bitsandbytes_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bitsandbytes' own `get_cuda_bnb_library_path`, run over a folder of the 0.50.2 wheel's build names under a
    pretend ROCm torch, picks what `rocm_build` says for every HIP version above."""
    from bitsandbytes import cextension

    for build in BNB_0_50_2:
        (tmp_path / f"libbitsandbytes_{build}.so").write_text("")
    monkeypatch.setattr(cextension, "PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(sys.modules["torch"].version, "hip", "6.3.0")
    for major, minor in ((7, 1), (6, 4), (6, 3), (7, 3), (5, 7)):
        specs = SimpleNamespace(cuda_version_tuple=(major, minor), cuda_version_string=f"{major}{minor}")
        picked = cextension.get_cuda_bnb_library_path(specs)
        ours = rocm_build(BNB_0_50_2, f"{major}.{minor}")[0]
        assert (picked.exists(), picked.name) == (
            ours is not None,
            f"libbitsandbytes_{ours or f'rocm{major}{minor}'}.so",
        )


def _rocm(hip: str, bitsandbytes: str = "0.50.2", builds: tuple[str, ...] | None = BNB_0_50_2) -> Machine:
    machine = Machine.simulated("MI300X", packages={**QLORA, "bitsandbytes": bitsandbytes})
    return replace(machine, software=replace(machine.software, torch_hip=hip, bitsandbytes_builds=builds))


def test_qlora_on_a_rocm_torch_the_wheel_has_a_build_for(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=_rocm("6.3.42131"), finetune=True, quantize="4bit")
    assert plan.decision("quantize").value == "4bit"


@pytest.mark.parametrize(
    ("hip", "bitsandbytes", "builds", "refusal"),
    [
        (
            "5.7.31921",
            "0.50.2",
            BNB_0_50_2,
            r"none for ROCm 5\.x, and it does not fall back across majors .*get_cuda_bnb_",
        ),
        ("6.4", "0.47.0", None, r"bitsandbytes 0\.47\.0 has no ROCm backend: .* 0\.48\.0"),
    ],
)
def test_qlora_on_rocm_is_refused_where_bitsandbytes_cannot_load(
    tiny_models: dict[str, Path], hip: str, bitsandbytes: str, builds: tuple[str, ...] | None, refusal: str
) -> None:
    with pytest.raises(MissingPackageError, match=refusal):
        cudaload.plan(
            str(tiny_models["qwen3"]), machine=_rocm(hip, bitsandbytes, builds), finetune=True, quantize="4bit"
        )
    # CUDA's minimum stays transformers' 0.46.1.
    h100 = Machine.simulated("H100", packages={**QLORA, "bitsandbytes": "0.47.0"})
    assert (
        cudaload.plan(str(tiny_models["qwen3"]), machine=h100, finetune=True, quantize="4bit")
        .decision("quantize")
        .value
        == "4bit"
    )


# --- the other vendors' rows of the parallelism tables ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "link_word"),
    [
        ("MI300X", "Infinity Fabric"),
        ("MI325X", "Infinity Fabric"),
        ("H100 NVL", "NVLink bridge"),
        ("H200 NVL", "NVLink bridge"),
        ("GH200", "NVLink 4"),
        ("H20", "NVLink 4"),
        ("H800", "NVLink 400"),
        ("H100 PCIe", "PCIe Gen5"),
    ],
)
def test_every_named_gpu_has_its_link_and_its_compute(name: str, link_word: str) -> None:
    from cudaload.facts.interconnect import gpu_link, gpu_tflops
    from cudaload.facts.shapes import LLAMA_SHAPES

    gpu = lookup_gpu(name).name
    speed, what = gpu_link(gpu)
    assert link_word in what and (speed, what) != gpu_link(None)  # not the PCIe Gen4 assumed for a GPU not listed
    assert (gpu_tflops(gpu) or 0) > 100
    plan = cudaload.plan(
        LLAMA_SHAPES["7B"], machine=Machine.simulated(name, count=8), finetune=True, nodes=2, interconnect="roce"
    )
    assert f"inside a node {what}" in plan.decision("parallelism").reason
    sizes = plan.finetune.parallelism["sizes"] if plan.finetune and plan.finetune.parallelism else {}
    assert sizes and all(size["compute_s"] is not None for size in sizes.values())  # None: no step time


# --- pre-quantized checkpoints on ROCm -------------------------------------------------------------------------------


def _checkpoint(config: dict[str, object]) -> object:
    from cudaload.facts.model import any_model
    from cudaload.facts.stored_weights import read_quantization_config

    return replace(any_model(), parameters=1000, quantization=read_quantization_config(config))


_FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


@pytest.mark.parametrize(("gpu", "why"), [("MI300X", "float8_e4m3fnuz"), ("MI355X", "is not documented")])
def test_an_fp8_checkpoint_kept_quantized_on_an_amd_gpu_is_refused_with_the_way_to_load_it(gpu: str, why: str) -> None:
    """transformers 5.22-5.25 FineGrainedFP8HfQuantizer.validate_environment passes ROCm's capability (9.4, 9.5)
    and keeps float8_e4m3fn weights for the finegrained-fp8 Triton kernel."""
    from cudaload.errors import QuantizationError
    from cudaload.policy.checkpoint_quantization import decide_checkpoint_quantization

    fp8 = _checkpoint(_FP8)
    with pytest.raises(QuantizationError, match=rf"{why}.*FineGrainedFP8Config\(dequantize=True\)"):
        decide_checkpoint_quantization(Machine.simulated(gpu), fp8, "bfloat16", use_kernels=False)  # type: ignore[arg-type]
    # Asked dequantized, it is planned so; on an H100 it stays FP8 as before.
    asked = decide_checkpoint_quantization(Machine.simulated(gpu), fp8, "bfloat16", False, dequantize=True)  # type: ignore[arg-type]
    assert asked is not None and asked.decision.value == "dequantized"
    h100 = decide_checkpoint_quantization(Machine.simulated("H100"), fp8, "bfloat16", use_kernels=False)  # type: ignore[arg-type]
    assert h100 is not None and h100.decision.value == "fp8" and h100.warnings == ()


def test_gptq_on_an_amd_gpu_is_planned_as_transformers_loads_it_with_a_warning() -> None:
    from cudaload.policy.checkpoint_quantization import decide_checkpoint_quantization

    gptq = _checkpoint({"quant_method": "gptq", "bits": 4, "group_size": 128})
    packages = {"optimum": "1.24.0", "gptqmodel": "1.4.3"}
    planned = decide_checkpoint_quantization(Machine.simulated("MI300X", packages=packages), gptq, "float16", False)  # type: ignore[arg-type]
    assert planned is not None and planned.decision.value == "gptq"
    assert any("no quantizer reads torch.version.hip" in w for w in planned.warnings)
