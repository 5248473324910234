"""torchao int8 weight-only (`quantize="torchao-int8"`), the fourth quantization method, added as one record of
facts/quant_methods.py. These tests hold whether or not torchao is installed here (CI runs them both ways; the real
load is tests/test_torchao_load.py): planning for a machine that has it works from the record, a machine without it is
refused with the install hint, and loading without it (simulated) fails at apply time with MissingPackageError
instead of transformers' ValueError."""

from __future__ import annotations

import inspect
import sys
import types
from pathlib import Path

import pytest

import cudaload
from cudaload.errors import MissingPackageError
from cudaload.facts.machine import Machine
from cudaload.facts.quant_methods import QUANT_METHODS

TORCHAO = {"torchao": "0.15.0", "peft": "0.21.2", "bitsandbytes": None}
RECORD = QUANT_METHODS["torchao-int8"]


def test_the_record_holds_against_transformers() -> None:
    """The facts the record is built on, read from the installed transformers (5.22 and 5.25 agree)."""
    from transformers.quantizers.quantizer_torchao import TorchAoHfQuantizer
    from transformers.utils import import_utils
    from transformers.utils.quantization_config import TorchAoConfig

    assert RECORD.package.min_version == import_utils.TORCHAO_MIN_VERSION
    assert QUANT_METHODS["4bit"].package.min_version == import_utils.BITSANDBYTES_MIN_VERSION
    # TorchAoConfig takes a torchao config object and refuses the old string form: the record builds the object.
    assert "String-based quantization type" in inspect.getsource(TorchAoConfig.post_init)
    # transformers trains (is_trainable) only torchao's 8-bit configs, by the digit before "weight" in the name.
    fake = types.SimpleNamespace(
        quantization_config=types.SimpleNamespace(quant_type=type("Int8WeightOnlyConfig", (), {})())
    )
    assert TorchAoHfQuantizer.is_trainable.fget(fake) is True  # type: ignore[attr-defined]
    assert RECORD.quant_method == "torchao" and RECORD.config_class == "TorchAoConfig"


def test_planned_from_the_record_where_torchao_is_installed(tiny_models: dict[str, Path]) -> None:
    path = str(tiny_models["qwen3"])
    plan = cudaload.plan(
        path, machine=Machine.simulated("A100", packages=TORCHAO), finetune=True, quantize="torchao-int8"
    )
    assert plan.decision("quantize").value == "torchao-int8"
    assert plan.kwargs["quantization_config"] == {"quant_type": "Int8WeightOnlyConfig"}  # JSON-ready in the plan
    assert plan.decision("training.optim").value == "adamw_torch_fused"  # no bitsandbytes optimizer
    assert plan.decision("training.optim").rejected == ()
    facts = cudaload.read_model_facts(path)
    rows = sum(fan_out * count for _, _, fan_out, count in facts.linear_shapes)
    assert plan.weight_bytes == facts.linear_parameters + 4 * rows + (facts.parameters - facts.linear_parameters) * 2
    assert plan.finetune is not None and "torchao-int8" in plan.finetune.memory_estimate


@pytest.mark.parametrize(
    ("gpu", "torchao", "refusal"),
    [
        ("A100", None, r"torchao is not installed \(pip install torchao\)"),
        ("A100", "0.14.0", r"torchao 0.14.0 is older than 0.15.0, .*\(pip install 'torchao>=0.15.0'\)"),
        # On a CPU from 0.18.0, the release loaded and trained there (0.15.0 fails in peft's is_torchao_available).
        (None, "0.15.0", r"torchao 0.15.0 has no CPU backend \(0.18\+ has one\)"),
    ],
)
def test_refused_at_planning_with_what_to_do(
    tiny_models: dict[str, Path], gpu: str | None, torchao: str | None, refusal: str
) -> None:
    machine = Machine.simulated(gpu, packages={**TORCHAO, "torchao": torchao})
    with pytest.raises(MissingPackageError, match=refusal):
        cudaload.plan(str(tiny_models["qwen3"]), machine=machine, finetune=True, quantize="torchao-int8")


