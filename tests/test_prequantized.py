"""Already-quantized checkpoints (issue 21, item 1): sized as transformers stores them on the
machine planned for, never quantized again.

Config-only folders with real model shapes (gpt-oss-120b/20b, Llama-3-8B) planned on simulated
machines. Every expected size is computed here by hand from the shapes and upstream's storage rules
(transformers 5.22.2 quantizers; see docs/decisions.md, "Already-quantized checkpoints"), not by
calling cudaload's sizing.

The rules are those of cudaload.policy.checkpoint_quantization, reached through plan(): naming the module here
makes tools/mutate.py run this file for that module's mutants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import Machine, MissingPackageError, QuantizationError

GiB = 2**30
MXFP4_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
MXFP4_OK = {"triton": "3.4.0", "kernels": "0.17.2"}  # transformers 5.22.2 accepts kernels [0.17.2, 0.18.0)
BNB = {"bitsandbytes": "0.50.2"}
GPTQ_PACKAGES = {"optimum": "1.24.0", "gptqmodel": "1.4.3"}


# --- hand counts ----------------------------------------------------------------------------------


def gpt_oss_counts(layers: int, experts: int) -> tuple[int, int]:
    """(expert weights MXFP4 quantizes, every other parameter) of a gpt-oss shape: hidden 2880,
    expert width 2880, vocab 201088, 64 heads of 64, 8 key/value heads, untied embeddings."""
    h, inter, vocab, heads, kv, hd = 2880, 2880, 201_088, 64, 8, 64
    expert_weights = layers * experts * (h * 2 * inter + inter * h)  # gate_up_proj + down_proj
    attention = h * heads * hd + heads * hd + 2 * (h * kv * hd + kv * hd) + heads * hd * h + h + heads  # + sinks
    router = experts * h + experts
    expert_biases = experts * 2 * inter + experts * h
    rest = layers * (attention + router + expert_biases + 2 * h) + h + 2 * vocab * h
    return expert_weights, rest


def llama8b_counts() -> tuple[int, int, int]:
    """(linear weights, their output rows, every other parameter) of Llama-3-8B."""
    h, inter, kv, layers, vocab = 4096, 14336, 1024, 32, 128_256
    linear = layers * (h * h + 2 * h * kv + h * h + 3 * h * inter)
    rows = layers * (h + 2 * kv + h + 2 * inter + h)
    rest = 2 * vocab * h + layers * 2 * h + h
    return linear, rows, rest


# --- config-only folders --------------------------------------------------------------------------


def _gpt_oss(path: Path, layers: int, experts: int, quant: dict[str, Any] | None = MXFP4_CONFIG) -> str:
    from transformers import GptOssConfig

    extra = {"quantization_config": quant} if quant is not None else {}
    GptOssConfig(
        num_hidden_layers=layers,
        num_local_experts=experts,
        hidden_size=2880,
        intermediate_size=2880,
        vocab_size=201_088,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        experts_per_token=4,
        dtype="bfloat16",
        **extra,
    ).save_pretrained(path)
    return str(path)


def _llama8b(path: Path, quant: dict[str, Any]) -> str:
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128_256,
        max_position_embeddings=8192,
        dtype="bfloat16",
        quantization_config=quant,
    ).save_pretrained(path)
    return str(path)


BNB_4BIT = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("prequantized")
    return {
        "gpt-oss-120b": _gpt_oss(root / "gpt-oss-120b", 36, 128),
        "gpt-oss-20b": _gpt_oss(root / "gpt-oss-20b", 24, 32),
        "llama-bnb-4bit": _llama8b(root / "llama-bnb-4bit", BNB_4BIT),
        "llama-bnb-4bit-single": _llama8b(
            root / "llama-bnb-4bit-single",
            {**BNB_4BIT, "bnb_4bit_use_double_quant": False, "bnb_4bit_quant_type": "fp4"},
        ),
        "llama-bnb-8bit": _llama8b(root / "llama-bnb-8bit", {"quant_method": "bitsandbytes", "load_in_8bit": True}),
        "llama-bnb-skip": _llama8b(root / "llama-bnb-skip", {**BNB_4BIT, "llm_int8_skip_modules": ["down_proj"]}),
        "llama-gptq": _llama8b(
            root / "llama-gptq", {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
        ),
        "llama-awq": _llama8b(
            root / "llama-awq", {"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "gemm"}
        ),
        "llama-fp8": _llama8b(
            root / "llama-fp8", {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
        ),
        "llama-ct-int4": _llama8b(
            root / "llama-ct-int4",
            {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {
                    "group_0": {
                        "targets": ["Linear"],
                        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
                    }
                },
                "ignore": ["lm_head"],
            },
        ),
        "llama-ct-fp8": _llama8b(
            root / "llama-ct-fp8",
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "use_optimized_inference": True,
                "config_groups": {
                    "group_0": {
                        "targets": ["Linear"],
                        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    }
                },
                "ignore": ["lm_head"],
            },
        ),
    }


def plan(folders: dict[str, str], name: str, machine: Machine, **kwargs: Any) -> cudaload.Plan:
    return cudaload.plan(folders[name], machine=machine, **kwargs)


# --- MXFP4 (gpt-oss) --------------------------------------------------------------------------------


def test_gpt_oss_120b_stays_mxfp4_on_an_h100_with_triton_and_kernels(folders) -> None:
    experts, rest = gpt_oss_counts(36, 128)
    # 16 uint8 of packed fp4 + one uint8 scale per 32 values: 4.25 bits; the rest in bf16.
    expected = experts * 17 // 32 + rest * 2
    result = plan(folders, "gpt-oss-120b", Machine.simulated("H100", packages=MXFP4_OK))
    assert result.weight_bytes == expected
    assert 60 * GiB < expected < 62 * GiB  # "about 61 GiB", as the issue says
    assert result.kwargs["device_map"] == "cuda:0"
    assert "quantization_config" not in result.kwargs
    assert result.decision("checkpoint_quantization").value == "mxfp4"
    assert not any("offload" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("packages", "gpu", "why"),
    [
        ({}, "H100", "triton is not installed"),
        ({"triton": "3.3.1", "kernels": "0.17.2"}, "H100", "triton 3.3.1 is older than 3.4.0"),
        ({"triton": "3.4.0"}, "H100", "`kernels` package is not installed"),
        ({"triton": "3.4.0", "kernels": "0.19.1"}, "H100", "accepts only [0.17.2, 0.18.0)"),
        (MXFP4_OK, "V100", "compute capability >= 7.5"),
    ],
)
def test_gpt_oss_120b_is_sized_dequantized_where_transformers_dequantizes(folders, packages, gpu, why) -> None:
    experts, rest = gpt_oss_counts(36, 128)
    result = plan(folders, "gpt-oss-120b", Machine.simulated(gpu, packages=packages))
    assert result.weight_bytes == (experts + rest) * 2  # dequantized to bf16, like everything else
    decision = result.decision("checkpoint_quantization")
    assert decision.value == "dequantized"
    assert why in decision.reason and "bfloat16" in decision.reason
    assert any("dequantized to bfloat16" in w for w in result.warnings)


def test_mxfp4_kept_on_a_t4_sm75(folders) -> None:
    result = plan(folders, "gpt-oss-20b", Machine.simulated("T4", packages=MXFP4_OK))
    assert result.decision("checkpoint_quantization").value == "mxfp4"


def test_use_kernels_dequantizes_mxfp4_on_cuda_before_transformers_5_25(folders) -> None:
    experts, rest = gpt_oss_counts(24, 32)
    old = plan(folders, "gpt-oss-20b", Machine.simulated("H100", packages=MXFP4_OK), use_kernels=True)
    assert old.decision("checkpoint_quantization").value == "dequantized"
    assert "use_kernels=True" in old.decision("checkpoint_quantization").reason
    assert old.weight_bytes == (experts + rest) * 2
    new_packages = {"transformers": "5.25.0", "triton": "3.4.0", "kernels": "0.19.1"}
    new = plan(folders, "gpt-oss-20b", Machine.simulated("H100", packages=new_packages), use_kernels=True)
    assert new.decision("checkpoint_quantization").value == "mxfp4"
    assert new.weight_bytes == experts * 17 // 32 + rest * 2


def test_mxfp4_on_a_cpu(folders) -> None:
    cpu = {"triton": "3.5.0", "kernels": "0.17.2"}
    old = plan(folders, "gpt-oss-20b", Machine.simulated(packages=cpu, cpu_memory_gib=256))
    assert old.decision("checkpoint_quantization").value == "dequantized"  # 5.22 needs use_kernels on CPU
    assert "use_kernels=True" in old.decision("checkpoint_quantization").reason
    # ... which 5.22 accepts on a CPU (a CPU megablocks kernel): then it stays MXFP4.
    kept = plan(folders, "gpt-oss-20b", Machine.simulated(packages=cpu, cpu_memory_gib=256), use_kernels=True)
    assert kept.decision("checkpoint_quantization").value == "mxfp4"
    new = {"transformers": "5.25.0", "triton": "3.5.0", "kernels": "0.19.1"}
    assert plan(folders, "gpt-oss-20b", Machine.simulated(packages=new)).decision("checkpoint_quantization").value == (
        "mxfp4"
    )
    too_old = {"transformers": "5.25.0", "triton": "3.4.0", "kernels": "0.19.1"}
    reason = (
        plan(folders, "gpt-oss-20b", Machine.simulated(packages=too_old)).decision("checkpoint_quantization").reason
    )
    assert "triton >= 3.5.0" in reason


def test_gpt_oss_20b_on_an_l4_generates_from_the_gpu(folders) -> None:
    experts, rest = gpt_oss_counts(24, 32)
    kept = plan(folders, "gpt-oss-20b", Machine.simulated("L4", packages=MXFP4_OK), generate=True)
    assert kept.weight_bytes == experts * 17 // 32 + rest * 2
    assert kept.kwargs["device_map"] == "cuda:0"
    assert kept.generation is not None and kept.generation.max_batch is not None and kept.generation.max_batch > 0
    assert kept.generation.decision("generation.cache_implementation").value != "offloaded"
    # Without triton transformers dequantizes: ~39 GiB cannot fit 22 GiB, and the plan says why.
    dequantized = plan(folders, "gpt-oss-20b", Machine.simulated("L4"), generate=True)
    assert dequantized.weight_bytes == (experts + rest) * 2
    assert "triton" in dequantized.decision("checkpoint_quantization").reason


def test_a_config_asking_to_dequantize_is_sized_dequantized(tmp_path: Path) -> None:
    path = _gpt_oss(tmp_path / "deq", 2, 4, {**MXFP4_CONFIG, "dequantize": True})
    experts, rest = gpt_oss_counts(2, 4)
    result = cudaload.plan(path, machine=Machine.simulated("H100", packages=MXFP4_OK))
    assert result.weight_bytes == (experts + rest) * 2
    assert "dequantize=True" in result.decision("checkpoint_quantization").reason


def test_an_unquantized_model_has_no_checkpoint_decision(tmp_path: Path) -> None:
    path = _gpt_oss(tmp_path / "bf16", 2, 4, None)
    result = cudaload.plan(path, machine=Machine.simulated("H100", packages=MXFP4_OK))
    assert cudaload.read_model_facts(path).quantization is None
    assert "checkpoint_quantization" not in {d.setting for d in result.decisions}
    assert result.weight_bytes == sum(gpt_oss_counts(2, 4)) * 2


def test_mxfp4_cannot_be_fine_tuned_quantized(folders) -> None:
    with pytest.raises(QuantizationError, match=r"is_trainable is False.*dequantize=True"):
        plan(folders, "gpt-oss-20b", Machine.simulated("H100", packages={**MXFP4_OK, **BNB}), finetune=True)


# --- bitsandbytes ---------------------------------------------------------------------------------


def test_llama_bnb_4bit_is_sized_as_stored(folders) -> None:
    linear, _, rest = llama8b_counts()
    # nf4: 4 bits; absmax per 64 as uint8 (8/64); an fp32 per 256 of those blocks (32/16384).
    expected = int(linear * (4 + 8 / 64 + 32 / 16384) / 8) + rest * 2
    result = plan(folders, "llama-bnb-4bit", Machine.simulated("H100", packages=BNB))
    assert result.weight_bytes == expected
    assert expected < 6 * GiB  # not the 15 GiB of a 16-bit Llama-3-8B
    assert "quantization_config" not in result.kwargs
    facts = cudaload.read_model_facts(folders["llama-bnb-4bit"])
    assert facts.quantization is not None and facts.quantization.quantized_parameters == linear
    assert facts.quantization.compute_dtype == "bfloat16"


def test_bnb_variants_bits(folders) -> None:
    linear, _, rest = llama8b_counts()
    machine = Machine.simulated("H100", packages=BNB)
    single = plan(folders, "llama-bnb-4bit-single", machine)
    assert single.weight_bytes == int(linear * (4 + 32 / 64) / 8) + rest * 2  # an fp32 absmax per 64
    eight = plan(folders, "llama-bnb-8bit", machine)
    assert eight.weight_bytes == linear + rest * 2  # quantizer_bnb_8bit.py: 1 byte per weight


def test_skip_modules_stay_in_the_dtype(folders) -> None:
    linear, _, rest = llama8b_counts()
    down = 32 * 14336 * 4096
    facts = cudaload.read_model_facts(folders["llama-bnb-skip"])
    assert facts.quantization is not None and facts.quantization.quantized_parameters == linear - down
    result = plan(folders, "llama-bnb-skip", Machine.simulated("H100", packages=BNB))
    assert result.weight_bytes == int((linear - down) * (4 + 8 / 64 + 32 / 16384) / 8) + (rest + down) * 2


def test_finetune_auto_uses_the_checkpoints_own_quantization(folders) -> None:
    linear, _, rest = llama8b_counts()
    result = plan(folders, "llama-bnb-4bit", Machine.simulated("A10G", packages=BNB), finetune=True)
    quantize = result.decision("quantize")
    assert quantize.value == "checkpoint" and "already bitsandbytes 4-bit" in quantize.reason
    assert "quantization_config" not in result.kwargs
    assert result.finetune is not None
    assert result.finetune.memory_estimate["checkpoint"]["weights"] == int(linear * (4 + 8 / 64 + 32 / 16384) / 8) + (
        rest * 2
    )
    assert result.finetune.training_arguments["optim"] == "paged_adamw_8bit"


@pytest.mark.parametrize("asked", ["4bit", "8bit"])
def test_quantize_stacked_on_a_quantized_checkpoint_raises(folders, asked) -> None:
    with pytest.raises(QuantizationError) as error:
        plan(folders, "llama-bnb-4bit", Machine.simulated("A100", packages=BNB), finetune=True, quantize=asked)
    message = str(error.value)
    assert f"quantize={asked!r} was asked" in message  # what was asked
    assert "already quantized (bitsandbytes)" in message and "nf4" in message  # what was found
    assert "quantize='auto'" in message  # what to do


@pytest.mark.parametrize(
    ("packages", "why"),
    [
        ({}, "bitsandbytes is not installed (pip install bitsandbytes)"),
        (
            {"bitsandbytes": "0.46.0"},
            "bitsandbytes 0.46.0 is older than 0.46.1, the oldest transformers accepts "
            "(pip install 'bitsandbytes>=0.46.1')",
        ),
    ],
)
def test_load_for_finetune_on_a_bnb_checkpoint_gives_the_4bit_on_cpu_error(folders, packages, why) -> None:
    # Today's error for quantize='4bit' on this CPU machine ends "... was asked, but <why>.": the same
    # reason, said about the checkpoint, instead of "already quantized" for the default quantize='auto'.
    with pytest.raises(MissingPackageError) as error:
        cudaload.load_for_finetune(folders["llama-bnb-4bit"], machine=Machine.simulated(packages=packages))
    message = str(error.value)
    assert "is a bitsandbytes 4-bit (nf4, double quant) checkpoint" in message
    assert message.endswith(f"but {why}.")


# --- GPTQ, AWQ, FP8, compressed-tensors ---------------------------------------------------------------


def test_gptq_and_awq_sized_with_their_groups(folders) -> None:
    linear, _, rest = llama8b_counts()
    machine = Machine.simulated("A100", packages=GPTQ_PACKAGES)
    gptq = plan(folders, "llama-gptq", machine)
    # int32-packed 4-bit weights, one fp16 scale and one packed 4-bit zero per 128 inputs.
    assert gptq.weight_bytes == int(linear * (4 + (16 + 4) / 128) / 8) + rest * 2
    assert not any("from_pretrained will raise" in w for w in gptq.warnings)
    awq = plan(folders, "llama-awq", machine)  # old AutoAWQ keys: w_bit, q_group_size
    assert awq.weight_bytes == int(linear * (4 + (16 + 4) / 64) / 8) + rest * 2


def test_gptq_without_its_packages_warns(folders) -> None:
    result = plan(folders, "llama-gptq", Machine.simulated("A100"))
    assert any("optimum is not installed" in w and "gptqmodel is not installed" in w for w in result.warnings)


def test_fp8_needs_sm89_else_bf16(folders) -> None:
    linear, _, rest = llama8b_counts()
    kept = plan(folders, "llama-fp8", Machine.simulated("H100"))
    assert kept.decision("checkpoint_quantization").value == "fp8"
    assert kept.weight_bytes == int(linear * (8 + 32 / (128 * 128)) / 8) + rest * 2
    ampere = plan(folders, "llama-fp8", Machine.simulated("A100"))
    assert ampere.decision("checkpoint_quantization").value == "dequantized"
    assert "8.9" in ampere.decision("checkpoint_quantization").reason
    assert ampere.weight_bytes == (linear + rest) * 2


def test_compressed_tensors(folders) -> None:
    linear, _, rest = llama8b_counts()
    machine = Machine.simulated("H100", packages={"compressed-tensors": "0.15.0"})
    int4 = plan(folders, "llama-ct-int4", machine)
    # Decompressed on the first forward (no FP8 kernel path): the 16-bit size is the one that counts.
    assert int4.weight_bytes == (linear + rest) * 2
    assert "first forward" in int4.decision("checkpoint_quantization").reason
    fp8 = plan(folders, "llama-ct-fp8", machine)
    assert fp8.decision("checkpoint_quantization").value == "compressed-tensors"
    assert fp8.weight_bytes == linear + rest * 2


def test_facts_cache_round_trip_keeps_the_quantization(folders) -> None:
    first = cudaload.read_model_facts(folders["llama-gptq"])
    again = cudaload.read_model_facts(folders["llama-gptq"])
    assert again == first and again.quantization is not None and again.quantization.label == "GPTQ 4-bit (g128)"


def test_generate_compiles_an_fp8_checkpoint_but_not_a_bitsandbytes_one(folders) -> None:
    # _valid_auto_compile_criteria refuses a model whose quantizer is not compileable: FineGrainedFP8's
    # is (quantizer_finegrained_fp8.py), bitsandbytes' is not (base.py's False).
    h100 = Machine.simulated("H100")
    fp8 = plan(folders, "llama-fp8", h100, generate=True, workload="decode-heavy")
    bnb = plan(folders, "llama-bnb-4bit", h100, generate=True, workload="decode-heavy")
    assert fp8.generation is not None and bnb.generation is not None
    assert fp8.generation.compile is True
    assert bnb.generation.compile is False
    cache = bnb.generation.decision("generation.cache_implementation")
    assert cache.value == "dynamic"
    assert "bitsandbytes-quantized models are not compileable" in cache.rejected[0].reason


def test_mixed_gpus_judge_mxfp4_on_the_gpu_the_model_goes_on(folders) -> None:
    # V100 (sm70) + H100: the model goes on the H100 (most memory), which keeps MXFP4 (sm75+); the
    # V100 alone would make transformers dequantize (quantizer_mxfp4.py).
    alone = plan(folders, "gpt-oss-20b", Machine.simulated("V100", packages=MXFP4_OK))
    assert alone.decision("checkpoint_quantization").value == "dequantized"
    mixed = plan(folders, "gpt-oss-20b", Machine.simulated(["V100", "H100"], packages=MXFP4_OK))
    assert mixed.kwargs["device_map"] == "cuda:1"
    assert mixed.decision("checkpoint_quantization").value == "mxfp4"
