from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudaload import ModelConfigError, RemoteCodeError, read_model_facts


@pytest.mark.parametrize(
    ("arch", "model_class", "ckpt", "linear"),
    [
        (
            "qwen3",
            "Qwen3ForCausalLM",
            "bfloat16",
            {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
        ),
        (
            "llama",
            "LlamaForCausalLM",
            "float32",
            {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
        ),
        ("gpt2", "GPT2LMHeadModel", "float16", {"c_attn", "c_proj", "c_fc"}),
    ],
)
def test_facts_from_saved_tiny_models(tiny_models, arch, model_class, ckpt, linear) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    facts = read_model_facts(str(tiny_models[arch]))
    assert facts.model_class == model_class
    assert facts.checkpoint_dtype == ckpt
    assert facts.supports_sdpa and facts.supports_flash
    assert set(facts.linear_names) == linear
    real = AutoModelForCausalLM.from_pretrained(tiny_models[arch], dtype=torch.float32)
    assert facts.parameters == sum(p.numel() for p in real.parameters())
    assert facts.head_dim == 16 and facts.num_layers == 2


def test_a_config_object_works_too() -> None:
    from transformers import Gemma2Config

    facts = read_model_facts(
        Gemma2Config(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        )
    )
    assert facts.model_type == "gemma2" and facts.fp16_fragile and facts.softcap == 50.0


def test_missing_path_offline_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="Pass a local path"):
        read_model_facts("someone/not-downloaded-model")
    with pytest.raises(ModelConfigError):
        read_model_facts(str(tmp_path / "nothing-here"))


def test_remote_code_is_never_enabled_for_you(tmp_path: Path) -> None:
    config = {
        "model_type": "my_custom_lm",
        "auto_map": {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "configuration_x.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(RemoteCodeError, match="trust_remote_code=True"):
        read_model_facts(str(tmp_path))


def test_head_dims_and_redirected_flash_implementations_are_read_from_upstream() -> None:
    from transformers import DeepseekV3Config, GptOssConfig, GptOssForCausalLM

    gpt_oss = read_model_facts(
        GptOssConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            num_local_experts=2,
        )
    )
    # Held against the installed class: transformers replaces any other FA request with these.
    assert gpt_oss.compatible_flash == tuple(GptOssForCausalLM._compatible_flash_implementations)
    assert gpt_oss.head_dims == (16,)
    mla = read_model_facts(
        DeepseekV3Config(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=32,
            moe_intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            n_routed_experts=2,
            num_experts_per_tok=1,
            first_k_dense_replace=1,
            q_lora_rank=None,
            kv_lora_rank=16,
        )
    )
    assert mla.qk_v_head_dims == (192, 128) and 192 in mla.head_dims and 128 in mla.head_dims
    assert mla.compatible_flash is None


def test_without_a_config_dtype_the_weights_say(tiny_models, tmp_path: Path) -> None:
    # transformers' dtype="auto" reads the weights when the config has no dtype; so does cudaload,
    # from the safetensors header.
    import shutil

    from cudaload import Machine, ModelConfigError, plan

    folder = tmp_path / "model"
    shutil.copytree(tiny_models["qwen3"], folder)  # saved in bf16
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (folder / "config.json").write_text(json.dumps(config))
    assert read_model_facts(str(folder)).checkpoint_dtype == "bfloat16"
    a100 = Machine.simulated("A100")
    assert plan(str(folder), machine=a100, dtype="auto").dtype == "bfloat16"  # the checkpoint's, not fp32
    assert plan(str(folder), machine=a100, finetune=True, quantize=None).dtype == "bfloat16"
    # A config.json that transformers itself cannot build is a config error that says what to fix.
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "auto"}))
    with pytest.raises(ModelConfigError, match=r"could not build the config .* Fix that value in config\.json"):
        read_model_facts(str(folder))


def test_custom_code_models_plan_and_load_when_trusted(tiny_models, tmp_path: Path) -> None:
    import shutil

    import cudaload

    folder = tmp_path / "custom"
    shutil.copytree(tiny_models["llama"], folder)
    (folder / "configuration_tiny.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass TinyConfig(LlamaConfig):\n    model_type = 'tiny_custom'\n"
    )
    (folder / "modeling_tiny.py").write_text(
        "from transformers import LlamaForCausalLM\n\nfrom .configuration_tiny import TinyConfig\n\n\n"
        "class TinyForCausalLM(LlamaForCausalLM):\n    config_class = TinyConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config |= {
        "model_type": "tiny_custom",
        "architectures": ["TinyForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_tiny.TinyConfig",
            "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM",
        },
    }
    (folder / "config.json").write_text(json.dumps(config))

    with pytest.raises(RemoteCodeError, match="trust_remote_code=True"):
        cudaload.plan(str(folder), machine=cudaload.Machine.simulated(None))
    planned = cudaload.plan(str(folder), machine=cudaload.Machine.simulated(None), trust_remote_code=True)
    assert planned.extras["model_class"] == "TinyForCausalLM" and planned.kwargs["trust_remote_code"] is True
    model = cudaload.load(planned)
    assert type(model).__name__ == "TinyForCausalLM" and model.cudaload_plan.verified is True
