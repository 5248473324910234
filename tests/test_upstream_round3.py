"""Issue 21, items 2-9: rules held against upstream's own behaviour. Expectations are worked out here
from upstream's rules (the line each cites), not by calling the implementation's helpers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import cudaload.facts.packages
from cudaload import Machine
from cudaload.facts.kv_cache import GenerationFacts, KvLayers
from cudaload.facts.machine import GiB, Launch
from cudaload.facts.model import ModelFacts
from cudaload.loaders import set_rank_device
from cudaload.policy import Request, Workload, decide_plan
from cudaload.policy.generation import decide_generation
from cudaload.policy.memory import estimate_training_memory, logits_bytes_per_element
from cudaload.request import TrainingRequest
from cudaload.upstream_kernels import hub_kernel_version
from model_shapes import PROJ, llama

BNB = {"bitsandbytes": "0.50.2", "peft": "0.21.2"}
FA2 = {"flash-attn": "2.8.3"}


def plan(machine: Machine, model: ModelFacts | None = None, **request: Any) -> Any:
    return decide_plan(machine, model or llama(8), Request(**request))


# --- item 3: ZeRO-3 QLoRA stores the 4-bit weights in the compute dtype --------------------------


@pytest.mark.parametrize(
    ("launch", "storage"),
    [
        # peft docs/source/accelerate/deepspeed.md, "Use PEFT QLoRA and DeepSpeed with ZeRO3":
        # bnb_4bit_quant_storage=quant_storage_dtype, the same dtype the model is loaded in (bf16 here).
        (Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="deepspeed", zero_stage=3), "bfloat16"),
        (Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="fsdp"), "bfloat16"),
        # ZeRO-2 replicates parameters: nothing shards the packed weights, bitsandbytes' uint8 stays.
        (Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="deepspeed", zero_stage=2), "uint8"),
    ],
)
def test_sharded_qlora_stores_4bit_in_the_compute_dtype(launch: Launch, storage: str) -> None:
    machine = Machine.simulated("H100", count=2, packages=BNB, launch=launch)
    config = plan(machine, training=TrainingRequest(quantize="4bit")).kwargs["quantization_config"]
    assert config["bnb_4bit_compute_dtype"] == "bfloat16"  # H100: sm90 runs bf16
    assert config["bnb_4bit_quant_storage"] == storage


# --- item 8: reasons that said what upstream no longer does ----------------------------------------


@pytest.mark.parametrize("transformers", ["5.22.2", "5.25.0"])
def test_checkpointing_reason_does_not_call_reentrant_the_default(transformers: str) -> None:
    # modeling_utils.py of both sets {"use_reentrant": False} when no kwargs are given.
    machine = Machine.simulated("A100", packages={**BNB, "transformers": transformers})
    plan_ = plan(machine, training=TrainingRequest(quantize=None))
    reason = next(d.reason for d in plan_.decisions if d.setting.endswith("checkpointing_kwargs"))
    assert "the reentrant default" not in reason
    assert f"transformers {transformers} defaults to it" in reason


def _generation(machine: Machine, facts: GenerationFacts, **kw: Any) -> Any:
    args: dict[str, Any] = dict(dtype="bfloat16", attention="sdpa", weight_bytes=16 * GiB, device_map="cuda:0")
    return decide_generation(machine, facts, **{**args, **kw})


FULL = GenerationFacts(layers=(KvLayers("full_attention", 32, 8 * 256),), max_positions=131072)


def test_right_padding_reason_does_not_say_flash_attention_raises() -> None:
    # 5.22.2 and 5.25.0: no model raises on right padding; generation/utils.py only warns.
    generation = _generation(Machine.simulated("A100"), FULL, attention="flash_attention_2")
    assert "FlashAttention raises" not in generation.decision("generation.padding_side").reason
    right = _generation(Machine.simulated("A100"), FULL, padding_side="right")
    assert not any("FlashAttention raises" in w for w in right.warnings)


def test_can_compile_fullgraph_is_not_a_compile_gate() -> None:
    # `_valid_auto_compile_criteria` reads the device, the cache, the quantizer and offloading, never
    # `_can_compile_fullgraph`: with a static cache on a GPU, generate() compiles such a class too.
    facts = replace(FULL, compiles_fullgraph=False)
    generation = _generation(Machine.simulated("A100"), facts, cache_implementation="static")
    compile_ = generation.decision("generation.compile")
    assert generation.compile is True and compile_.value == "reduce-overhead (CUDA graphs)"
    assert "graph breaks" in compile_.reason
    # Not chosen for you on a long decode, but not because generate() would refuse to compile it.
    long = _generation(Machine.simulated("A100"), facts, workload=Workload(prompt_tokens=128, new_tokens=2048))
    static = {r.value: r.reason for r in long.decision("generation.cache_implementation").rejected}["static"]
    assert "will not compile" not in static and "does not read the flag" in static


def test_fa4_reason_on_ampere_is_not_a_transformers_gate() -> None:
    # FLASH_ATTENTION_COMPATIBILITY_MATRIX[4]["cuda_min_major_version"] is read only in
    # `_flash_attn_import_error`, which an installed flash-attn-4 on CUDA never reaches.
    plan_ = plan(Machine.simulated("A100", packages={"flash-attn-4": "4.0.1"}))
    reason = {r.value: r.reason for r in plan_.decision("attn_implementation").rejected}["flash_attention_4"]
    assert "backward needs sm90+" in reason and "no flash_attention_4 kernels" not in reason


# --- item 7: the flash-attn2 Hub-kernel branch depends on transformers and torch ------------------


@pytest.mark.parametrize(
    ("transformers", "torch", "branch"),
    [
        ("5.22.2", "2.9.1", 3),  # `4 if is_torch_greater_or_equal("2.10") else 3`
        ("5.22.2", "2.10.0", 4),
        ("5.24.0", "2.9.1", 3),
        ("5.25.0", "2.9.1", 4),  # 5.25: "kernels-community/flash-attn2": 4, whatever the torch
        ("5.25.0", "2.13.0", 4),
    ],
)
def test_flash_attn2_hub_branch_takes_both_versions(transformers: str, torch: str, branch: int) -> None:
    assert hub_kernel_version("kernels-community/flash-attn2", torch, transformers) == branch
    machine = Machine.simulated("A100", packages={"torch": torch, "transformers": transformers})
    kernel = machine.hub.kernel("kernels-community/flash-attn2")
    assert kernel is not None and kernel.version == branch


# --- item 9: a simulated machine planned from here runs the installed upstream --------------------


def _site(tmp_path: Path, *dists: str) -> list[str]:
    for dist in dists:
        (tmp_path / f"{dist}.dist-info").mkdir()
    return [str(tmp_path)]


def test_simulated_packages_take_the_installed_upstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packages_installed_here: dict[str, str]
) -> None:
    site = _site(tmp_path, "transformers-5.25.0", "torch-2.13.0+cpu", "accelerate-1.16.0", "peft-0.21.2")
    packages = cudaload.facts.packages.packages_here(paths=site)
    # torch's public version (a simulated GPU gets a CUDA build)
    assert packages == {"torch": "2.13.0", "transformers": "5.25.0", "accelerate": "1.16.0", "peft": "0.21.2"}
    monkeypatch.setattr(cudaload.facts.packages, "packages_here", lambda paths=None: packages)
    assert Machine.simulated(packages={"transformers": "5.22.2"}).software.version("transformers") == "5.22.2"
    machine = Machine.simulated("H100", packages={"kernels": "0.19.1"})
    assert machine.software.kernels_range == ("0.19.1", "0.20.0")  # 5.25's KERNELS_MIN/MAX_VERSION
    reasons = " ".join(r.reason for r in plan(machine, hub_kernels=True).decision("attn_implementation").rejected)
    assert "outside" not in reasons and "accepts only" not in reasons


def test_cli_plan_simulates_the_installed_transformers(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str], packages_installed_here: dict[str, str]
) -> None:
    from importlib.metadata import version

    # The installed transformers' own KERNELS_MIN/MAX_VERSION, worked out from its import_utils.
    from transformers.utils import import_utils

    from cudaload.cli import main

    low = str(import_utils.KERNELS_MIN_VERSION)
    path = str(tiny_models["llama"])
    main(["plan", path, "--gpu", "H100", "--with", f"kernels=={low}", "--hub-kernels", "--json"])
    text = "".join(capsys.readouterr())
    # Simulated as 5.22.2 whatever is installed, 5.25's kernels 0.19.1 was "outside the accepted range".
    assert f"kernels {low} is installed but transformers" not in text, (version("transformers"), text[-600:])


# --- item 5: mixed GPUs decide dtype and attention for the GPU the model is placed on -----------


def test_mixed_gpus_judge_the_gpu_the_model_goes_on() -> None:
    # Llama-3-8B (~15 GiB in 16-bit) fits the A100 (80 GB, the most memory): placed there, so bf16
    # (sm80) and FlashAttention-2 (sm80+), not the T4's fp16 + sdpa.
    machine = Machine.simulated(["T4", "A100"], packages=FA2)
    plan_ = plan(machine)
    assert plan_.kwargs["device_map"] == "cuda:1"
    assert plan_.dtype == "bfloat16"
    assert plan_.attention_chain[0] == "flash_attention_2"


def test_mixed_gpus_fp16_fragile_family_gets_bf16_on_the_a100() -> None:
    # Gemma-2-9B: fp16-fragile (vLLM). On the T4 alone float32; placed on the A100, bf16.
    gemma = replace(llama(9), model_type="gemma2", model_class="Gemma2ForCausalLM")
    plan_ = plan(Machine.simulated(["T4", "A100"]), gemma)
    assert plan_.kwargs["device_map"] == "cuda:1" and plan_.dtype == "bfloat16"


def test_mixed_gpus_spread_over_both_keep_the_weakest() -> None:
    # 70B in 16-bit (~131 GiB) exceeds the A100's 64 GiB budget: spread over both, the T4 decides.
    plan_ = plan(Machine.simulated(["T4", "A100"], packages=FA2), llama(70))
    assert plan_.kwargs["device_map"] == "auto"
    assert plan_.dtype == "float16" and plan_.attention_chain == ("sdpa", "eager")


def test_mixed_gpus_pinned_to_the_t4_is_judged_on_the_t4() -> None:
    plan_ = plan(Machine.simulated(["T4", "A100"], packages=FA2), device_map="cuda:0")
    assert plan_.dtype == "float16" and plan_.attention_chain == ("sdpa", "eager")


# --- item 4: FA4 sees the head dims transformers passes, and hd256 by version -------------------


def _mla() -> ModelFacts:
    # DeepSeek-V3: qk_nope 128 + qk_rope 64 = 192, v 128.
    return replace(llama(8), head_dims=(128, 192), qk_v_head_dims=(192, 128))


def test_fa4_on_sm100_refuses_padded_mla() -> None:
    # integrations/flash_attention.py pads V (128) to the query head dim (192): FA4 gets (192, 192).
    plan_ = plan(Machine.simulated("B200", packages={**FA2, "flash-attn-4": "4.0.1"}), _mla())
    assert plan_.attention_chain == ("flash_attention_2", "sdpa", "eager")
    reason = {r.value: r.reason for r in plan_.decision("attn_implementation").rejected}["flash_attention_4"]
    assert "192/192" in reason


@pytest.mark.parametrize(("fa4", "has_fa4"), [("4.0.0b10", False), ("4.0.0b11", True), ("4.0.1", True)])
def test_fa4_head_dim_256_on_sm100_from_4_0_0b11(fa4: str, has_fa4: bool) -> None:
    model = replace(llama(8), head_dim=256, head_dims=(256,))
    plan_ = plan(Machine.simulated("B200", packages={**FA2, "flash-attn-4": fa4}), model)
    assert ("flash_attention_4" in plan_.attention_chain) is has_fa4


# --- item 2: a quantized FSDP / ZeRO-3 rank makes its own GPU current before loading -------------


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_sharded_qlora_ranks_each_load_on_their_own_gpu(strategy: str) -> None:
    # quantizer_bnb_4bit.py `update_device_map`: no device_map -> {"": torch.cuda.current_device()}.
    world = 4
    for rank in range(world):
        launch = Launch(
            "accelerate",
            rank=rank,
            local_rank=rank,
            world_size=world,
            local_world_size=world,
            strategy=strategy,  # type: ignore[arg-type]
            zero_stage=3 if strategy == "deepspeed" else None,
        )
        plan_ = plan(
            Machine.simulated("A100", count=world, packages=BNB, launch=launch),
            training=TrainingRequest(quantize="4bit"),
        )
        assert "device_map" not in plan_.kwargs
        current: list[int] = []
        assert set_rank_device(plan_, current.append) == rank
        assert current == [rank]


def test_unquantized_sharding_and_ddp_set_no_device() -> None:
    fsdp = Launch("accelerate", rank=1, local_rank=1, world_size=2, strategy="fsdp")
    unquantized = plan(
        Machine.simulated("A100", count=2, packages=BNB, launch=fsdp), training=TrainingRequest(quantize=None)
    )
    ddp = Launch("torchrun", rank=1, local_rank=1, world_size=2, strategy="ddp")
    quantized_ddp = plan(
        Machine.simulated("A100", count=2, packages=BNB, launch=ddp), training=TrainingRequest(quantize="4bit")
    )
    for plan_ in (unquantized, quantized_ddp):
        assert set_rank_device(plan_, lambda index: pytest.fail(f"set_device({index})")) is None
    assert quantized_ddp.kwargs["device_map"] == {"": 1}


# --- item 6: final logit softcapping keeps tanh's output for the backward -----------------------


def test_softcapped_logits_cost_one_more_copy() -> None:
    # Gemma 2: logits / cap -> tanh -> * cap; tanh saves its output (d bytes) for the backward.
    # Plain bf16: max(2 + 4 + 4, 3 * 4) = 12 bytes a logit; capped: max(10 + 2, 12 + 2) = 14
    # (measured 11.9 vs 13.9 on a GPU; 4.0 vs 6.0 saved bytes a logit on CPU, saved-tensor hooks).
    assert logits_bytes_per_element("bfloat16", softcapped=True) == 14
    assert logits_bytes_per_element("bfloat16") == 12
    gemma = replace(
        llama(9, vocab=256000),
        model_type="gemma2",
        model_class="Gemma2ForCausalLM",
        linear_names=PROJ,
    )
    args: dict[str, Any] = dict(dtype="bfloat16", quantize=None, r=16, targets=PROJ, seq_len=4096)
    plain = estimate_training_memory(gemma, **args)
    capped = estimate_training_memory(replace(gemma, final_softcap=30.0), **args)
    # 2 bytes x 4096 tokens x 256000 vocabulary = 1.95 GiB more.
    assert capped.activations - plain.activations == 2 * 4096 * 256000


@pytest.mark.slow
def test_softcap_saved_bytes_measured() -> None:
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    def saved_per_logit(cap: float | None) -> float:
        torch.manual_seed(0)
        config = Gemma2Config(
            vocab_size=4096,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            final_logit_softcapping=cap,
            attn_logit_softcapping=None,
        )
        model = Gemma2ForCausalLM(config).to(torch.bfloat16)
        ids = torch.randint(0, 4096, (1, 64))
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.numel() >= 64 * 4096:
                saved[t.data_ptr()] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids)
        return sum(saved.values()) / (64 * 4096)

    assert saved_per_logit(30.0) - saved_per_logit(None) == 2.0  # one bf16 copy: tanh's output


# Hub kernels' GPU coverage, from their build metadata (kernels-community build.toml files)


def _hub_attention(gpu: str) -> tuple[str, list[str]]:
    machine = Machine.simulated(
        gpu,
        packages={"kernels": "0.17.2"},
        cached_kernels=[
            "kernels-community/flash-attn2",
            "kernels-community/vllm-flash-attn3",
            "kernels-community/flash-attn4",
        ],
    )
    plan_ = decide_plan(machine, llama(), Request())
    return plan_.attn_implementation, list(plan_.attention_chain)


def test_the_hub_flash_attn4_build_runs_on_consumer_blackwell() -> None:
    # flash-attn4/build.toml is torch-noarch with FA4 4.0.0.beta8: forward 8-12, backward 9-12 (interface.py);
    # flash-attn2/build.toml builds 8.0, 9.0, 10.0, 12.0. On an RTX 5090 (sm120) both Hub kernels run.
    _, chain = _hub_attention("RTX 5090")
    assert "kernels-community/flash-attn4" in chain and "kernels-community/flash-attn2" in chain
    assert "kernels-community/vllm-flash-attn3" not in chain  # 8.0 and 9.0a only


def test_the_hub_flash_attn4_build_is_not_planned_on_ampere() -> None:
    # forward-only on sm80 (backward needs sm90+): FA2 stays the Ampere kernel.
    _, chain = _hub_attention("A100")
    assert "kernels-community/flash-attn4" not in chain and chain[0] in (
        "kernels-community/vllm-flash-attn3",
        "kernels-community/flash-attn2",
    )
