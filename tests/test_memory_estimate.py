"""The training-memory estimate, term by term, and one LoRA step measured on this CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from cudaload.facts.model import ModelFacts, any_model
from cudaload.policy.memory import (
    CUDA_OVERHEAD,
    estimate_training_memory,
    layer_bytes_per_token,
    logits_bytes_per_element,
    lora_parameters,
    lora_tensor_bytes,
    planned_optimizer,
    weight_bytes,
)
from model_shapes import PROJ, llama

GiB = 2**30


def llama2_7b() -> ModelFacts:
    """Llama-2-7B: multi-head attention (kv 4096), MLP 11008, vocabulary 32000."""
    return llama(8, vocab=32000, inter=11008, kv=4096)


def estimate(model: ModelFacts, **kw):
    args = {"dtype": "bfloat16", "quantize": None, "r": 16, "targets": PROJ, "seq_len": 2048} | kw
    return estimate_training_memory(model, **args)


# --- the logits term ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "kept", "expected"),
    [
        # forward: d (logits) + 4 (logits.float(), a copy when d < 4) + 4 (log_softmax's output);
        # backward: 4 (saved log-probs) + 4 (their gradient) + 4 (the fp32 logits' gradient),
        # + d when the caller keeps the outputs (and so the logits) through backward().
        ("bfloat16", False, max(2 + 4 + 4, 12)),
        ("float16", False, 12),
        ("float32", False, max(4 + 0 + 4, 12)),
        ("bfloat16", True, 12 + 2),
        ("float32", True, 12 + 4),
    ],
)
def test_logits_bytes_per_element(dtype, kept, expected) -> None:
    assert logits_bytes_per_element(dtype, outputs_kept=kept) == expected
    if dtype != "float32":
        assert 10 <= logits_bytes_per_element(dtype, outputs_kept=kept) <= 14  # the issue's ~10-14·s·V


@pytest.mark.parametrize(("vocab", "tokens"), [(32000, 512), (128256, 2048), (151936, 4096), (262144, 8192)])
def test_logits_term_scales_with_vocab_and_tokens(vocab, tokens) -> None:
    # Without checkpointing the activations are layers x layer + logits: the logits' share is exactly
    # the difference between two vocabularies, and linear in the tokens.
    def activations(v: int, s: int) -> int:
        return estimate(llama(8, vocab=v), seq_len=s, checkpointing=False).activations

    term = activations(vocab, tokens) - activations(0, tokens)
    assert term == 12 * tokens * vocab  # bf16 logits: 12 bytes per element, see test_logits_bytes_per_element
    assert 10 * tokens * vocab <= term <= 14 * tokens * vocab
    assert activations(vocab, 2 * tokens) - activations(0, 2 * tokens) == 2 * term
    assert activations(2 * vocab, tokens) - activations(0, tokens) == 2 * term


# --- the whole estimate, derived here term by term ------------------------------------------------


def _lora_parameters_8b() -> int:
    # r x (fan_in + fan_out) per wrapped layer: q 4096+4096, k/v 4096+1024, o 4096+4096, gate/up
    # 4096+14336, down 14336+4096 -> 81920 per layer, x r=16 x 32 layers.
    return 16 * 81920 * 32


def test_lora_parameter_count() -> None:
    assert lora_parameters(llama(8), 16, PROJ) == _lora_parameters_8b() == 41_943_040


def test_llama3_8b_16bit_at_2048_is_about_20_gib() -> None:
    model = llama(8)
    tokens, vocab, hidden, layers = 2048, 128256, 4096, 32
    weights = model.parameters * 2  # bf16
    lora = _lora_parameters_8b() * (4 + 4 + 8)  # fp32 weight + grad + AdamW's two fp32 states
    kept = layers * tokens * hidden * 2  # each checkpointed layer's bf16 input
    logits = 12 * tokens * vocab  # the loss's peak, see test_logits_bytes_per_element
    # One recomputed layer: 2 fp32 norms + attention q/k/v/out + SwiGLU + each adapter's mask and input.
    layer = tokens * (8 * hidden + 4 * 2 * 4096 + 3 * 2 * 14336 + (1 + 2) * (6 * 4096 + 14336))
    assert layer < logits  # so the layer is recomputed after the logits' buffers are gone
    derived = weights + lora + kept + logits + CUDA_OVERHEAD
    got = estimate(model)
    assert got.total == pytest.approx(derived, rel=0.01)
    assert 19.5 * GiB < got.total < 20.6 * GiB  # was 18.3 GiB with 4·s·V for the logits
    assert got.lora == lora
    assert got.activations == kept + logits
    assert got.weights == weights


def test_llama3_8b_qlora_at_2048() -> None:
    model = llama(8)
    linear = model.linear_parameters
    weights = linear * 4.127 / 8 + (model.parameters - linear) * 2  # nf4 + double quant; the rest in bf16
    lora = _lora_parameters_8b() * (4 + 4 + 2 + 8 / 256)  # paged 8-bit AdamW: 2 uint8 states + absmax/256
    activations = 32 * 2048 * 4096 * 2 + 12 * 2048 * 128256
    derived = weights + lora + activations + CUDA_OVERHEAD
    got = estimate(model, quantize="4bit")
    assert got.total == pytest.approx(derived, rel=0.01)
    assert 10e9 < got.total < 11.5e9  # the issue: published QLoRA figures put it near 10-11 GB (was 8.7 GiB)
    assert got.weights == pytest.approx(weights, rel=1e-3)


@pytest.mark.parametrize(("tokens", "reported_gb"), [(2048, 7.0), (4096, 9.0)])
def test_llama2_7b_qlora_matches_reported_figures(tokens, reported_gb) -> None:
    # Figures quoted in the issue (QLoRA, Llama-2-7B, vocabulary 32000): ~7 GB at 2048, ~9 GB at 4096.
    got = estimate(llama2_7b(), quantize="4bit", seq_len=tokens)
    assert got.total == pytest.approx(reported_gb * 1e9, rel=0.15)


# --- optimizer state -------------------------------------------------------------------------------


@pytest.mark.parametrize("numel", [4096, 65536, 229376, 16 * 14336])
def test_8bit_optimizer_state_is_smaller_than_fp32_adamw(numel) -> None:
    eight, fp32 = lora_tensor_bytes(numel, "paged_adamw_8bit"), lora_tensor_bytes(numel, "adamw_torch")
    assert fp32 == 16 * numel
    assert eight < fp32
    assert eight / numel == pytest.approx(10, abs=0.05)  # 4 + 4 + 2 + 8/256


def test_8bit_optimizer_keeps_small_tensors_in_fp32() -> None:
    # bitsandbytes' min_8bit_size=4096: smaller tensors get fp32 states.
    assert lora_tensor_bytes(4095, "paged_adamw_8bit") == lora_tensor_bytes(4095, "adamw_torch")


@pytest.mark.parametrize(
    ("quantize", "on_gpu", "optim"),
    [
        ("4bit", True, "paged_adamw_8bit"),
        ("8bit", True, "paged_adamw_8bit"),
        (None, True, "adamw_torch_fused"),
        ("4bit", False, "adamw_torch"),
        (None, False, "adamw_torch"),
    ],
)
def test_the_estimate_uses_the_planned_optimizer(quantize, on_gpu, optim) -> None:
    from cudaload import Machine
    from cudaload.policy.finetune import decide_training_arguments

    machine = Machine.simulated("A100" if on_gpu else None, packages={"bitsandbytes": "0.50.2", "peft": "0.21.2"})
    _, args = decide_training_arguments(machine, "bfloat16", quantize is not None, True)
    assert args["optim"] == planned_optimizer(quantize, on_gpu) == optim
    model = llama(8)
    default = estimate(model, quantize=quantize, on_gpu=on_gpu)
    assert default == estimate(model, quantize=quantize, on_gpu=on_gpu, optim=optim)
    per_parameter = default.lora / _lora_parameters_8b()
    assert per_parameter == pytest.approx(16 if optim.startswith("adamw") else 10, abs=0.05)


# --- weights and layers ------------------------------------------------------------------------


def test_weights_per_quantization() -> None:
    model = llama(8)
    linear, rest = model.linear_parameters, model.parameters - model.linear_parameters
    assert weight_bytes(model, "bfloat16", None) == model.parameters * 2
    assert weight_bytes(model, "bfloat16", "4bit") == pytest.approx(linear * 4.127 / 8 + rest * 2, rel=1e-4)
    rows = 32 * (4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096)  # one fp32 scale per output row
    assert weight_bytes(model, "bfloat16", "8bit") == linear + 4 * rows + rest * 2


def test_checkpointing_keeps_one_layer() -> None:
    model = llama(1, vocab=0)  # no logits: the layers alone
    layer = layer_bytes_per_token(model, "bfloat16", None, PROJ, True) * 2048
    with_ckpt = estimate(model, checkpointing=True).activations
    without = estimate(model, checkpointing=False).activations
    assert with_ckpt == 4 * 2048 * 4096 * 2 + layer
    assert without == 4 * layer
    # A Llama-style layer with LoRA on every projection saves more than Korthikanti's 34·h (GPT,
    # trained weights): every adapter keeps its own masked copy of its input.
    assert 34 * 4096 * 2048 < layer < 80 * 4096 * 2048


def test_8bit_base_layers_save_their_inputs() -> None:
    model = llama(8)
    assert layer_bytes_per_token(model, "bfloat16", "8bit", PROJ, True) > layer_bytes_per_token(
        model, "bfloat16", "4bit", PROJ, True
    )


def test_unknown_layer_shapes_fall_back_to_korthikanti() -> None:
    gpt = replace(
        any_model(),
        parameters=124_000_000,
        num_layers=12,
        hidden_size=768,
        linear_names=("c_attn", "c_fc", "c_proj"),
        linear_shapes=(("c_attn", 768, 2304, 12), ("c_fc", 768, 3072, 12), ("c_proj", 3072, 768, 12)),
        vocab_size=50257,
    )
    assert layer_bytes_per_token(gpt, "bfloat16", None, (), True) == 34 * 768
    # r=16 x (768 + 2304) per c_attn x 12 layers, at 16 bytes each (fp32 weight, grad, 2 AdamW states).
    assert estimate(gpt, targets=("c_attn",)).lora == 16 * (768 + 2304) * 12 * 16


# --- measured on this CPU ------------------------------------------------------------------------

_STEP = textwrap.dedent(
    """
    import gc, json, pathlib, sys
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    def status(key):
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    spec = json.loads(sys.argv[1])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**spec["config"]), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                             target_modules=spec["targets"], task_type="CAUSAL_LM"))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    warm = torch.randint(0, spec["config"]["vocab_size"], (1, 16))
    model(input_ids=warm, labels=warm).loss.backward()
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, spec["config"]["vocab_size"], (1, spec["seq"]))
    gc.collect()
    base = status("VmRSS")
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # VmHWM not reset: still right when the step's peak is the process's peak
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    print(json.dumps({"growth": status("VmHWM") - base, "loss": loss.item()}))
    """
)


@pytest.mark.slow
def test_one_lora_step_on_this_cpu_matches_the_estimate() -> None:
    """Peak RSS growth of one LoRA step (tiny Qwen3, vocabulary 32000 >> hidden 64, 512 tokens).

    VmHWM, reset at the baseline, not ru_maxrss: a child's ru_maxrss starts at its parent's high-water
    mark (pytest's). glibc's mmap threshold is pinned at 64 KiB so freed tensors leave the RSS."""
    from transformers import Qwen3Config

    from cudaload.model_facts import read_model_facts

    config = dict(
        vocab_size=32000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        use_cache=False,
    )
    seq = 512
    facts = read_model_facts(Qwen3Config(**config))
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    est = estimate_training_memory(
        facts,
        dtype="float32",
        quantize=None,
        r=16,
        targets=targets,
        seq_len=seq,
        checkpointing=False,
        on_gpu=False,
    )
    logits = logits_bytes_per_element("float32") * seq * 32000
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    spec = {"config": config, "targets": list(targets), "seq": seq}
    done = subprocess.run(
        [sys.executable, "-c", _STEP, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    growth = json.loads(done.stdout.strip().splitlines()[-1])["growth"]
    assert growth >= 0.5 * logits
    assert growth <= 3 * est.total
    # The step allocates the activations, the LoRA gradients and AdamW's state (the weights, the
    # adapters included, exist before the baseline): measured within 10% of that on the machines
    # this was written on.
    step = est.activations + est.lora - 4 * lora_parameters(facts, 16, targets)
    assert 0.75 * step <= growth <= 1.3 * step
