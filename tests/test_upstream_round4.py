"""Upstream, round 4 (issue 29, and issue 28 item 2): each case is built from upstream's rule (the line
each cites), not by calling the implementation's helpers.

The current-device and pre-quantized cases check cudaload.policy.current_device and
cudaload.policy.checkpoint_quantization through plan(): naming the modules here makes tools/mutate.py run this
file for their mutants."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import AttentionUnavailableError, Machine, MissingPackageError, PlacementError, QuantizationError
from cudaload.facts.model import ModelFacts
from cudaload.policy import Request, decide_plan
from model_shapes import llama

KERNELS = {"kernels": "0.17.2"}  # transformers 5.22.2 accepts [0.17.2, 0.18.0)
FA4 = {"flash-attn-4": "4.0.0b40"}

# gpt-oss as transformers declares it (transformers 5.22-5.25 models/gpt_oss/modeling_gpt_oss.py):
# `GptOssPreTrainedModel._compatible_flash_implementations` and a learnable `sinks` parameter per attention layer
# (`GptOssAttention.__init__`).
GPT_OSS = replace(
    llama(8),
    source="gpt-oss-shaped",
    model_type="gpt_oss",
    model_class="GptOssForCausalLM",
    supports_sdpa=False,
    head_dim=64,
    head_dims=(64,),
    compatible_flash=(
        "kernels-community/vllm-flash-attn3",
        "flash_attention_4",
        "kernels-community/metal-flash-sdpa",
        "kernels-community/aiter-flash-attn",
    ),
    attention_sinks=True,
)


def plan(machine: Machine, model: ModelFacts | None = None, **request: Any) -> Any:
    return decide_plan(machine, model or llama(8), Request(**request))


def rejected(result: Any) -> dict[Any, str]:
    return {r.value: r.reason for r in result.decision("attn_implementation").rejected}


# --- items 1-3: attention sinks -------------------------------------------------------------------


def test_the_sinks_fact_is_read_from_the_model(tmp_path: Path) -> None:
    from transformers import GptOssConfig, LlamaConfig

    small = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4}
    GptOssConfig(**small, num_key_value_heads=2, head_dim=16, num_local_experts=4, vocab_size=128).save_pretrained(
        tmp_path / "oss"
    )
    LlamaConfig(**small, num_key_value_heads=2, vocab_size=128).save_pretrained(tmp_path / "llama")
    assert cudaload.read_model_facts(str(tmp_path / "oss")).attention_sinks is True
    assert cudaload.read_model_facts(str(tmp_path / "llama")).attention_sinks is False


@pytest.mark.parametrize("gpu", ["A100", "L40S"])
def test_vllm_flash_attn3_is_not_planned_for_sinks_off_hopper(gpu: str) -> None:
    # flash_api_stable.cpp: CAPI_CHECK(params.arch == 90, "S aux is currently only supported for Hopper GPUs").
    result = plan(Machine.simulated(gpu, packages=KERNELS), GPT_OSS, hub_kernels=True)
    assert "kernels-community/vllm-flash-attn3" not in result.attention_chain
    reason = rejected(result)["kernels-community/vllm-flash-attn3"]
    assert "only on Hopper" in reason and "flash_api_stable.cpp" in reason
    assert "vllm-flash-attn3" not in result.explain().split("attention fallback chain")[1]


def test_vllm_flash_attn3_is_planned_for_sinks_on_hopper() -> None:
    result = plan(Machine.simulated("H100", packages=KERNELS), GPT_OSS, hub_kernels=True)
    assert result.attention_chain[0] == "kernels-community/vllm-flash-attn3"


def test_fa4_is_not_planned_for_sinks_on_sm120() -> None:
    # flash_attn/cute/flash_fwd.py: the sm80-based forward (sm120's too) asserts "Learnable sink is not supported".
    result = plan(Machine.simulated("RTX5090", packages={**FA4, **KERNELS}), GPT_OSS, hub_kernels=True)
    assert "flash_attention_4" not in result.attention_chain
    assert "Learnable sink is not supported" in rejected(result)["flash_attention_4"]
    blackwell = plan(Machine.simulated("B200", packages={**FA4, **KERNELS}), GPT_OSS, hub_kernels=True)
    assert blackwell.attention_chain[0] == "flash_attention_4"
    # sm110 (Thor) takes learnable sinks as sm90 and sm100 do (FA4_SINK_MAJORS, policy/flash_rules.py).
    thor = plan(Machine.simulated("custom:sm110:128GiB", packages={**FA4, **KERNELS}), GPT_OSS, hub_kernels=True)
    assert thor.attention_chain[0] == "flash_attention_4"


def test_sink_kernels_are_not_planned_in_fp16() -> None:
    # transformers casts s_aux to the query dtype (transformers 5.22-5.25 integrations/flash_attention.py:
    # flash_attention_forward); both kernels take bf16 only.
    result = plan(Machine.simulated("H100", packages={**FA4, **KERNELS}), GPT_OSS, hub_kernels=True, dtype="float16")
    assert not any(link.startswith(("kernels-community/vllm", "flash_attention")) for link in result.attention_chain)
    assert "bf16" in rejected(result)["kernels-community/vllm-flash-attn3"]
    assert "bf16" in rejected(result)["flash_attention_4"]
    with pytest.raises(AttentionUnavailableError, match="bf16"):
        plan(
            Machine.simulated("H100", packages={**FA4, **KERNELS}),
            GPT_OSS,
            dtype="float16",
            attn_implementation="flash_attention_4",
        )


def test_fa2_drops_sinks_so_a_sinks_model_never_gets_it() -> None:
    # s_aux goes only to a kernel taking `s_aux` or `learnable_sink`
    # (transformers 5.22-5.25 modeling_flash_attention_utils.py: _process_flash_attention_kwargs).
    no_redirect = replace(GPT_OSS, compatible_flash=None)
    result = plan(Machine.simulated("A100", packages={"flash-attn": "2.8.3"}), no_redirect)
    assert "flash_attention_2" not in result.attention_chain
    assert "drop them silently" in rejected(result)["flash_attention_2"]
    # The same model without sinks gets FA2 there.
    assert (
        plan(
            Machine.simulated("A100", packages={"flash-attn": "2.8.3"}), replace(no_redirect, attention_sinks=False)
        ).attention_chain[0]
        == "flash_attention_2"
    )


# --- item 6: pre-quantized checkpoints transformers refuses -----------------------------------------


def _prequantized(method: str) -> ModelFacts:
    from cudaload.facts.stored_weights import read_quantization_config

    found = read_quantization_config({"quant_method": method})
    return replace(llama(8), quantized=method, quantization=found)


def test_nvfp4_checkpoints_are_refused_with_upstreams_reason() -> None:
    # transformers 5.22-5.25 quantizers/quantizer_nvfp4.py: NVFP4HfQuantizer.validate_environment:
    # `if self.pre_quantized: raise ValueError("Loading pre-quantized NVFP4 ...")`.
    for machine in (Machine.simulated("B200", packages=KERNELS), Machine.simulated()):
        with pytest.raises(QuantizationError, match="Loading pre-quantized NVFP4 checkpoints is not supported yet"):
            plan(machine, _prequantized("nvfp4"))


# Each message as transformers 5.22-5.25 quantizers/quantizer_fbgemm_fp8.py: FbgemmFp8HfQuantizer.validate_environment
# raises it.
@pytest.mark.parametrize(
    ("gpu", "packages", "error", "match"),
    [
        ("A100", {"fbgemm-gpu": "1.4.0"}, QuantizationError, "compute capability >= 9.0"),
        ("H100", {}, MissingPackageError, "requires fbgemm-gpu"),
        (None, {"fbgemm-gpu": "1.4.0"}, QuantizationError, "requires a GPU"),
    ],
)
def test_fbgemm_fp8_is_refused_where_transformers_refuses_it(gpu: str | None, packages, error, match) -> None:
    with pytest.raises(error, match=match):
        plan(Machine.simulated(gpu, packages=packages), _prequantized("fbgemm_fp8"))
    kept = plan(Machine.simulated("H100", packages={"fbgemm-gpu": "1.4.0"}), _prequantized("fbgemm_fp8"))
    assert kept.decision("checkpoint_quantization") is not None


# --- item 4: the quantizer judges the current device: the placed GPU is made current -----------------

MXFP4_OK = {"triton": "3.4.0", "kernels": "0.17.2"}


def _gpt_oss_mxfp4() -> ModelFacts:
    from cudaload.facts.stored_weights import read_quantization_config

    found = read_quantization_config({"quant_method": "mxfp4"})
    assert found is not None
    experts = replace(found, quantized_parameters=19_110_297_600)  # gpt-oss-20b's expert weights
    return replace(GPT_OSS, parameters=20_914_757_184, quantized="mxfp4", quantization=experts)


def test_mixed_gpus_plan_the_placed_gpu_as_current() -> None:
    # V100 is cuda:0: quantizer_mxfp4.py reads torch.cuda.get_device_capability() of the current device (sm70 < 7.5
    # would dequantize); the plan keeps MXFP4 for the H100 it places the model on, so it makes cuda:1 current.
    result = plan(Machine.simulated(["V100", "H100"], packages=MXFP4_OK), _gpt_oss_mxfp4())
    assert result.kwargs["device_map"] == "cuda:1"
    assert result.decision("checkpoint_quantization").value == "mxfp4"
    current = result.decision("cuda_device")
    assert current.value == 1 and "current_device" in current.reason
    # Uniform GPUs: cuda:0 answers as any other, nothing to set (and nothing new in explain()).
    uniform = plan(Machine.simulated("H100", count=2, packages=MXFP4_OK), _gpt_oss_mxfp4())
    assert "cuda_device" not in {d.setting for d in uniform.decisions}


def test_a_spread_over_mixed_gpus_makes_the_weakest_current() -> None:
    # A copy that fits neither GPU alone: judged (and dequantized) on the weakest, which is made current.
    big = replace(_gpt_oss_mxfp4(), parameters=200_000_000_000)
    result = plan(Machine.simulated(["H100", "V100"], packages=MXFP4_OK), big)
    assert result.kwargs["device_map"] == "auto"
    assert result.decision("checkpoint_quantization").value == "dequantized"
    assert result.decision("cuda_device").value == 1  # the V100


def test_apply_plan_sets_the_current_device_before_from_pretrained(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from cudaload.loaders import apply as loaders

    result = plan(Machine.simulated(["V100", "H100"], packages=MXFP4_OK), _gpt_oss_mxfp4())
    events: list[str] = []

    class Stop(Exception):
        pass

    def load_with(*_: Any) -> Any:
        events.append("from_pretrained")
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: events.append(f"set_device({index})"))
    monkeypatch.setattr(loaders, "_load_with", load_with)
    monkeypatch.setattr("cudaload.upstream_imports.resolve_auto_class", lambda name: object)
    with pytest.raises(Stop):
        loaders.apply_plan(result, strict=False, verify=False)
    assert events == ["set_device(1)", "from_pretrained"]


def test_without_cuda_set_device_is_not_called(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from cudaload.loaders import set_rank_device

    result = plan(Machine.simulated(["V100", "H100"], packages=MXFP4_OK), _gpt_oss_mxfp4())
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: pytest.fail(f"set_device({index}) without CUDA"))
    assert set_rank_device(result) is None  # this machine has no CUDA: the plan was made for another one


# --- consent: no Hub code unasked, whatever machine the plan was made for ----------------------------

_CONSENT_SCRIPT = """
import dataclasses, json, socket, sys
contacted = []
local = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
resolve, connect = socket.getaddrinfo, socket.socket.connect
def counted_resolve(host, *args, **kwargs):
    if host not in local:
        contacted.append(f"resolve {host}")
    return resolve(host, *args, **kwargs)
