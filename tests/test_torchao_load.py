"""torchao int8 weight-only loaded for real on this CPU: `TorchAoConfig(Int8WeightOnlyConfig())` on
device_map="cpu", LoRA through peft's TorchaoLoraLinear, finite gradients, and a read-back that does not warn.

CI installs torchao (the `torchao` extra, pinned in constraints/tested.txt) after the main suite, on both
dependency sets, and runs this file then (.ci/run): installed, transformers imports it in every process and the
docs' outputs would list it. Without torchao the module skips at import, as tests/test_hub_traffic.py does for
bitsandbytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("torchao")

from cudaload import load_for_finetune


def test_int8_weight_only_loads_and_trains_lora_on_a_cpu(tiny_models: dict[str, Path]) -> None:
    from peft.tuners.lora.torchao import TorchaoLoraLinear
    from torchao.quantization import Int8Tensor

    # The suite turns warnings into errors: a read-back difference (CudaloadWarning) would fail this load.
    model = load_for_finetune(str(tiny_models["qwen3"]), quantize="torchao-int8", dtype="bfloat16")
    plan = model.cudaload_plan.plan
    assert plan.decision("quantize").value == "torchao-int8" and plan.kwargs["device_map"] == "cpu"
    base = model.get_base_model()
    q_proj = base.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, TorchaoLoraLinear)
    weight = q_proj.get_base_layer().weight
    assert isinstance(weight, Int8Tensor) and weight.qdata.dtype == torch.int8
    assert weight.scale.dtype == torch.float32 and weight.scale.shape == (weight.qdata.shape[0], 1)  # row_scale_bytes

    ids = torch.randint(0, base.config.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for name, p in model.named_parameters() if p.requires_grad]
    assert grads and all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads if g is not None)
