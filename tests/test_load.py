"""load() on this CPU, for real: tiny saved models, real transformers, no mocks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import cudaload
from cudaload import (
    AttentionUnavailableError,
    CudaloadWarning,
    LoadFailedError,
    Machine,
    from_pretrained_kwargs,
    load,
    tokenizer_for,
)

pytestmark = pytest.mark.slow

IDS = torch.tensor([[3, 17, 42, 9, 100, 7]])


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gpt2"])
def test_load_applies_the_plan_and_matches_a_bare_load(tiny_models, arch) -> None:
    model = load(str(tiny_models[arch]))
    applied = model.cudaload_plan
    # What the plan says was applied is what the model reports.
    assert (
        applied.attn_implementation == model.config._attn_implementation == applied.plan.kwargs["attn_implementation"]
    )
    assert applied.dtype == str(next(model.parameters()).dtype).removeprefix("torch.") == applied.plan.kwargs["dtype"]
    assert applied.device == str(model.device) == "cpu"
    assert applied.verified is True and applied.fallbacks == ()
    assert {"plan", "load", "verify"} <= set(applied.timings)

    bare = AutoModelForCausalLM.from_pretrained(tiny_models[arch], **from_pretrained_kwargs(applied.plan))
    with torch.inference_mode():
        ours, theirs = model(IDS).logits, bare(IDS).logits
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, theirs)


def test_the_cpu_dtype_is_measured_here_and_applied(tiny_models) -> None:
    model = load(str(tiny_models["qwen3"]))  # saved in bf16
    planned = model.cudaload_plan.plan.decision("dtype")
    assert "probed on this CPU" in planned.reason  # measured, not read off the checkpoint or ISA flags
    assert model.cudaload_plan.dtype == planned.value == str(model.dtype).removeprefix("torch.")


def test_a_failing_flash_attention_falls_back_and_says_why(tiny_models) -> None:
    # A machine that plans FlashAttention-2 while this one has no flash-attn and no GPU.
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    model = load(str(tiny_models["llama"]), machine=a100, device_map="cpu", dtype="bfloat16")
    applied = model.cudaload_plan
    assert [f.option for f in applied.fallbacks] == ["flash_attention_2"]
    # transformers fails it at load (package missing, Hub kernel not fetchable offline) or, once
    # a failed Hub-kernel fetch left it half-registered, at the first forward: both are caught.
    assert applied.fallbacks[0].phase in ("load", "verify") and applied.fallbacks[0].error
    assert applied.attn_implementation == model.config._attn_implementation == "sdpa"
    assert applied.plan.attention_chain == ("sdpa", "eager")
    # The plan as applied says what worked and why the planned choice was dropped.
    decision = applied.plan.decision("attn_implementation")
    assert decision.value == "sdpa" and "flash_attention_2" in decision.reason
    assert decision.rejected[0].value == "flash_attention_2" and "failed at" in decision.rejected[0].reason
    with torch.inference_mode():
        assert torch.isfinite(model(IDS).logits).all()


def test_a_cached_hub_kernel_online_without_network_falls_back_cleanly(tiny_models, monkeypatch) -> None:
    # kernels verifies a cached kernel's publisher on the Hub unless HF_HUB_OFFLINE is set; here the
    # network is refused (conftest), as on a machine without one and the variable unset.
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    a100 = Machine.simulated("A100", packages={"kernels": "0.17.2"}, cached_kernels=["kernels-community/flash-attn2"])
    plan = cudaload.plan(str(tiny_models["llama"]), machine=a100, device_map="cpu", dtype="bfloat16")
    assert plan.attention_chain[0] == "kernels-community/flash-attn2"
    assert "without network it fails" in plan.decision("attn_implementation").reason
    model = load(plan)
    applied = model.cudaload_plan
    # Every Hub-kernel link failed (the cached one at the trust check) and was recorded; SDPA took over.
    assert [f.option for f in applied.fallbacks] == list(plan.attention_chain[:-2])
    assert plan.attention_chain[-2:] == ("sdpa", "eager")
    assert applied.attn_implementation == "sdpa" and applied.verified is True


def test_strict_raises_naming_the_option_and_the_cause(tiny_models) -> None:
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    with pytest.raises(
        # without hub_kernels=True cudaload refuses the Hub kernel transformers would fetch for it here
        LoadFailedError,
        match=r"attn_implementation='flash_attention_2' failed at (load|verify): "
        r"(\w+Error|transformers would download)",
    ):
        load(str(tiny_models["llama"]), machine=a100, device_map="cpu", dtype="bfloat16", strict=True)


def test_an_uncached_hub_kernel_offline_falls_back(tiny_models) -> None:
    # The simulated machine believes the Hub kernel is cached; this one has no copy and is offline.
    machine = Machine.simulated(
        "L4", packages={"kernels": "0.17.2"}, offline=True, cached_kernels=["kernels-community/flash-attn2"]
    )
    model = load(str(tiny_models["qwen3"]), machine=machine, device_map="cpu")
    applied = model.cudaload_plan
    assert applied.fallbacks[0].option == "kernels-community/flash-attn2"
    assert applied.attn_implementation == "sdpa"


def _nan_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return out * float("nan"), weights


def test_a_kernel_giving_nan_is_caught_by_the_test_forward_and_switched_in_place(tiny_models) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register("nan_attention", _nan_attention)
    plan = cudaload.plan(str(tiny_models["qwen3"]))
    broken = replace(plan.with_attention("nan_attention"), attention_chain=("nan_attention", "sdpa", "eager"))
    model = load(broken)
    applied = model.cudaload_plan
    assert [(f.option, f.phase) for f in applied.fallbacks] == [("nan_attention", "verify")]
    assert "non-finite" in applied.fallbacks[0].error
    assert applied.attn_implementation == model.config._attn_implementation == "sdpa"
    assert set(applied.timings) == {"plan", "load", "verify"}  # loaded once: switched, not reloaded


def test_an_explicit_impossible_attention_raises(tiny_models) -> None:
    with pytest.raises(AttentionUnavailableError, match=r"flash_attention_2.*needs a CUDA GPU"):
        load(str(tiny_models["qwen3"]), attn_implementation="flash_attention_2")


def test_an_explicit_choice_is_honoured(tiny_models) -> None:
    model = load(str(tiny_models["llama"]), attn_implementation="eager", dtype="bfloat16")
    assert model.config._attn_implementation == "eager"
    assert next(model.parameters()).dtype == torch.bfloat16
    assert {"attn_implementation", "dtype"} <= model.cudaload_plan.plan.explicit


def test_offloading_warns_once_and_is_recorded(tiny_models, tmp_path: Path) -> None:
    path = str(tiny_models["gpt2"])
    kwargs = dict(device_map="auto", max_memory={"cpu": "40KB"}, offload_folder=str(tmp_path))
    with pytest.warns(CudaloadWarning, match="offloaded"):
        model = load(path, **kwargs)
    assert model.cudaload_plan.offloaded and "disk" in model.cudaload_plan.offloaded[0]
    assert model.cudaload_plan.verified is True


def test_remote_code_is_never_run_unless_asked(tiny_models, tmp_path: Path) -> None:
    import shutil

    repo = tmp_path / "with-remote-code"
    shutil.copytree(tiny_models["llama"], repo)
    marker = tmp_path / "remote-code-ran"
    (repo / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((repo / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (repo / "config.json").write_text(json.dumps(config))
    model = load(str(repo))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not marker.exists()
    assert "trust_remote_code" not in model.cudaload_plan.plan.kwargs


def test_tokenizer_for_generation_and_training(tiny_models) -> None:
    model = load(str(tiny_models["qwen3"]))
    tok = tokenizer_for(model)
    assert tok.padding_side == "left" and tok.pad_token == tok.eos_token == "<eos>"
    batch = tok(["w5 w6 w7", "w8"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (2, 6)
    assert tokenizer_for(model.cudaload_plan.plan, training=True).padding_side == "right"


def test_load_of_a_plan_takes_no_overrides(tiny_models) -> None:
    plan = cudaload.plan(str(tiny_models["qwen3"]))
    with pytest.raises(cudaload.SettingError, match="load\\(plan\\) was given dtype"):
        load(plan, dtype="float16")
    with pytest.raises(cudaload.SettingError, match="was given machine"):
        load(plan, machine=cudaload.Machine.simulated("H100"))
    with pytest.raises(cudaload.SettingError, match="was given model_class='AutoModel'"):
        load(plan, model_class="AutoModel")


def test_a_plan_loads_through_the_auto_class_it_was_planned_with(tiny_models) -> None:
    # An encoder plan needs no model_class repeated at load time.
    plan = cudaload.plan(str(tiny_models["llama"]), model_class="AutoModel")
    assert plan.auto_class == "AutoModel" and plan.model_class == "LlamaModel"
    model = load(plan, model_class="AutoModel")  # naming the same class is fine
    assert type(model).__name__ == "LlamaModel"
    assert type(load(plan)).__name__ == "LlamaModel"


def test_an_unknown_auto_class_is_a_model_config_error_for_a_path_and_a_plan(tiny_models) -> None:
    with pytest.raises(cudaload.ModelConfigError, match="no such Auto class"):
        load(str(tiny_models["llama"]), model_class="AutoModelForNothing")
    plan = replace(cudaload.plan(str(tiny_models["llama"])), auto_class="AutoModelForNothing")
    with pytest.raises(cudaload.ModelConfigError, match="no such Auto class"):
        load(plan)


def test_load_refuses_a_config_object() -> None:
    from transformers import LlamaConfig

    with pytest.raises(cudaload.ModelConfigError, match="local path, a Hub id or a Plan"):
        load(LlamaConfig())


def test_a_link_that_cannot_be_switched_to_is_skipped(tiny_models) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register("nan_attention", _nan_attention)
    plan = cudaload.plan(str(tiny_models["qwen3"]))
    chain = ("nan_attention", "flash_attention_2", "sdpa", "eager")  # FA2 cannot be set on a CPU model
    broken = replace(plan.with_attention("nan_attention"), attention_chain=chain)
    model = load(broken)
    applied = model.cudaload_plan
    assert [f.option for f in applied.fallbacks] == ["nan_attention", "flash_attention_2"]
    # In a fresh process transformers refuses to set FA2 ("switch"); once an earlier failed Hub-kernel
    # fetch has half-registered it, setting works and the test forward fails ("verify"). Both are caught.
    assert applied.fallbacks[1].phase in ("switch", "verify")
    assert applied.attn_implementation == model.config._attn_implementation == "sdpa"


def test_other_auto_classes_load_through_the_same_plan(tiny_models) -> None:
    # A classification head is not in a causal-LM checkpoint: loading one is asked for, never silent.
    with pytest.raises(cudaload.LoadFailedError, match=r"lacks 1 of the model's weights.*score\.weight"):
        load(str(tiny_models["llama"]), model_class="AutoModelForSequenceClassification")
    with pytest.warns(cudaload.CudaloadWarning, match="initialized at random"):
        model = load(
            str(tiny_models["llama"]), model_class="AutoModelForSequenceClassification", allow_missing_weights=True
        )
    assert type(model).__name__ == "LlamaForSequenceClassification"
    assert model.cudaload_plan.missing_weights == ("score.weight",)
    assert model.cudaload_plan.verified is True
    assert model.cudaload_plan.attn_implementation == model.config._attn_implementation
    with pytest.raises(cudaload.ModelConfigError, match="model_class='AutoNothing': transformers has no such"):
        load(str(tiny_models["llama"]), model_class="AutoNothing")


def test_tokenizer_for_a_model_without_one_says_what_to_do(tiny_models, tmp_path: Path) -> None:
    import shutil

    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_models["llama"] / name, bare / name)
    with pytest.raises(cudaload.ModelConfigError, match="Save one next to the model"):
        tokenizer_for(cudaload.plan(str(bare)))


def test_lora_without_finetune_is_refused(tiny_models) -> None:
    with pytest.raises(cudaload.FinetuneConfigError, match="pass finetune=True"):
        cudaload.plan(str(tiny_models["llama"]), lora={"r": 4})
