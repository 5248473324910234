"""Checks that need a CUDA GPU: `nox -s gpu` (or `pytest -m gpu`) on a GPU machine.

Deselected by default (`-m "not gpu"` in the pytest config)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cudaload

pytestmark = pytest.mark.gpu


def test_nvml_detection_agrees_with_torch_and_starts_no_cuda() -> None:
    code = (
        "import torch, cudaload\n"
        "m = cudaload.detect()\n"
        "assert not torch.cuda.is_initialized(), 'detect() started CUDA'\n"
        "print(m.source, len(m.gpus))\n"
        "for g in m.gpus:\n"
        "    p = torch.cuda.get_device_properties(g.index)\n"
        "    assert (p.major, p.minor) == g.capability, (g, p)\n"
        "    assert p.name == g.name, (g.name, p.name)\n"
        "assert len(m.gpus) == torch.cuda.device_count()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nvml")


def test_load_on_the_gpu_applies_the_plan(tiny_models) -> None:
    import torch

    model = cudaload.load(str(tiny_models["qwen3"]))
    applied = model.cudaload_plan
    gpu = cudaload.detect().weakest_gpu
    assert gpu is not None
    assert applied.device.startswith("cuda")
    assert applied.dtype == ("bfloat16" if gpu.capability >= (8, 0) else "float16")
    assert applied.attn_implementation == model.config._attn_implementation
    with torch.inference_mode():
        logits = model(torch.tensor([[1, 2, 3, 4]], device=model.device)).logits
    assert torch.isfinite(logits).all()


def test_qlora_on_the_gpu(tiny_models) -> None:
    model = cudaload.load_for_finetune(str(tiny_models["qwen3"]), quantize="4bit")
    args = cudaload.training_arguments(model)
    assert args["optim"] == "paged_adamw_8bit"
    gpu = cudaload.detect().weakest_gpu
    assert gpu is not None
    # The compute dtype is the plan's 16-bit dtype for this GPU, not only "not float32".
    expected = "bfloat16" if gpu.capability >= (8, 0) else "float16"
    assert model.cudaload_plan.plan.kwargs["quantization_config"]["bnb_4bit_compute_dtype"] == expected