def test_applying_without_torchao_raises_missing_package(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not importable, whether or not it is installed here: torchao and every submodule already imported (planning
    # imports transformers' modeling_utils, which imports torchao.quantization where torchao is installed).
    for name in {"torchao", *(n for n in sys.modules if n.startswith("torchao."))}:
        monkeypatch.setitem(sys.modules, name, None)
    plan = cudaload.plan(
        str(tiny_models["qwen3"]),
        machine=Machine.simulated("A100", packages=TORCHAO),
        finetune=True,
        quantize="torchao-int8",
    )
    with pytest.raises(
        MissingPackageError,
        match=r"quantize='torchao-int8', which needs torchao, and torchao is not installed here: "
        r"pip install 'torchao>=0.15.0'",
    ):
        cudaload.from_pretrained_kwargs(plan)


def test_the_record_builds_the_torchao_config_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """At load time the plan's class name becomes the object TorchAoConfig takes (a stand-in torchao here)."""
    built = type("Int8WeightOnlyConfig", (), {})
    quantization = types.ModuleType("torchao.quantization")
    quantization.Int8WeightOnlyConfig = built  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.quantization", quantization)
    assert RECORD.objects is not None
    kwargs = RECORD.objects(RECORD.build("bfloat16", False))
    assert isinstance(kwargs["quant_type"], built)


@pytest.mark.parametrize(
    ("packages", "missing"),
    [
        ({"torchao": None}, "torchao is not installed (pip install torchao)"),
        ({"torchao": "0.14.0"}, "torchao 0.14.0 is older than 0.15.0, the oldest transformers accepts"),
        ({"torchao": "0.15.0"}, None),
    ],
)
def test_a_torchao_checkpoint_needs_the_package_on_any_device(
    packages: dict[str, str | None], missing: str | None
) -> None:
    """A pre-quantized torchao checkpoint is judged by the record's package (what TorchAoHfQuantizer's
    validate_environment raises ImportError for), not by cudaload's GPU-only rule for quantizing a base."""
    from dataclasses import replace

    from cudaload.facts.model import any_model
    from cudaload.facts.stored_weights import CheckpointQuantization
    from cudaload.policy.checkpoint_quantization import decide_checkpoint_quantization

    stored = CheckpointQuantization("torchao", "torchao int8", None, quantized_parameters=10)
    model = replace(any_model(), parameters=100, quantized="torchao", quantization=stored)
    for gpu in (None, "A100"):
        found = decide_checkpoint_quantization(Machine.simulated(gpu, packages=packages), model, "bfloat16", False)
        assert found is not None
        assert (found.missing or "").startswith(missing or "") and (found.missing is None) is (missing is None)


def test_planned_on_a_cpu_from_the_release_that_runs_there(tiny_models: dict[str, Path]) -> None:
    cpu = Machine.simulated(None, packages={**TORCHAO, "torchao": "0.18.0"})
    plan = cudaload.plan(
        str(tiny_models["qwen3"]), machine=cpu, finetune=True, quantize="torchao-int8", dtype="bfloat16"
    )
    assert plan.decision("quantize").value == "torchao-int8"
    assert plan.kwargs["device_map"] == "cpu"


def test_the_read_back_compares_torchao_configs_in_their_serialized_form(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's "Int8WeightOnlyConfig" against what TorchAoConfig.to_dict() writes: {"default": {"_type": ...,
    "_version": ..., "_data": {...}}} (torchao's config_to_dict). A stand-in torchao serializes the same way."""
    from cudaload.loaders.readback import read_back

    class Int8WeightOnlyConfig:
        def __init__(self, group_size: int | None = None) -> None:
            self.group_size = group_size

    def config_to_dict(config: Int8WeightOnlyConfig) -> dict[str, object]:
        return {"_type": type(config).__name__, "_version": 2, "_data": {"group_size": config.group_size}}

    quantization = types.ModuleType("torchao.quantization")
    quantization.Int8WeightOnlyConfig = Int8WeightOnlyConfig  # type: ignore[attr-defined]
    core_config = types.ModuleType("torchao.core.config")
    core_config.config_to_dict = config_to_dict  # type: ignore[attr-defined]
    for name, module in {"torchao": types.ModuleType("torchao"), "torchao.quantization": quantization}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "torchao.core", types.ModuleType("torchao.core"))
    monkeypatch.setitem(sys.modules, "torchao.core.config", core_config)

    plan = cudaload.plan(
        str(tiny_models["qwen3"]),
        machine=Machine.simulated("A100", packages=TORCHAO),
        finetune=True,
        quantize="torchao-int8",
    )

    def loaded(group_size: int | None) -> types.SimpleNamespace:
        as_dict = {
            "quant_method": "torchao",
            "quant_type": {"default": config_to_dict(Int8WeightOnlyConfig(group_size))},
        }
        config = types.SimpleNamespace(quantization_config=types.SimpleNamespace(to_dict=lambda: as_dict))
        return types.SimpleNamespace(config=config)

    assert read_back(plan, loaded(None)) == ()
    [difference] = read_back(plan, loaded(128))
    assert "quant_type" in difference and "'group_size': 128" in difference


def test_doctor_says_what_an_installed_torchao_costs_on_a_cpu_torch() -> None:
    """transformers imports torchao in every process; on a CPU torch its CUDA extensions fail to load."""
    from dataclasses import replace

    from cudaload.cli.doctor_command import doctor_report

    machine = Machine.simulated(None, packages={"torchao": "0.18.0"}, cpu_flags=["avx2"])
    so = ("_C_cutlass_90a.abi3.so", "_C_mxfp8.cpython-310-x86_64-linux-gnu.so")  # the 0.18.0 wheel's
    cpu_torch = replace(machine, software=replace(machine.software, torch_cuda=None, torchao_extensions=so))
    report = " ".join(doctor_report(cpu_torch, as_json=False, width=1000).split())
    assert "torchao 0.18.0: transformers imports it in every process" in report
    assert "2 C extension(s) (_C_cutlass_90a.abi3.so, _C_mxfp8" in report and "0.15-0.3 s of CPU" in report
    cuda_torch = replace(cpu_torch, software=replace(cpu_torch.software, torch_cuda="12.8"))
    assert "transformers imports it in every process" not in doctor_report(cuda_torch, as_json=False)
