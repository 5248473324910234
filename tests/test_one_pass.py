"""plan() decides everything in one pass: the config is read once into ModelFacts (KV-cache layout
included), the policy composes the generation section with every other decision, one per link of the
attention chain, and load() only selects the one of the attention it applied."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import cudaload
from cudaload import Machine, ModelConfigError, SettingError, load
from cudaload.facts.kv_cache import KvLayers

H100 = Machine.simulated("H100")


def _fresh_copy(tiny_models: dict[str, Path], tmp_path: Path, arch: str = "qwen3") -> str:
    """A copy the facts cache has not seen: the cache is keyed by config.json's bytes, so this one's
    config gets a key of its own (an attribute transformers keeps and no model reads)."""
    folder = tmp_path / arch
    shutil.copytree(tiny_models[arch], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "cudaload_test_copy": str(folder)}))
    return str(folder)


def test_plan_reads_the_config_once(tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    path = _fresh_copy(tiny_models, tmp_path)
    real = transformers.AutoConfig.from_pretrained
    calls: list[str] = []

    def counting(name: str, *args: object, **kwargs: object) -> object:
        calls.append(str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", counting)
    plan = cudaload.plan(path, machine=H100, generate=True)
    # One read serves the parameter count, the attention support and the KV-cache layout (was two:
    # the generation section read the config a second time).
    assert calls == [path]
    assert plan.generation is not None and plan.generation.kv_bytes_per_token == 256
    calls.clear()
    assert cudaload.plan(path, machine=H100, generate=True).generation == plan.generation
    assert calls == []  # the facts cache holds the layout too: a model seen before reads no config


def test_the_facts_carry_the_kv_layout_through_the_cache(tiny_models, tmp_path: Path) -> None:
    path = _fresh_copy(tiny_models, tmp_path)
    read = cudaload.read_model_facts(path)
    cached = cudaload.read_model_facts(path)
    # tiny qwen3: 2 full-attention layers, 2 KV heads x (16 + 16) = 64 numbers per token each.
    assert read.generation is not None and read.generation.layers == (KvLayers("full_attention", 2, 64),)
    assert cached.generation == read.generation and isinstance(cached.generation.layers[0], KvLayers)
    # generation_config.json is part of the key: a checkpoint that starts asking for a static cache is re-read.
    Path(path, "generation_config.json").write_text(json.dumps({"cache_implementation": "static"}))
    assert cudaload.read_model_facts(path).generation.checkpoint_cache_implementation == "static"


def test_an_encoder_has_no_generation_section(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(tmp_path)
    facts = cudaload.read_model_facts(str(tmp_path))
    assert not facts.generates and facts.generation is None
    assert cudaload.plan(str(tmp_path), machine=H100, generate=None).generation is None
    with pytest.raises(ModelConfigError, match="AutoModel does not generate"):
        cudaload.plan(str(tmp_path), machine=H100, generate=True)


def test_generation_is_selected_for_the_attention_a_fallback_applied(tiny_models, monkeypatch) -> None:
    # A machine that plans FlashAttention-2 while this one has no flash-attn: load() falls back to SDPA.
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    path = str(tiny_models["llama"])
    planned = cudaload.plan(path, machine=a100, device_map="cpu", dtype="bfloat16", generate=True)
    assert planned.attn_implementation == "flash_attention_2"
    assert planned.generation.decision("generation.continuous_batching").value == "CUDA graphs, no compile"
    assert [link for link, _ in planned.generation_fallbacks] == list(planned.attention_chain[1:])

    # load() does not go back to the policy once the weights are read: it selects the plan's entry.
    def no_policy(*args: object, **kwargs: object) -> None:
        raise AssertionError("the policy was asked again while applying the plan")

    from cudaload import policy

    real_plan = cudaload.plan(path, machine=a100, device_map="cpu", dtype="bfloat16", generate=True)
    monkeypatch.setattr(policy, "decide_plan_generation", no_policy)
    monkeypatch.setattr(policy, "decide_generation", no_policy)
    model = load(real_plan)
    monkeypatch.undo()
    applied = model.cudaload_plan
    assert applied.attn_implementation == "sdpa"
    batching = applied.generation.decision("generation.continuous_batching")
    assert batching.value == "no CUDA graphs, no compile" and "sdpa needs an attention mask" in batching.reason
    # The same decisions a plan made for SDPA from the start has.
    for_sdpa = cudaload.plan(
        path, machine=a100, device_map="cpu", dtype="bfloat16", attn_implementation="sdpa", generate=True
    )
    assert applied.generation == for_sdpa.generation
    # A plan rebuilt without the per-link sections (e.g. from its JSON) still loads, and keeps its own section.
    rebuilt = replace(real_plan, generation_fallbacks=())
    assert load(rebuilt).cudaload_plan.generation == real_plan.generation


def test_a_plan_rebuilt_from_its_json_still_loads(tiny_models) -> None:
    from cudaload.plans import Decision, Plan, Rejected

    planned = cudaload.plan(str(tiny_models["llama"]), dtype="float32", generate=True)
    data = json.loads(planned.to_json())
    rebuilt = Plan(
        model=data["model"],
        machine=data["machine"],
        kwargs=data["kwargs"],
        attention_chain=tuple(data["attention_chain"]),
        decisions=tuple(
            Decision(d["setting"], d["value"], d["reason"], tuple(Rejected(**r) for r in d["rejected"]), d["source"])
            for d in data["decisions"]
        ),
        warnings=tuple(data["warnings"]),
        model_class=data["extras"]["model_class"],
        auto_class=planned.auto_class,
    )
    assert not rebuilt.hub_code and rebuilt.generation_fallbacks == ()
    applied = load(rebuilt).cudaload_plan
    assert applied.attn_implementation == planned.attn_implementation and applied.generation is None


def test_a_plan_is_a_hashable_value_without_its_per_link_sections(tiny_models) -> None:
    path = str(tiny_models["qwen3"])
    first, again = cudaload.plan(path, machine=H100, generate=True), cudaload.plan(path, machine=H100, generate=True)
    assert first.generation_fallbacks  # sdpa is planned first; eager has its own section
    assert first == again and hash(first) == hash(again) and len({first, again}) == 1
    assert replace(first, generation_fallbacks=(), hub_code=True) == first  # not part of the value
    assert "generation_fallbacks" not in first.to_dict() and "hub_code" not in first.to_dict()
    assert first != cudaload.plan(path, machine=Machine.simulated("T4"))


def test_from_pretrained_kwargs_builds_the_objects_and_refuses_other_values(tiny_models) -> None:
    plan = cudaload.plan(str(tiny_models["qwen3"]), machine=H100)
    kwargs = cudaload.from_pretrained_kwargs(plan)
    assert kwargs == dict(plan.kwargs) and kwargs is not plan.kwargs
    with pytest.raises(SettingError, match="takes a Plan"):
        cudaload.from_pretrained_kwargs(plan.to_dict())  # type: ignore[arg-type]


def test_the_kv_budget_reads_a_device_map_with_the_one_device_parser() -> None:
    from cudaload.policy.generation import kv_budget

    mixed = Machine.simulated(["A100", "T4"])
    # device_map=1 (an int: GPU 1) budgets the T4 alone; it used to fall back to both GPUs' memory.
    budget, where = kv_budget(mixed, 1, 0)
    assert "Tesla T4" in where and budget == int(15 * 2**30 * 0.8)  # the catalog's 15 GiB, GPU_SHARE 0.8
    assert kv_budget(mixed, {"model.layers.0": "cuda:1", "lm_head": 1}, 0) == (budget, where)
    assert "2 GPUs" in kv_budget(mixed, "auto", 0)[1]


def test_an_inference_request_cannot_carry_settings_its_plan_would_ignore() -> None:
    from cudaload.policy import decide_plan
    from cudaload.request import Request, TrainingRequest
    from model_shapes import llama

    # The fine-tuning settings live in TrainingRequest, which only a fine-tuning Request has (they used to be
    # fields of every Request, where an inference plan silently ignored them).
    with pytest.raises(TypeError):
        Request(quantize="4bit")  # type: ignore[call-arg]
    assert decide_plan(H100, llama(8), Request()).finetune is None
    planned = decide_plan(H100, llama(8), Request(training=TrainingRequest(quantize=None, seq_len=512)))
    assert planned.finetune is not None and planned.finetune.memory_estimate["assumes"]["seq_len"] == 512