def counted_connect(self, address):
    if isinstance(address, tuple) and address[0] not in local:
        contacted.append(f"connect {address[0]}")
    return connect(self, address)
socket.getaddrinfo, socket.socket.connect = counted_resolve, counted_connect
import cudaload
a100 = cudaload.Machine.simulated("A100", packages={"flash-attn": "2.8.3", "kernels": "0.17.2"})
planned = cudaload.plan(sys.argv[1], machine=a100)
assert planned.attention_chain[0] == "flash_attention_2", planned.attention_chain
# Made for an A100 with flash-attn; loaded on this CPU machine, which has neither (only the placement is made
# loadable here: the attention chain is the A100's).
here = dataclasses.replace(planned, kwargs={**planned.kwargs, "device_map": "cpu", "dtype": "float32"})
model = cudaload.load(here)
applied = model.cudaload_plan
print(json.dumps({"contacted": contacted, "attention": applied.attn_implementation,
                  "fallbacks": [f.error for f in applied.fallbacks]}))
"""


def test_a_plan_for_an_a100_asks_no_hub_code_on_this_machine(tiny_models) -> None:
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("kernels")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # online: a fetch would be seen
    done = subprocess.run(
        [sys.executable, "-c", _CONSENT_SCRIPT, str(tiny_models["llama"])],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["contacted"] == []
    assert seen["attention"] == "sdpa"
    assert any("kernels-community/flash-attn2" in error and "hub_kernels=True" in error for error in seen["fallbacks"])


def test_naming_flash_attention_is_not_consent_to_its_hub_kernel() -> None:
    # Without flash-attn, transformers fetches kernels-community/flash-attn2 for "flash_attention_2".
    a100 = Machine.simulated("A100", packages=KERNELS)
    with pytest.raises(AttentionUnavailableError, match="hub_kernels=True"):
        plan(a100, attn_implementation="flash_attention_2")
    allowed = plan(a100, attn_implementation="flash_attention_2", hub_kernels=True)
    assert allowed.attention_chain == ("flash_attention_2",)
    cached = Machine.simulated("A100", packages=KERNELS, cached_kernels=("kernels-community/flash-attn2",))
    assert plan(cached, attn_implementation="flash_attention_2").attention_chain == ("flash_attention_2",)


# --- issue 28 item 2: your max_memory is applied, or refused, never shown and dropped ---------------

GiB = 2**30


def test_a_cap_below_the_model_plans_auto_with_the_cap_not_a_single_gpu() -> None:
    # transformers reads max_memory only for a device_map strategy (integrations/accelerate.py `_get_device_map`):
    # "cuda:0" with {0: "100MiB"} would put the whole model on the H100 and drop the cap.
    result = plan(Machine.simulated("H100"), max_memory={0: "100MiB"})
    assert result.kwargs["device_map"] == "auto"
    assert result.kwargs["max_memory"] == {0: "100MiB"}
    assert "ignores it" in result.decision("device_map").reason
    # No "cpu" key: transformers adds "disk" and sends everything past the GPU cap there.
    (warning,) = [w for w in result.warnings if "offloaded" in w]
    spill = result.weight_bytes - 100 * 2**20
    assert f"~{spill / GiB:.1f} GiB to disk" in warning and "no 'cpu' key" in warning


def test_a_cpu_cap_on_a_cpu_machine_is_applied() -> None:
    tiny = replace(llama(8), parameters=269_000_000)  # ~538 MB in bf16, the size the issue loaded
    result = plan(Machine.simulated(), tiny, max_memory={"cpu": "100MiB"}, dtype="bfloat16")
    assert result.kwargs["device_map"] == "auto" and result.kwargs["max_memory"] == {"cpu": "100MiB"}
    assert any("~100.0 MiB to CPU" in w and "to disk" in w for w in result.warnings)


def test_the_offload_warning_uses_your_caps() -> None:
    # A 70B-shaped copy (~131 GiB in bf16) on 2 H100s capped at 20 GiB each and 100 GiB of CPU: ~91 GiB leave the
    # GPUs (the "~3.4 GiB" was judged on 80% of the free memory instead).
    seventy = replace(llama(70), parameters=70_553_706_496)
    caps = {0: "20GiB", 1: "20GiB", "cpu": "100GiB"}
    result = plan(Machine.simulated("H100", count=2), seventy, max_memory=caps)
    off = result.weight_bytes - 40 * GiB
    assert result.kwargs["max_memory"] == caps
    assert any(f"~{off / GiB:.1f} GiB to CPU" in w for w in result.warnings)


@pytest.mark.parametrize("device_map", ["cuda:0", 0, {"": 0}])
def test_a_single_device_map_with_max_memory_is_refused(device_map: Any) -> None:
    with pytest.raises(PlacementError, match="ignores it otherwise"):
        plan(Machine.simulated("H100"), device_map=device_map, max_memory={0: "10GiB"})
    kept = plan(Machine.simulated("H100"), device_map="auto", max_memory={0: "10GiB"})
    assert kept.kwargs["max_memory"] == {0: "10GiB"}


# --- item 5: a spread judged as transformers places it ------------------------------------------------


def _qwen3(layers: int) -> Any:
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=layers,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        dtype="bfloat16",
    )
    config._name_or_path = f"Qwen3-{layers}-layers-shaped config"
    return config


def test_a_spread_that_fits_the_budgets_but_not_upstreams_map_warns() -> None:
    # ~33.7 GiB under 2 x 17.6 GiB of budget: the budgets' sum says "fits", but transformers' own device_map="auto"
    # (run here on the meta model) keeps the largest layer's room on GPU 0 and, with no "cpu" key, uses disk.
    from cudaload.capability.upstream_placement import upstream_placement

    a10g = Machine.simulated("A10G", count=2)
    result = cudaload.plan(_qwen3(50), machine=a10g)
    assert result.kwargs["device_map"] == "auto" and "cpu" not in result.kwargs["max_memory"]
    assert result.weight_bytes < sum(int(float(v[:-3]) * GiB) for v in result.kwargs["max_memory"].values())
    landed = upstream_placement(_qwen3(50), "AutoModelForCausalLM", "bfloat16", result.kwargs["max_memory"])
    assert landed is not None and landed["disk"] > 0
    (warning,) = [w for w in result.warnings if "transformers will put" in w]
    assert f"~{landed['disk'] / GiB:.1f} GiB on disk" in warning and "infer_auto_device_map" in warning
    assert "on disk" in result.decision("device_map").reason
    # A smaller spread upstream keeps on the GPUs: nothing added.
    fits = cudaload.plan(_qwen3(40), machine=a10g)
    assert fits.kwargs["device_map"] == "auto" and not any("transformers will put" in w for w in fits.warnings)


# --- not modelled before: now modelled, or said in the plan -------------------------------------------


def _generation(machine: Machine, facts: Any, **kw: Any) -> Any:
    from cudaload.policy.generation import decide_generation

    args: dict[str, Any] = dict(dtype="bfloat16", attention="sdpa", weight_bytes=16 * GiB, device_map="cuda:0")
    return decide_generation(machine, facts, **{**args, **kw})


def _facts(*layers: Any) -> Any:
    from cudaload.facts.kv_cache import GenerationFacts, KvLayers

    return GenerationFacts(layers=tuple(KvLayers(*layer) for layer in layers), max_positions=262144)


def test_linear_attention_state_is_said_not_counted() -> None:
    # Qwen3-Next: 12 full-attention layers, 36 Gated DeltaNet layers with a fixed per-sequence state.
    hybrid = _generation(
        Machine.simulated("H100"), _facts(("full_attention", 12, 2 * 2 * 256), ("linear_attention", 36, 0))
    )
    assert any("36 layer(s) keep a fixed-size" in w and "not modelled" in w for w in hybrid.warnings)
    plain = _generation(Machine.simulated("H100"), _facts(("full_attention", 48, 2 * 2 * 256)))
    assert not any("fixed-size" in w for w in plain.warnings)


def test_a_quantized_cache_says_it_is_sized_at_full_width() -> None:
    chosen = _generation(
        Machine.simulated("H100"), _facts(("full_attention", 32, 2048)), cache_implementation="quantized"
    )
    assert any("full width" in w and "optimum-quanto" in w for w in chosen.warnings)


@pytest.mark.parametrize(("transformers", "devices"), [("5.22.2", "cuda/xpu/neuron/tpu;"), ("5.25.0", "tpu/mps;")])
def test_the_compile_reason_follows_the_installed_transformers(transformers: str, devices: str) -> None:
    # generation/utils.py `_valid_auto_compile_criteria`: 5.25.0 adds "mps" to the device types it compiles on.
    machine = Machine.simulated(packages={"transformers": transformers, "kernels": "0.19.1"})
    generation = _generation(
        machine, _facts(("full_attention", 32, 2048)), device_map="cpu", cache_implementation="static"
    )
    assert devices in generation.decision("generation.compile").reason


def test_zero3_ranks_each_loading_a_full_cpu_copy_warn_on_ram() -> None:
    from cudaload.facts.machine import Launch
    from cudaload.request import TrainingRequest

    launch = Launch(
        "accelerate", rank=0, local_rank=0, world_size=8, local_world_size=8, strategy="deepspeed", zero_stage=3
    )
    node = Machine.simulated("H100", count=8, packages={"peft": "0.21.2"}, launch=launch, cpu_memory_gib=64)
    result = plan(node, llama(8), training=TrainingRequest(quantize=None))
    (warning,) = [w for w in result.warnings if "into CPU RAM" in w]
    assert "8 ranks" in warning and "OOM" in warning
    roomy = Machine.simulated("H100", count=8, packages={"peft": "0.21.2"}, launch=launch, cpu_memory_gib=1024)
    assert not any("into CPU RAM" in w for w in plan(roomy, llama(8), training=TrainingRequest(quantize=None)).warnings)
