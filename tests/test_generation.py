"""plan.generation: the KV-cache arithmetic held against the cache tensors transformers really
allocates, and the generation decisions over made-up machines (facts passed in, no mocks)."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import Machine
from cudaload.capability.kv_layout import read_generation_facts
from cudaload.cli import main
from cudaload.errors import ModelConfigError, SettingError
from cudaload.facts.kv_cache import CACHE_IMPLEMENTATIONS, GenerationFacts, KvLayers
from cudaload.facts.machine import GiB
from cudaload.policy.generation import decide_generation
from cudaload.request import WORKLOADS

SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
WINDOW = 8


def _configs() -> dict[str, Any]:
    """Tiny configs of real architectures, one per cache shape the policy must count."""
    import transformers as t

    return {
        "llama": t.LlamaConfig(**SMALL),
        "qwen3 (head_dim != hidden/heads)": t.Qwen3Config(head_dim=32, **SMALL),
        "mistral (sliding every layer)": t.MistralConfig(sliding_window=WINDOW, **SMALL),
        "gemma2 (alternating sliding)": t.Gemma2Config(head_dim=16, sliding_window=WINDOW, **SMALL),
        "gemma3 (5 sliding : 1 full)": t.Gemma3TextConfig(
            head_dim=16, sliding_window=WINDOW, **{**SMALL, "num_hidden_layers": 7}
        ),
        "gpt2 (n_head, no kv heads)": t.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256),
        "qwen3_next (hybrid linear attention)": t.Qwen3NextConfig(
            **SMALL,
            head_dim=16,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        "deepseek_v3 (MLA latent)": t.DeepseekV3Config(
            **{**SMALL, "num_key_value_heads": 4},
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
    }


def _cache_bytes(cache: Any) -> int:
    """Bytes of every tensor a cache's layers hold (K, V, linear states...), each storage once."""
    import torch

    seen: set[int] = set()
    total = 0

    def visit(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            if value.ndim >= 2 and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    for layer in cache.layers:
        visit(vars(layer))
    return total


def _forward(model: Any, ids: Any, cache: Any) -> Any:
    """One forward filling `cache` (transformers 5.24 renamed `past_key_values` to `cache`)."""
    import torch

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        return model(input_ids=ids, use_cache=True, **{name: cache})


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[Any, Any]]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    out = {}
    for name, config in _configs().items():
        model = AutoModelForCausalLM.from_config(config).eval()
        out[name] = (model, read_generation_facts(config, type(model)))
    return out


NAMES = list(_configs())


@pytest.mark.parametrize("name", NAMES)
def test_kv_estimate_matches_the_static_cache_transformers_allocates(name: str, built: dict[str, Any]) -> None:
    """StaticCache(max_cache_len=L) allocates exactly what the estimate says for L tokens (windows
    capped); for hybrids the constant linear state cancels between two lengths."""
    import torch
    from transformers import StaticCache

    model, facts = built[name]
    batch, prompt = 2, 5
    ids = torch.randint(1, 100, (batch, prompt))
    measured = {}
    for length in (3 * WINDOW, 6 * WINDOW):
        cache = StaticCache(config=model.config, max_cache_len=length)
        _forward(model, ids, cache)
        measured[length] = _cache_bytes(cache)
    predicted = {length: facts.kv_bytes(batch, length, 4) for length in measured}
    grown = measured[6 * WINDOW] - measured[3 * WINDOW]
    assert grown == predicted[6 * WINDOW] - predicted[3 * WINDOW]
    if facts.state_layers == 0:
        assert measured == predicted
    else:  # linear-attention layers add a fixed state the per-token estimate leaves out
        assert measured[3 * WINDOW] > predicted[3 * WINDOW]


@pytest.mark.parametrize("name", NAMES)
def test_kv_estimate_bounds_the_dynamic_cache_generate_uses(name: str, built: dict[str, Any]) -> None:
    """DynamicCache(config) (generate()'s default): full layers hold every token; a sliding layer
    keeps window-1 between steps and window during one, which the estimate plans for."""
    import torch
    from transformers import DynamicCache

    model, facts = built[name]
    batch = 2
    per_token_growth = []
    for tokens in (3 * WINDOW, 4 * WINDOW):
        cache = DynamicCache(config=model.config)
        _forward(model, torch.randint(1, 100, (batch, tokens)), cache)
        per_token_growth.append(_cache_bytes(cache))
        window_token = batch * 4 * sum(g.count * g.elements_per_token for g in facts.layers if g.window is not None)
        if facts.state_layers == 0:
            assert _cache_bytes(cache) == facts.kv_bytes(batch, tokens, 4) - window_token
    # Past every window, one more token costs exactly the full layers' share.
    assert (per_token_growth[1] - per_token_growth[0]) // WINDOW == batch * facts.bytes_per_token(
        4, beyond_windows=True
    )


def test_generate_leaves_the_cache_the_estimate_predicts(tiny_models: dict[str, Path]) -> None:
    """A real generate() on a saved model: the returned cache holds prompt + new - 1 tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tiny_models["llama"]
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    facts = read_generation_facts(AutoConfig.from_pretrained(path), type(model))
    import torch

    ids = torch.randint(1, 200, (3, 7))
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, return_dict_in_generate=True
    )
    cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
    assert _cache_bytes(cache) == facts.kv_bytes(3, 7 + 6 - 1, 4)


# Published shapes (config.json of each model, no download: the numbers are typed in here).
LLAMA3_8B = dict(
    hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192
)


def test_real_config_shapes() -> None:
    """Llama-3-8B caches 128 KiB per token in bf16 (32 layers x 8 KV heads x 128 x 2 x 2 bytes, the
    figure vLLM and the Llama 3 paper's GQA ratio give); Mistral-7B-v0.1 the same but only over its
    4096-token window; Gemma-2-9B alternates 4096-token sliding and full layers (head_dim 256)."""
    import transformers as t

    llama = read_generation_facts(t.LlamaConfig(**LLAMA3_8B))
    assert llama.bytes_per_token(2) == 128 * 1024
    mistral = read_generation_facts(
        t.MistralConfig(**{**LLAMA3_8B, "max_position_embeddings": 32768}, sliding_window=4096)
    )
    assert mistral.kv_bytes(1, 32768, 2) == mistral.kv_bytes(1, 4096, 2) == 4096 * 128 * 1024
    gemma2 = read_generation_facts(
        t.Gemma2Config(
            hidden_size=3584,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            sliding_window=4096,
        )
    )
    assert gemma2.bytes_per_token(2) == 42 * 8 * 512 * 2
    assert gemma2.bytes_per_token(2, beyond_windows=True) == 21 * 8 * 512 * 2


def test_cache_implementations_are_the_ones_transformers_builds() -> None:
    from transformers.generation import configuration_utils as upstream

    current = set(upstream.STATIC_CACHE_IMPLEMENTATIONS) | set(upstream.DYNAMIC_CACHE_IMPLEMENTATIONS)
    assert set(CACHE_IMPLEMENTATIONS) == current


# -- the policy over made-up machines ---------------------------------------------------------

FULL = GenerationFacts(layers=(KvLayers("full_attention", 32, 8 * 256),), max_positions=131072)


def _decide(machine: Machine, facts: GenerationFacts = FULL, **kw: Any) -> Any:
    args: dict[str, Any] = dict(dtype="bfloat16", attention="sdpa", weight_bytes=16 * GiB, device_map="cuda:0")
    return decide_generation(machine, facts, **{**args, **kw})


H100 = Machine.simulated("H100")


def test_cpu_keeps_transformers_default_dynamic_cache() -> None:
    gen = _decide(Machine.simulated(None), device_map="cpu", workload=WORKLOADS["decode-heavy"])
    assert gen.cache_implementation == "dynamic"
    assert gen.compile is False
    assert gen.generate_kwargs == {}
    assert "cuda/xpu" in gen.decision("generation.cache_implementation").rejected[0].reason


def test_gpu_plans_static_and_compile_only_for_long_decodes() -> None:
    balanced = _decide(H100)
    assert balanced.cache_implementation == "dynamic" and not balanced.compile
    decode = _decide(H100, workload=WORKLOADS["decode-heavy"])
    assert decode.cache_implementation == "static" and decode.compile
    assert decode.generate_kwargs == {"cache_implementation": "static"}
    quantized = _decide(H100, workload=WORKLOADS["decode-heavy"], quantized="bitsandbytes")
    assert quantized.cache_implementation == "dynamic" and not quantized.compile
    reason = quantized.decision("generation.cache_implementation").rejected[0].reason
    assert "bitsandbytes-quantized models are not compileable" in reason
    # FineGrainedFP8's quantizer is compileable (quantizer_finegrained_fp8.py: is_compileable True)
    fp8 = _decide(H100, workload=WORKLOADS["decode-heavy"], quantized="fp8")
    assert fp8.cache_implementation == "static" and fp8.compile
    no_fullgraph = _decide(H100, replace(FULL, compiles_fullgraph=False), workload=WORKLOADS["decode-heavy"])
    assert no_fullgraph.cache_implementation == "dynamic"


def test_your_cache_implementation_wins_and_a_bad_one_raises() -> None:
    gen = _decide(Machine.simulated(None), device_map="cpu", cache_implementation="static")
    decision = gen.decision("generation.cache_implementation")
    assert (decision.value, decision.source) == ("static", "user")
    assert gen.generate_kwargs == {"cache_implementation": "static"}
    assert "set by you" in "\n".join(gen.explain_lines())
    assert not gen.compile  # on a CPU generate() does not compile it either
    with pytest.raises(SettingError, match=r"'statik'.*static"):
        _decide(H100, cache_implementation="statik")
    with pytest.raises(SettingError, match="its own cache"):
        _decide(H100, replace(FULL, supports_cache=False), cache_implementation="static")


def test_checkpoint_generation_config_is_respected() -> None:
    gen = _decide(H100, replace(FULL, checkpoint_cache_implementation="offloaded"))
    assert gen.cache_implementation == "offloaded"
    assert "generation_config.json" in gen.decision("generation.cache_implementation").reason


@pytest.mark.parametrize("old_name", ["sliding_window", "hybrid_chunked", "offloaded_hybrid"])
def test_a_checkpoints_old_static_cache_name_is_planned_as_the_static_cache_generate_builds(old_name: str) -> None:
    # generate() builds a StaticCache for these (DEPRECATED_STATIC_CACHE_IMPLEMENTATIONS) and compiles on a GPU;
    # the plan said "dynamic, no compile".
    gen = _decide(H100, replace(FULL, checkpoint_cache_implementation=old_name))
    assert gen.cache_implementation == old_name
    assert "as a static cache" in gen.decision("generation.cache_implementation").reason
    assert gen.compile is True
    assert _decide(Machine.simulated(None), replace(FULL, checkpoint_cache_implementation=old_name)).compile is False


def test_llama4_is_never_compiled_by_generate() -> None:
    # PreTrainedModel.get_compiled_call returns `self.__call__` for any model_type containing "llama4".
    static = {"cache_implementation": "static"}
    assert _decide(H100, **static).compile is True
    gen = _decide(H100, replace(FULL, model_type="llama4_text"), **static)
    assert gen.compile is False
    assert "get_compiled_call" in gen.decision("generation.compile").reason


def test_padding_side() -> None:
    assert _decide(H100).padding_side == "left"
    assert _decide(H100, replace(FULL, encoder_decoder=True)).padding_side == "right"
    yours = _decide(H100, padding_side="right")
    assert yours.padding_side == "right" and yours.decision("generation.padding_side").source == "user"
    assert any("right-padding" in w for w in yours.warnings)
    # Checked once per plan, where the request is made (plan() builds it before reading anything).
    from cudaload.request import GenerationRequest

    with pytest.raises(SettingError, match="'middle'"):
        GenerationRequest(True, padding_side="middle")
    with pytest.raises(SettingError, match="'middle'"):
        cudaload.plan("/nonexistent/folder", generate=True, padding_side="middle")


def test_max_batch_follows_memory_and_context() -> None:
    # By hand: the H100's 80 GiB (free unknown: all of it) minus 16 GiB of weights, 80% of that for the cache:
    # 51.2 GiB. FULL caches 32 layers x 2048 numbers x 2 bytes = 128 KiB per token, so a 4096-token sequence
    # takes 512 MiB (102 fit: 51.2 GiB / 0.5 GiB = 102.4) and an 8192-token one 1 GiB (51 fit).
    short = _decide(H100, context=4096)
    long = _decide(H100, context=8192)
    assert short.budget_bytes == int(51.2 * GiB) and short.kv_bytes_per_token == 128 * 1024
    assert (short.max_batch, long.max_batch) == (102, 51)
    # The H200's 141 GiB: (141 - 16) x 0.8 = 100 GiB, 200 sequences of 512 MiB.
    assert _decide(Machine.simulated("H200"), context=4096).max_batch == 200
    # The L4's 22 GiB: (22 - 16) x 0.8 = 4.8 GiB, one sequence of up to 4.8 GiB / 128 KiB = 39321.6 tokens.
    assert _decide(Machine.simulated("L4"), context=4096).max_context == 39321
    # A windowed model's cache stops growing: the same GPU holds a longer context. Its 16 sliding layers hold
    # 4096 tokens x 16 x 4 KiB = 256 MiB at most; the 4.55 GiB left go to 16 full layers at 64 KiB a token:
    # 4.55 GiB / 64 KiB = 74547.2 tokens.
    sliding = replace(
        FULL, layers=(KvLayers("sliding_attention", 16, 8 * 256, 4096), KvLayers("full_attention", 16, 8 * 256))
    )
    assert _decide(Machine.simulated("L4"), sliding, context=4096).max_context == 74547


def test_a_cache_that_cannot_fit_is_offloaded_and_said() -> None:
    gen = _decide(Machine.simulated("T4"), weight_bytes=12 * GiB, context=131072)
    assert gen.max_batch == 0
    assert gen.cache_implementation == "offloaded"
    assert any("shorten the context" in w for w in gen.warnings)


def test_continuous_batching_graphs_follow_flash_attention() -> None:
    assert (
        _decide(H100, attention="flash_attention_2")
        .decision("generation.continuous_batching")
        .value.startswith("CUDA graphs")
    )
    assert _decide(H100).decision("generation.continuous_batching").value.startswith("no CUDA graphs")


def test_bad_context_raises() -> None:
    for bad in (0, -5, 2.5, True):
        with pytest.raises(SettingError, match="context"):
            _decide(H100, context=bad)


# -- plan() and the CLI -----------------------------------------------------------------------


def test_plan_generate(tiny_models: dict[str, Path]) -> None:
    path = str(tiny_models["qwen3"])
    assert cudaload.plan(path, machine=H100).generation is None
    plan = cudaload.plan(path, machine=H100, generate=True, context=100)
    assert plan.generation is not None and plan.generation.context == 100
    assert plan.to_dict()["generation"]["max_batch"] == plan.generation.max_batch
    assert "generation (context 100 tokens)" in plan.explain()
    with pytest.raises(SettingError, match="generate=True"):
        cudaload.plan(path, machine=H100, context=100)
    with pytest.raises(SettingError, match="finetune"):
        cudaload.plan(path, machine=H100, generate=True, finetune=True)
    # The facts read from the config carry its KV-cache layout: planning them is planning the path.
    facts = cudaload.read_model_facts(path)
    assert facts.generation is not None
    from_facts = cudaload.plan(facts, machine=H100, generate=True, context=100).generation
    assert from_facts == plan.generation
    # Facts without one (built by hand) cannot plan generation, and say what to pass instead.
    with pytest.raises(ModelConfigError, match="path, Hub id or PretrainedConfig"):
        cudaload.plan(replace(facts, generation=None), machine=H100, generate=True)
    # generate=None (what load() asks) leaves such facts without a generation section.
    assert cudaload.plan(replace(facts, generation=None), machine=H100, generate=None).generation is None


def test_cli_plan_generate(tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tiny_models["qwen3"])
    assert main(["plan", path, "--gpu", "A100", "--generate", "--context", "64"]) == 0
    out = capsys.readouterr().out
    assert "generation (context 64 tokens)" in out and "generation.padding_side" in out
    with pytest.raises(SystemExit):
        main(["plan", path, "--context", "64"])


def test_load_applies_generation_for_generating_models(tiny_models: dict[str, Path]) -> None:
    path = str(tiny_models["llama"])
    applied = cudaload.load(path).cudaload_plan
    assert applied.generation is not None
    assert applied.generation.dtype == applied.dtype
    assert "generation (context" in applied.explain()
    # Decided again with what was loaded: planned for an A100 with flash-attn (CUDA graphs for
    # continuous batching), loaded here FlashAttention falls back to sdpa (no CUDA graphs). The dtype
    # check above holds even if the planned section were kept; this one does not.
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    settings: dict[str, Any] = dict(machine=a100, device_map="cpu", dtype="bfloat16")
    planned = cudaload.plan(path, generate=True, **settings).generation
    assert planned is not None and planned.decision("generation.continuous_batching").value.startswith("CUDA graphs")
    fell_back = cudaload.load(path, **settings).cudaload_plan
    assert fell_back.attn_implementation == "sdpa" and fell_back.generation is not None
    assert fell_back.generation.decision("generation.continuous_batching").value.startswith("no CUDA graphs")
    assert cudaload.load(path, generate=False).cudaload_plan.generation is None
    assert cudaload.load(path, model_class="AutoModel").cudaload_plan.generation is None
