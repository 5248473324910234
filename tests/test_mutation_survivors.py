"""Rules that a mutation sample (issue 30 item 6, `tools/mutate.py`) could change without any test
failing, or that only the pasted docs output noticed. One test per rule; each docstring names the rule
and the upstream line or measured fact it protects. Every test goes through an entry point that the
issue-30 refactor keeps (`cudaload.plan`, `cudaload.load`, `decide_plan` with a Machine, the Plan and
AppliedPlan it returns, a policy function by name imported inside the test), so moving code between
modules does not break them.

Each test was checked to fail with its rule mutated (`python tools/mutate.py --files ... --tests
tests/test_mutation_survivors.py`, or by hand on a copy of src/)."""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload import CudaloadWarning, Decision, DtypeProbe, Launch, LoadFailedError, Machine, Workload
from cudaload.capability.usable_gpus import gpus_unusable
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.kv_cache import GenerationFacts, KvLayers
from cudaload.facts.machine import ProbeRound
from cudaload.facts.model import any_model
from cudaload.request import GenerationRequest, Request, TrainingRequest
from model_shapes import llama
from model_shapes import tiny as shrunk

GiB = 2**30


def _decide(machine: Machine, model: Any, request: Request) -> cudaload.Plan:
    from cudaload.policy import decide_plan

    return decide_plan(machine, model, request)


# ---- policy: the CPU dtype ----------------------------------------------------------------------


def _probe(bf16_speedup: float, rounds: int = 5) -> DtypeProbe:
    """A probe whose every round measured bf16 `bf16_speedup` times as fast as fp32 (prefill and decode)."""
    prefill = {"float32": 0.010, "bfloat16": 0.010 / bf16_speedup, "float16": 0.010}
    decode = {"float32": 1e-3, "bfloat16": 1e-3 / bf16_speedup, "float16": 1e-3}
    casts = tuple((a, b, 1e-12) for a in DTYPES for b in DTYPES if a != b)
    one = ProbeRound(tuple(prefill.items()), tuple(decode.items()), casts)
    return DtypeProbe(
        in_features=1024,
        out_features=2048,
        prefill_tokens=128,
        prefill_s=tuple((d, statistics.median([prefill[d]] * rounds)) for d in DTYPES),
        decode_s=tuple((d, statistics.median([decode[d]] * rounds)) for d in DTYPES),
        cast_s=casts,
        threads=2,
        measured_at="2026-12-05",
        rounds=(one,) * rounds,
    )


# A 0.6B-shaped model (Qwen3-0.6B: hidden 1024, MLP 3072, 28 layers): its workload takes seconds on a
# CPU, far beyond the 50 ms that NOTICEABLE_S calls unnoticeable.
QWEN_06B = replace(
    any_model(),
    parameters=596_000_000,
    hidden_size=1024,
    num_layers=28,
    vocab_size=151_936,
    linear_shapes=(("down_proj", 3072, 1024, 28), ("gate_proj", 1024, 3072, 28), ("up_proj", 1024, 3072, 28)),
)


def test_estimates_50_ms_apart_are_worth_choosing_between() -> None:
    """NOTICEABLE_S (policy/precision.py): estimated workload times under 50 ms apart are a tie whatever
    the ratio, 50 ms and more are not. Measured: 10 fresh caches of the demo model on an idle Zen 4 put
    bf16 from 1.5x slower to 1.2x faster, milliseconds nobody sees. Literal gaps around the boundary."""
    from cudaload.facts.spread import spread
    from cudaload.policy.precision import _verdict

    rounds = spread([1.5, 1.52, 1.49, 1.51, 1.5])  # bf16 clearly 1.5x faster in every round
    assert rounds is not None
    assert _verdict(rounds, "float32", gap_s=0.049)[::2] == ("float32", True)
    assert "49 ms apart, under the 50 ms worth choosing for" in _verdict(rounds, "float32", gap_s=0.049)[1]
    assert _verdict(rounds, "float32", gap_s=0.050)[::2] == ("bfloat16", False)


@pytest.mark.parametrize(("speedup", "chosen"), [(1.3, "bfloat16"), (1 / 1.3, "float32")])
@pytest.mark.parametrize("checkpoint", ["float32", "bfloat16"])
def test_bf16_wins_exactly_when_its_rounds_are_faster(speedup: float, chosen: str, checkpoint: str) -> None:
    """The bf16 win threshold (policy/precision.py `_verdict`): past the 15% tie margin, bf16 is chosen
    when its median ratio to fp32 is above 1 (faster), fp32 when below, whatever the checkpoint's dtype.
    1.3x is the kind of gap measured between these dtypes on the project's CPUs (benchmarks/README.md)."""
    machine = Machine.simulated(None, dtype_probe=_probe(speedup))
    model = replace(QWEN_06B, checkpoint_dtype=checkpoint)
    decision = _decide(machine, model, Request(workload=Workload(512, 128))).decision("dtype")
    assert decision.value == chosen
    assert "tie" not in decision.reason.split(":")[0]


# ---- policy: placement ----------------------------------------------------------------------------


def _tp_model(parameters: int) -> Any:
    return replace(llama(8), parameters=parameters, attention_heads=32, kv_heads=8, tp_plan=True)


def test_weights_that_exactly_fill_one_gpus_budget_are_not_tensor_parallel() -> None:
    """Tensor parallelism boundary (policy/placement.py `decide_tensor_parallel`): weights up to and
    including 80% of one GPU (HEADROOM, fit.py; accelerate itself keeps 10% free) fit it, so each rank
    holds a whole copy; one byte more and a 1/2 shard per rank is planned. 10 GiB GPUs: budget 8 GiB."""
    launch = Launch("torchrun", rank=0, local_rank=0, world_size=2, local_world_size=2, strategy="ddp")
    machine = Machine.simulated("custom:sm90:10GiB", count=2, launch=launch)
    exact = _decide(machine, _tp_model(4 * GiB), Request())  # bf16: 2 bytes a parameter = 8 GiB
    assert exact.decision("tp_plan").value is None
    assert "fit one GPU" in exact.decision("tp_plan").reason
    assert exact.kwargs["device_map"] == {"": 0}
    over = _decide(machine, _tp_model(4 * GiB + 1), Request())
    assert over.decision("tp_plan").value == "auto" and over.kwargs["tp_plan"] == "auto"


def _two_gpus(first: int, second: int) -> Machine:
    base = Machine.simulated("custom:sm90:80GiB", count=2)
    a, b = base.gpus
    return replace(base, gpus=(replace(a, total_memory=first), replace(b, total_memory=second)))


def test_training_that_exceeds_all_gpus_together_stays_on_one_and_warns() -> None:
    """Training-overflow boundary (policy/placement.py `_gpu_placement`): when the weights fit one GPU
    but the whole training run (weights, LoRA + AdamW, activations) exceeds even all GPUs together, at
    90% of each (TRAINING_SHARE, fit.py), spreading the weights cannot help: they stay on one GPU and the
    plan warns of an out-of-memory error. A run that just fits the GPUs together is spread over them."""
    request = Request(training=TrainingRequest(quantize=None))
    model = llama(1)
    total = _decide(Machine.simulated("H100"), model, request).finetune.memory_estimate["16bit"]["total"]
    first = 6 * GiB  # the weights (~3.6 GiB in bf16) fit its 80%
    left = total - int(first * 0.9)
    second = next(m for m in range(math.ceil(left / 0.9) - 3, math.ceil(left / 0.9) + 4) if int(m * 0.9) == left)
    just_fits = _decide(_two_gpus(first, second), model, request)
    assert just_fits.finetune.memory_estimate["16bit"]["total"] == total  # the estimate ignores GPU sizes
    assert just_fits.kwargs["device_map"] == "auto"
    assert not any("out-of-memory" in w for w in just_fits.warnings)
    over = _decide(_two_gpus(first, second - 2), model, request)
    assert over.kwargs["device_map"] == "cuda:0"
    assert any("expect an out-of-memory error" in w for w in over.warnings)


# ---- policy: generation ---------------------------------------------------------------------------

# Llama-3-8B's cache layout (32 layers x 8 KV heads x 128 x K and V): the static-cache rule is about
# the workload, not the model.
FULL = GenerationFacts(layers=(KvLayers("full_attention", 32, 8 * 256),), max_positions=131072)


def _cache(machine: Machine, prompt: int, new: int) -> str | None:
    model = replace(llama(8), generation=FULL)
    request = Request(workload=Workload(prompt, new), generation=GenerationRequest(True))
    gen = _decide(machine, model, request).generation
    assert gen is not None
    return gen.cache_implementation


def test_static_cache_needs_at_least_as_many_new_tokens_as_prompt_tokens() -> None:
    """The static cache's decode >= prompt rule (policy/generation.py): generate() torch.compiles a
    static-cache forward (`_valid_auto_compile_criteria`, generation/utils.py), a warm-up repaid only when
    the decode is at least as long as the prompt it reads; equal counts."""
    h100 = Machine.simulated("H100")
    assert _cache(h100, prompt=512, new=512) == "static"
    assert _cache(h100, prompt=513, new=512) == "dynamic"


def test_static_cache_starts_at_256_new_tokens() -> None:
    """DECODE_HEAVY_TOKENS = 256 (policy/generation.py): from 256 generated tokens (and no fewer than the
    prompt's) the compile warm-up is repaid; 255 stay on transformers' default dynamic cache. Before this
    test only the pasted output of docs/generation.md noticed the constant."""
    h100 = Machine.simulated("H100")
    assert _cache(h100, prompt=100, new=256) == "static"
    assert _cache(h100, prompt=100, new=255) == "dynamic"
    assert _cache(h100, prompt=100, new=512) == "static"


def test_a_cpu_kv_cache_may_take_60_percent_of_the_ram_left_beside_the_weights() -> None:
    """CPU_SHARE = 0.6 (policy/generation.py): on a CPU the KV budget is 60% of the available RAM minus
    the weights, transformers' continuous batching's share for cpu/mps
    (transformers 5.22-5.25 generation/continuous_batching/initialization.py: resolve_max_memory_percent).
    Before this test only pasted docs output noticed the constant."""
    machine = Machine.simulated(None, cpu_memory_gib=64)
    available = machine.cpu.memory_available
    assert available is not None
    model = replace(llama(1), parameters=1_000_000_000, generation=FULL)
    request = Request(dtype="bfloat16", generation=GenerationRequest(True))
    gen = _decide(machine, model, request).generation
    assert gen is not None
    assert gen.budget_bytes == int((available - 2_000_000_000) * 0.6)
    assert "60% of the RAM left beside the weights" in gen.decision("generation.max_batch").reason


# ---- policy: fine-tuning -------------------------------------------------------------------------


def test_a_cpu_lora_dropout_mask_costs_4_bytes_per_input_a_gpu_one_1() -> None:
    """CPU dropout-mask bytes (policy/memory.py `layer_bytes_per_token`): each LoRA adapter keeps its
    dropout mask for the backward (peft 0.21.2 tuners/lora/layer.py: Linear.forward, `lora_B(lora_A(dropout(x)))`):
    a bool mask on CUDA (1 byte an element), a float noise tensor on CPU (torch's dropout: 4 bytes). So
    the CPU estimate's activations exceed the GPU one's by 3 bytes per adapter input element per token."""
    from cudaload.policy.memory import estimate_training_memory

    model = llama(1)
    targets = ("q_proj", "v_proj")
    fan_in = sum(fan_in * count for name, fan_in, _, count in model.linear_shapes if name in targets)
    tokens = 256
    args: dict[str, Any] = dict(dtype="float32", quantize=None, r=16, targets=targets, seq_len=tokens)
    cpu = estimate_training_memory(model, **args, checkpointing=False, on_gpu=False)
    gpu = estimate_training_memory(model, **args, checkpointing=False, on_gpu=True)
    assert cpu.activations - gpu.activations == (4 - 1) * fan_in * tokens


@pytest.mark.parametrize("checkpointing", [True, False])
def test_fine_tuning_turns_the_kv_cache_off(checkpointing: bool) -> None:
    """use_cache while fine-tuning (policy `_training_cache`): off whether or not checkpointing is on;
    training reads no KV cache. With checkpointing, transformers would turn it off itself with a warning
    ("Caching is incompatible with gradient checkpointing", modeling_layers.py
    `GradientCheckpointingLayer.__call__`), and the reason says so only then."""
    request = Request(training=TrainingRequest(quantize=None, gradient_checkpointing=checkpointing))
    plan = _decide(Machine.simulated("H100"), llama(1), request)
    assert plan.finetune is not None and plan.finetune.use_cache is False
    decision = plan.decision("use_cache")
    assert decision.value is False and [r.value for r in decision.rejected] == [True]
    assert ("transformers would turn it off under checkpointing" in decision.reason) is checkpointing


@pytest.fixture(scope="module")
def config_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama config.json and nothing else: plan() reads configs, never weights."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("config-only")
    LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(path)
    return path


def test_fine_tuning_plans_for_2048_tokens_by_default(config_only: Path) -> None:
    """The default seq_len (planner `plan(seq_len=None)`, documented as 2048 in plan()'s docstring and in
    docs/finetune.md) and batch_size 1: a plan that names neither estimates the memory of 2048 x 1.
    Before this test only pasted docs output noticed the default."""
    h100 = Machine.simulated("H100")
    default = cudaload.plan(str(config_only), machine=h100, finetune=True, quantize=None)
    named = cudaload.plan(str(config_only), machine=h100, finetune=True, quantize=None, seq_len=2048, batch_size=1)
    other = cudaload.plan(str(config_only), machine=h100, finetune=True, quantize=None, seq_len=2047)
    assert default.finetune is not None and named.finetune is not None and other.finetune is not None
    assert default.finetune.memory_estimate["assumes"] == {
        "seq_len": 2048,
        "batch_size": 1,
        "gradient_checkpointing": True,
    }
    assert default.finetune.memory_estimate == named.finetune.memory_estimate
    assert default.finetune.memory_estimate["16bit"] != other.finetune.memory_estimate["16bit"]


# ---- planner --------------------------------------------------------------------------------------


def test_gpus_torch_cannot_drive_are_planned_as_a_cpu_and_its_dtype_measured(
    monkeypatch: pytest.MonkeyPatch, config_only: Path
) -> None:
    """The planner's usable-machine line (planner `with_measurements`): the CPU dtype probe runs when the plan
    runs on the CPU, which includes a machine whose GPUs this torch cannot drive (a CPU-only torch build
    beside an NVIDIA GPU: policy/devices.py `usable_machine`), not only a machine without GPUs."""
    import cudaload.capability

    h100 = Machine.simulated("H100")
    software = replace(h100.software, torch_cuda=None)
    # what detect() finds for it: the GPUs this torch cannot drive (capability/usable_gpus.py)
    cpu_torch = replace(h100, software=software, gpus_unusable=gpus_unusable(h100.gpus, software))
    monkeypatch.setattr(cudaload.capability, "detect", lambda: cpu_torch)
    plan = cudaload.plan(str(config_only))
    assert any("planned for the CPU" in w for w in plan.warnings)
    assert plan.kwargs["device_map"] == "cpu"
    assert "probed on this CPU" in plan.decision("dtype").reason


# ---- load() ---------------------------------------------------------------------------------------


@pytest.fixture
def from_pretrained_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The attn_implementation of each AutoModelForCausalLM.from_pretrained call (each reads the weights)."""
    import transformers

    calls: list[str] = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("attn_implementation"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    return calls


def _after_from_pretrained(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    """Let from_pretrained load for real, then `change(model)`: what transformers did, seen by load()."""
    import transformers

    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def changed(cls: Any, *args: Any, **kwargs: Any) -> Any:
        loaded = original(cls, *args, **kwargs)
        change(loaded[0] if isinstance(loaded, tuple) else loaded)  # (model, loading info) when asked
        return loaded

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(changed))


@pytest.mark.slow
def test_an_attention_you_chose_never_falls_back(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, from_pretrained_calls: list[str]
) -> None:
    """An explicit attn_implementation does not fall back (load(): "never silently change what the user
    set explicitly", docs/how-it-works.md step 5): flash_attention_2 that transformers refuses at load
    (`_flash_attn_import_error` raises ImportError: no flash-attn here) raises LoadFailedError saying you
    chose it, after one from_pretrained; left to cudaload the same refusal falls back to sdpa
    (tests/test_fallback_attribution.py)."""
    import transformers.modeling_flash_attention_utils as flash_utils

    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    with pytest.raises(LoadFailedError, match=r"'flash_attention_2' failed at load: ImportError: .*you chose it"):
        cudaload.load(
            str(tiny_models["llama"]),
            machine=a100,
            attn_implementation="flash_attention_2",
            device_map="cpu",
            dtype="bfloat16",
        )
    assert from_pretrained_calls == ["flash_attention_2"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("device_map", "offloaded", "where"),
    [
        ({"model": 0, "lm_head": "cpu"}, ("lm_head -> cpu",), "over cpu, cuda:0"),  # beside a GPU: the CPU is slow
        ({"model": "cpu", "lm_head": "disk"}, ("lm_head -> disk",), "over cpu, disk"),  # no GPU: only the disk is
        ({"": "cpu"}, (), "cpu"),
    ],
)
def test_modules_on_the_cpu_beside_a_gpu_are_reported_as_offloaded(
    tiny_models: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    device_map: dict[str, Any],
    offloaded: tuple,
    where: str,
) -> None:
    """Offload reporting (load(): `AppliedPlan.offloaded` and its warning, from the model's
    `hf_device_map`, known only after loading): modules accelerate put on "disk" are always offloaded,
    on "cpu" only when a GPU holds the rest (every forward then copies them over PCIe); a CPU-only
    model is not offloaded. The device map is the one transformers sets (modeling_utils: hf_device_map).
    The load's log line names the one place, or every place the map spreads over."""
    import logging

    def mapped(model: Any) -> None:
        model.hf_device_map = dict(device_map)

    _after_from_pretrained(monkeypatch, mapped)
    plan = cudaload.plan(str(tiny_models["llama"]), machine=Machine.simulated(), dtype="float32")
    with warnings.catch_warnings(record=True), caplog.at_level(logging.INFO, logger="cudaload"):
        warnings.simplefilter("always")
        model = cudaload.load(plan, verify=False)
    applied = model.cudaload_plan
    assert applied.offloaded == offloaded
    assert any("device_map offloaded" in w for w in applied.warnings) is bool(offloaded)
    assert any(f" on device_map {where}: dtype=" in r.getMessage() for r in caplog.records), caplog.text


class _Stop(Exception):
    """Raised by the fakes below: stops load() where the test has seen what it wanted."""


@pytest.mark.slow
@pytest.mark.parametrize(("cuda_device", "set_to"), [(1, [1]), (2, [])])
def test_load_makes_the_ranks_gpu_current_before_from_pretrained(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, cuda_device: int, set_to: list[int]
) -> None:
    """A plan with a "cuda_device" decision (a quantized FSDP / ZeRO-3 rank: its loader places weights on
    `torch.cuda.current_device()`, transformers' bitsandbytes quantizer) has load() call
    torch.cuda.set_device with that index before from_pretrained, on a process that has that GPU; with
    2 GPUs, index 2 is not there (a plan made for another machine): set_device is not called and the
    load goes on to from_pretrained, which fails on its own terms."""
    import torch
    import transformers

    plan = cudaload.plan(str(tiny_models["llama"]), machine=Machine.simulated(), dtype="float32")
    rank = replace(plan, decisions=(*plan.decisions, Decision("cuda_device", cuda_device, "this rank's GPU")))
    calls: list[Any] = []

    def set_device(index: int) -> None:
        calls.append(index)
        raise _Stop

    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("from_pretrained")
        raise _Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(from_pretrained))
    with pytest.raises((_Stop, LoadFailedError)):
        cudaload.load(rank)
    assert calls == (set_to or ["from_pretrained"])


@pytest.mark.slow
def test_a_loaded_model_in_another_dtype_keeps_the_planned_generation_and_says_so(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """load() selects, it does not re-plan (issue 30 item 1): a model that holds another compute dtype than
    the plan's (`model.dtype`, the first floating parameter's:
    transformers 5.22-5.25 modeling_utils.py: ModuleUtilsMixin.dtype) keeps the
    plan's generation section and gets a note naming both dtypes, since its KV cache is kept in the model's;
    a storage dtype that is no compute dtype (fp8 weights, as FineGrainedFP8 stores them) gets none."""
    import torch

    plan = cudaload.plan(str(tiny_models["llama"]), machine=Machine.simulated(), dtype="float32", generate=True)
    assert plan.generation is not None and plan.generation.dtype == "float32"

    _after_from_pretrained(monkeypatch, lambda model: model.to(torch.bfloat16))
    with pytest.warns(CudaloadWarning) as said:
        applied = cudaload.load(plan, verify=False).cudaload_plan
    # Two facts, said once each: the generation sizes assumed float32; the plan's dtype was not applied.
    assert sorted(str(w.message).split(": ", 1)[1][:40] for w in said) == [
        "the generation plan (KV cache per token,",
        "the plan's dtype is float32, and the loa",
    ]
    assert applied.dtype == "bfloat16" and applied.plan.generation == plan.generation
    (note,) = [w for w in applied.warnings if "generation plan" in w]
    assert "made for float32, and the loaded model holds bfloat16" in note

    def fp8_storage(model: Any) -> None:
        first = next(p for p in model.parameters() if p.is_floating_point())
        first.data = first.data.to(torch.float8_e4m3fn)

    _after_from_pretrained(monkeypatch, fp8_storage)
    stored = cudaload.load(plan, verify=False)
    assert str(stored.dtype) == "torch.float8_e4m3fn"
    assert stored.cudaload_plan.plan.generation == plan.generation
    assert not [w for w in stored.cudaload_plan.warnings if "generation plan" in w]


# ---- more survivors of the seeded sample (tools/mutate.py, seed 0) --------------------------------


@pytest.mark.parametrize(
    ("model_type", "launched", "refused"),
    [("gemma2", "fp16", True), ("gemma2", "bf16", False), ("gemma2", None, False), ("llama", "fp16", False)],
)
def test_a_launchers_fp16_is_refused_only_for_a_family_that_overflows_in_it(
    model_type: str, launched: str | None, refused: bool
) -> None:
    """`accelerate launch --mixed_precision fp16` (ACCELERATE_MIXED_PRECISION) fine-tuning an fp16-fragile
    family raises (policy.training `launched_precision_warnings`): both conditions, not either. The families are
    vLLM's `_FLOAT16_NOT_SUPPORTED_MODELS` (vllm/config/model.py, "Numerical instability"), upstream.py."""
    from cudaload.errors import DtypeUnsupportedError

    launch = Launch("accelerate", rank=0, local_rank=0, world_size=2, local_world_size=2, mixed_precision=launched)
    machine = Machine.simulated("A100", count=2, launch=launch)
    model = replace(llama(1), model_type=model_type)
    request = Request(training=TrainingRequest(quantize=None))
    if refused:
        with pytest.raises(DtypeUnsupportedError, match=r"mixed_precision fp16.*overflows in float16"):
            _decide(machine, model, request)
    else:
        assert _decide(machine, model, request).finetune is not None


def test_a_misspelt_attention_gets_the_nearest_known_name(config_only: Path) -> None:
    """An attn_implementation transformers does not know raises with the nearest known name (planner's
    check against `ALL_ATTENTION_FUNCTIONS.valid_keys()`, transformers modeling_utils), never a bare
    refusal: the error says what to do."""
    with pytest.raises(cudaload.AttentionUnavailableError, match=r"did you mean 'sdpa'\?"):
        cudaload.plan(str(config_only), machine=Machine.simulated(), attn_implementation="spda")


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("3KB", 3_000),
        ("3KiB", 3 * 1024),
        ("2MB", 2_000_000),
        ("2MiB", 2 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("1.5GiB", 3 * 2**29),
        ("1TB", 10**12),
        ("1TiB", 2**40),
    ],
)
def test_max_memory_sizes_are_read_as_accelerate_reads_them(value: str, size: int) -> None:
    """A max_memory string in bytes (policy/fit.py `size_bytes`) as accelerate's `convert_file_size_to_int`
    reads it (accelerate/utils/modeling.py, 1.16: "KB" 10**3 ... "TB" 10**12, "KiB" 2**10 ... "TiB" 2**40)."""
    from cudaload.policy.fit import size_bytes

    assert size_bytes(value) == size


@pytest.mark.parametrize(
    ("attention", "flash"),
    [
        ("flash_attention_2", True),
        ("kernels-community/flash-attn3", True),
        ("kernels-community/vllm-flash-attn3", True),
        ("kernels-community/sage-attention", False),
        ("sdpa", False),
    ],
)
def test_a_hub_kernel_of_flash_attention_counts_as_flash_attention(attention: str, flash: bool) -> None:
    """FlashAttention from its package or from a Hub kernel repo whose name holds "flash-attn" takes no
    padding mask (policy/attention.py `is_flash_attention`): what the generation plan's CUDA-graph and
    fullgraph notes hang on (transformers' continuous batching captures graphs only without a mask)."""
    from cudaload.policy.attention import is_flash_attention

    assert is_flash_attention(attention) is flash


@pytest.mark.parametrize(("billions", "warned"), [(1, False), (70, True)])
def test_sharded_ranks_are_warned_of_ram_only_when_their_full_copies_exceed_it(billions: float, warned: bool) -> None:
    """FSDP / ZeRO-3 loading (policy/placement.py `_sharded_placement`): each rank of a node builds a full
    CPU copy before sharding (no zero.Init / cpu_ram_efficient_loading: the model is built before
    TrainingArguments, modeling_utils.py `is_deepspeed_zero3_enabled()`), so the plan warns when ranks x
    weights exceed 80% of the RAM, and only then. 4 ranks on 64 GiB: 1B (~2.3 GiB each) fits, 70B does not."""
    launch = Launch("torchrun", rank=0, local_rank=0, world_size=4, local_world_size=4, strategy="fsdp")
    machine = Machine.simulated("A100", count=4, launch=launch, cpu_memory_gib=64)
    plan = _decide(machine, llama(billions), Request())
    assert any("expect an OOM kill" in w for w in plan.warnings) is warned


def test_8bit_training_keeps_the_matmul_inputs_too() -> None:
    """LLM.int8 training memory (policy/memory.py `layer_bytes_per_token`): bitsandbytes' MatMul8bitLt saves
    its input for the backward (bitsandbytes 0.50.2 autograd/_functions.py: MatMul8bitLt.forward,
    `ctx.tensors = (CAt, subA, A)`), so per layer and token an 8-bit run keeps d x (2 hidden + attention + MLP)
    bytes more than a 16-bit one: the two norms' outputs, the attention output and the MLP product."""
    from cudaload.policy.memory import estimate_training_memory

    model = llama(8)  # hidden 4096, attention 4096, MLP 14336, 32 layers
    args: dict[str, Any] = dict(dtype="bfloat16", r=16, targets=("q_proj",), seq_len=128, checkpointing=False)
    eight = estimate_training_memory(model, quantize="8bit", **args)
    sixteen = estimate_training_memory(model, quantize=None, **args)
    assert eight.activations - sixteen.activations == 32 * 128 * 2 * (2 * 4096 + 4096 + 14336)


def test_fp8_weights_are_kept_from_sm89_on(tmp_path: Path) -> None:
    """A FineGrainedFP8 checkpoint runs as stored on compute capability 8.9 and up (L4, L40, RTX 4090:
    transformers 5.22-5.25 quantizer_finegrained_fp8.py: FineGrainedFP8HfQuantizer.validate_environment),
    and is dequantized to bf16 below (A100, sm80);
    sm89 itself is the boundary (tests/test_prequantized.py covers H100 and A100)."""
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    ).save_pretrained(tmp_path)
    l4 = cudaload.plan(str(tmp_path), machine=Machine.simulated("L4"))
    assert l4.decision("checkpoint_quantization").value == "fp8"
    a100 = cudaload.plan(str(tmp_path), machine=Machine.simulated("A100"))
    assert a100.decision("checkpoint_quantization").value != "fp8"


def test_a_tiny_models_clear_bf16_ratio_is_still_a_tie_on_the_cpu() -> None:
    """decide_plan applies NOTICEABLE_S to the two CPU estimates it has (policy/precision.py
    `_measured_choice`): a model so small that bf16's clear 1.5x lead is worth milliseconds keeps the
    checkpoint's dtype (the measured demo model: 10 fresh caches on a Zen 4 put bf16 from 1.5x slower to 1.2x
    faster)."""
    tiny = shrunk(QWEN_06B, checkpoint_dtype="float32")
    machine = Machine.simulated(None, dtype_probe=_probe(1.5))
    decision = _decide(machine, tiny, Request(workload=Workload(8, 2))).decision("dtype")
    assert decision.value == "float32"
    assert "ms apart, under the 50 ms worth choosing for" in decision.reason


def test_a_workload_that_generates_nothing_costs_no_decode_time() -> None:
    """policy/measured.py `record_estimate`: a prefill-only workload (new_tokens=0, as a training or scoring
    run is) spends no time decoding; the first new token comes out of the prefill, so decode starts at the
    second one and never goes below zero (a survivor of the seed-0 sample: `max(0, ...)` -> `max(-1, ...)`)."""
    from cudaload.facts.machine import TunedVariant, TuningRecord
    from cudaload.policy.measured import record_estimate

    variant = TunedVariant("bfloat16", "sdpa", load_s=0.5, prefill_s=0.2, decode_tokens_per_s=10.0)
    record = TuningRecord("shape", 512, 128, (variant,), (("cpu", "x"),), "2026-12-05")
    for new_tokens, decode in [(0, 0.0), (1, 0.0), (2, 0.1), (11, 1.0)]:
        estimate = record_estimate(variant, record, Workload(prompt_tokens=512, new_tokens=new_tokens))
        assert math.isclose(estimate.decode, decode) and estimate.decode >= 0, (new_tokens, estimate)
        assert math.isclose(estimate.prefill, 0.2)


# ---- survivors of the seed-0 sample on the split tree, with coverage selection (tools/mutate.py) -----------


def _without(probe: DtypeProbe, **missing: str) -> DtypeProbe:
    """`probe` with one dtype's prefill and/or decode timing left out, as a record written before that
    dtype was timed reads (e.g. `decode="bfloat16"`)."""
    prefill = tuple(p for p in probe.prefill_s if p[0] != missing.get("prefill"))
    decode = tuple(p for p in probe.decode_s if p[0] != missing.get("decode"))
    return replace(probe, prefill_s=prefill, decode_s=decode, rounds=())


@pytest.mark.parametrize("missing", [{"decode": "bfloat16"}, {"prefill": "bfloat16"}, {"decode": "float32"}])
def test_a_probe_that_did_not_time_a_dtype_estimates_nothing_for_it(missing: dict[str, str]) -> None:
    """policy/measured.py `probe_estimate` and policy/precision.py `_probe_ratios`: a dtype the probe has
    no prefill or no decode timing for gets no estimate and no "x faster" ratio (either one missing is
    enough), rather than a TypeError from multiplying None; your dtype is still kept, as "your choice"."""
    from cudaload.policy.measured import probe_estimate

    probe = _without(_probe(2.0), **missing)
    model = replace(any_model(), parameters=600_000_000, hidden_size=1024, vocab_size=151_936)
    dtype = next(iter(missing.values()))
    assert probe_estimate(probe, model, dtype, Workload(512, 128)) is None
    assert probe_estimate(probe, model, "float16", Workload(512, 128)) is not None
    decision = _decide(Machine.simulated(None, dtype_probe=probe), model, Request(dtype="bfloat16")).decision("dtype")
    assert (decision.value, decision.reason, decision.source) == ("bfloat16", "your choice", "user")
    # The same machine with every timing says how much faster it measured bf16.
    timed = _decide(Machine.simulated(None, dtype_probe=_probe(2.0)), model, Request(dtype="bfloat16"))
    assert "2.0x faster than fp32" in timed.decision("dtype").reason


def test_rounds_that_estimate_no_time_compare_nothing() -> None:
    """policy/measured.py `compare_rounds`: a round that estimates 0 s for either dtype (a model of unknown
    size: 0 parameters, no width; or a record with a 0 s timing), or none at all, is no basis for a ratio, so
    the comparison is None, not a ZeroDivisionError or a ratio of 0. A small model's sub-second rounds still
    compare."""
    from cudaload.policy.measured import compare_rounds

    unknown = replace(any_model(), parameters=0, hidden_size=None, vocab_size=None)
    assert compare_rounds(_probe(2.0), unknown, Workload(512, 128), "bfloat16") is None
    small = replace(any_model(), parameters=1_000_000, hidden_size=64, vocab_size=256)
    spread = compare_rounds(_probe(2.0), small, Workload(8, 2), "bfloat16")
    assert spread is not None and math.isclose(spread.median, 2.0, rel_tol=1e-6)
    zero_bf16 = _probe(math.inf)  # bf16 timed at 0 s
    no_load = Workload(8, 2, include_load=False)  # (casting the weights would add the casts' time)
    assert compare_rounds(_probe(2.0), small, no_load, "bfloat16") is not None
    assert compare_rounds(zero_bf16, small, no_load, "bfloat16") is None
    assert compare_rounds(zero_bf16, small, no_load, "float32", reference="bfloat16") is None
    # A round without one of the two dtypes' timings compares nothing either, whichever is missing.
    untimed = _without(_probe(2.0), decode="bfloat16")
    assert compare_rounds(untimed, small, no_load, "bfloat16") is None
    assert compare_rounds(untimed, small, no_load, "float32", reference="bfloat16") is None


def test_a_tuning_record_that_measured_no_decode_speed_costs_no_decode_time() -> None:
    """policy/measured.py `record_estimate`: a variant recorded with 0 tokens/s (its decode was not
    measured) adds no decode time, rather than dividing by zero."""
    from cudaload.facts.machine import TunedVariant, TuningRecord
    from cudaload.policy.measured import record_estimate

    variant = TunedVariant("bfloat16", "sdpa", load_s=0.5, prefill_s=0.2, decode_tokens_per_s=0.0)
    record = TuningRecord("shape", 512, 128, (variant,), (("cpu", "x"),), "2026-12-05")
    estimate = record_estimate(variant, record, Workload(prompt_tokens=512, new_tokens=64))
    assert estimate.decode == 0.0 and math.isclose(estimate.prefill, 0.2)


def _small_qwen3() -> Any:
    """A 2-layer Qwen3 config (GQA 4/2 heads of 64): plans through `cudaload.plan` like a saved checkpoint."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, dtype="bfloat16",
    )  # fmt: skip


def test_the_shortest_generation_context_is_one_token() -> None:
    """policy/generation.py `_context`: `context=1` (a single-token prompt, nothing generated beyond it)
    is a valid context and sizes the batch for one token; 0 and below are refused."""
    from cudaload.errors import SettingError

    config = _small_qwen3()
    h100 = Machine.simulated("H100")
    one = cudaload.plan(config, machine=h100, generate=True, context=1).generation
    two = cudaload.plan(config, machine=h100, generate=True, context=2).generation
    assert one is not None and two is not None and one.max_batch is not None and two.max_batch is not None
    assert one.max_batch >= 2 * two.max_batch - 1  # one token of KV cache per sequence: twice the sequences
    with pytest.raises(SettingError, match="context=0"):
        cudaload.plan(config, machine=h100, generate=True, context=0)


def test_compressed_int4_weights_decompress_even_when_optimized_inference_is_asked() -> None:
    """policy/checkpoint_quantization.py: compressed-tensors keeps weights compressed only on its FP8
    kernel path, which needs FP8 weights *and* use_optimized_inference *and* sm89+
    (quantizer_compressed_tensors.py `_process_model_after_weight_loading`, `validate_environment`): int4
    weights with use_optimized_inference=True on an H100 still decompress on the first forward."""
    from cudaload.facts.stored_weights import read_quantization_config
    from cudaload.policy.checkpoint_quantization import decide_checkpoint_quantization

    def config(num_bits: int, kind: str) -> dict[str, Any]:
        weights = {"num_bits": num_bits, "type": kind, "strategy": "group", "group_size": 128}
        groups = {"group_0": {"targets": ["Linear"], "weights": weights}}
        return {"quant_method": "compressed-tensors", "use_optimized_inference": True, "config_groups": groups}

    h100 = Machine.simulated("H100", packages={"compressed-tensors": "0.15.0"})
    int4 = replace(any_model(), parameters=1000, quantization=read_quantization_config(config(4, "int")))
    fp8 = replace(any_model(), parameters=1000, quantization=read_quantization_config(config(8, "float")))
    int4_plan = decide_checkpoint_quantization(h100, int4, "bfloat16", use_kernels=False)
    fp8_plan = decide_checkpoint_quantization(h100, fp8, "bfloat16", use_kernels=False)
    assert int4_plan is not None and fp8_plan is not None
    assert "first forward" in int4_plan.decision.reason
    assert fp8_plan.decision.value == "compressed-tensors" and "first forward" not in fp8_plan.decision.reason


def test_upstreams_map_judges_only_cudaloads_own_spread() -> None:
    """policy/placement.py `judge_upstream_placement`: where transformers' own device_map would offload,
    cudaload warns only for the max_memory spread it made itself; a plan on one device (no max_memory) or
    with your device_map or max_memory is returned as it is (your caps are judged by `_capped_placement`)."""
    from cudaload.policy.placement import judge_upstream_placement

    config = _small_qwen3()
    two = Machine.simulated("A10G", count=2)
    landed = {"cuda:0": GiB, "cpu": 2 * GiB}
    one_device = cudaload.plan(config, machine=two)
    assert "max_memory" not in one_device.kwargs
    assert judge_upstream_placement(one_device, landed) is one_device
    for yours in (
        cudaload.plan(config, machine=two, device_map="auto", max_memory={0: "10GiB", 1: "10GiB"}),
        cudaload.plan(config, machine=two, max_memory={0: "10GiB", 1: "10GiB"}),  # device_map "auto" from the caps
    ):
        assert yours.kwargs["device_map"] == "auto" and yours.kwargs["max_memory"] == {0: "10GiB", 1: "10GiB"}
        assert judge_upstream_placement(yours, landed) is yours, yours.explicit
    your_map = cudaload.plan(config, machine=two, device_map="auto")  # no max_memory: upstream's own map as is
    assert judge_upstream_placement(your_map, landed) is your_map
    ours = replace(one_device, kwargs={**one_device.kwargs, "device_map": "auto", "max_memory": {0: "1GiB"}})
    judged = judge_upstream_placement(ours, landed)
    assert judged is not ours and any("~2.0 GiB on CPU" in w for w in judged.warnings)


def test_a_layer_of_unknown_shape_saves_no_estimated_activations() -> None:
    """policy/memory.py `layer_bytes_per_token`: a model whose hidden size or layer count is unknown gets 0
    activation bytes per layer (the estimate does not invent a 1-wide or 1-layer model); a known shape gets a
    positive estimate."""
    from cudaload.policy.memory import layer_bytes_per_token

    known = llama(1)
    assert layer_bytes_per_token(known, "bfloat16", None, ("q_proj",), on_gpu=True) > 0
    for unknown in (replace(known, hidden_size=None), replace(known, num_layers=None)):
        assert layer_bytes_per_token(unknown, "bfloat16", None, ("q_proj",), on_gpu=True) == 0


def test_the_applied_report_lists_six_weights_and_counts_the_rest() -> None:
    """loaders/applied.py: `AppliedPlan.explain()` names at most six unexpected (or missing) weights and
    counts the others, so a headless load of a model with hundreds of head weights stays readable."""
    from cudaload.loaders.applied import AppliedPlan

    plan = _decide(Machine.simulated(None), any_model(), Request())
    keys = tuple(f"head.w{i}" for i in range(8))
    text = AppliedPlan(plan, "sdpa", "float32", "cpu", None, unexpected_weights=keys).explain()
    assert "head.w5" in text and "head.w6" not in text and "(and 2 more)" in text
    six = AppliedPlan(plan, "sdpa", "float32", "cpu", None, unexpected_weights=keys[:6]).explain()
    assert "head.w5" in six and "more)" not in six


def test_adapting_fused_experts_turns_the_default_dropout_off() -> None:
    """policy/training.py `decide_lora`: `target_parameters` (peft's ParamWrapper, which raises "does not work
    with lora_dropout != 0", peft/tuners/lora/layer.py) is planned with lora_dropout 0 when you did not set a
    dropout, instead of refusing cudaload's own default of 0.05; a dropout you set is refused."""
    from transformers import Qwen3MoeConfig

    from cudaload.errors import FinetuneConfigError

    config = Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    experts = ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    planned = cudaload.plan(config, finetune=True, quantize=None, lora={"target_parameters": experts})
    assert planned.finetune is not None
    assert planned.finetune.lora["lora_dropout"] == 0.0 and planned.finetune.lora["target_parameters"] == experts
    default = cudaload.plan(config, finetune=True, quantize=None).finetune
    assert default is not None and default.lora["lora_dropout"] == 0.05
    with pytest.raises(FinetuneConfigError, match="only without dropout"):
        cudaload.plan(config, finetune=True, quantize=None, lora={"target_parameters": experts, "lora_dropout": 0.1})


def test_attention_activations_scale_with_the_attention_width_not_the_hidden_size() -> None:
    """policy/memory.py `layer_bytes_per_token`: fused attention saves q, k, v and its output, each as wide
    as the attention (o_proj's input: heads x head_dim), which differs from the hidden size in e.g.
    Qwen3-0.6B (16 x 128 = 2048 over hidden 1024). Doubling the attention width at the same hidden size
    adds 4 x d x (the extra width) bytes per token."""
    from cudaload.policy.memory import layer_bytes_per_token

    narrow = llama(1)
    wide_shapes = tuple(
        (name, 2 * i if name == "o_proj" else i, 2 * o if name == "q_proj" else o, n)
        for name, i, o, n in narrow.linear_shapes
    )
    wide = replace(narrow, linear_shapes=wide_shapes)
    per_token = {m: layer_bytes_per_token(m, "bfloat16", None, (), on_gpu=True) for m in (narrow, wide)}
    assert per_token[wide] - per_token[narrow] == 4 * 2 * 4096


# ---- issue 41 item 7: survivors of seeds 2 and 3 -------------------------------------------------


def _launch_files(tmp_path: Path, nodes: int, **kwargs: Any) -> tuple[cudaload.LaunchFiles, Any]:
    """The launch of a Llama-70B-shaped fine-tune on `nodes` x 8 H100, and its accelerate config as accelerate
    1.16 reads it (commands/config/config_args.py `load_config_from_file`)."""
    from accelerate.commands.config.config_args import load_config_from_file

    from cudaload.facts.shapes import LLAMA_SHAPES

    h100 = Machine.simulated("H100", count=8)
    files = cudaload.launch_files(
        LLAMA_SHAPES["70B"], machine=h100, nodes=nodes, main_address="10.0.0.1", emit=("accelerate",), **kwargs
    )
    files.write(tmp_path)
    return files, load_config_from_file(str(tmp_path / "accelerate-config.yaml"))


def test_a_one_node_launch_names_no_main_process_address(tmp_path: Path) -> None:
    """launch/accelerate.py `accelerate_config`: accelerate's single-machine config has no main_process_ip (the
    rendezvous is local); the address you gave is written only for a job of several nodes."""
    _, one = _launch_files(tmp_path / "one", nodes=1, parallelism="fsdp")
    assert one.num_machines == 1 and one.main_process_ip is None
    _, two = _launch_files(tmp_path / "two", nodes=2, parallelism="fsdp")
    assert two.num_machines == 2 and two.main_process_ip == "10.0.0.1"


def test_tensor_parallel_is_not_launched_for_training_and_fsdp_writes_no_parallelism_config(tmp_path: Path) -> None:
    """launch/accelerate.py: "tp+fsdp" is refused for training (policy/parallelism.py TP_NOT_FOR_TRAINING: a
    rank would load the whole model and accelerate skip the TP preparation), so no launch of it is written;
    plain FSDP shards over every rank and writes no `parallelism_config`."""
    with pytest.raises(cudaload.PlacementError, match="tensor parallel is not offered for training"):
        _launch_files(tmp_path / "tp", nodes=2, parallelism="tp+fsdp")
    assert not (tmp_path / "tp").exists() or not any((tmp_path / "tp").iterdir())
    _, fsdp = _launch_files(tmp_path / "fsdp", nodes=2, parallelism="fsdp")
    assert fsdp.distributed_type.value == "FSDP" and not fsdp.parallelism_config


@pytest.mark.parametrize("parallelism", [None, "fsdp"])
def test_each_launched_rank_replans_with_the_parallelism_you_asked(tmp_path: Path, parallelism: str | None) -> None:
    """launch/check.py `manifest_plan_arguments`: each launched rank plans with the manifest's arguments, so
    the manifest keeps what you asked ("auto" when you named nothing; auto picks fsdp-hybrid here), and the
    rank's plan then agrees with the launch's (`check_launched_plan` raises nothing)."""
    from cudaload.facts.shapes import LLAMA_SHAPES
    from cudaload.launch import check_launched_plan, manifest_plan_arguments

    files, _ = _launch_files(tmp_path, nodes=2, **({"parallelism": parallelism} if parallelism else {}))
    assert files.plan.decision("parallelism").value == (parallelism or "fsdp-hybrid")
    arguments = manifest_plan_arguments(files.manifest)
    assert arguments["parallelism"] == (parallelism or "auto")
    launch = Launch(launcher="torchrun", rank=9, local_rank=1, world_size=16, local_world_size=8)
    rank_machine = Machine.simulated("H100", count=8, launch=launch)
    rank = cudaload.plan(LLAMA_SHAPES["70B"], machine=rank_machine, finetune=True, **arguments)
    check_launched_plan(rank, files.manifest)


def test_each_launched_rank_replans_with_the_node_memory_you_gave() -> None:
    """launch/check.py `manifest_plan_arguments`: the node RAM you gave (`--node-memory`) is a fact of the job's
    nodes, as the link is: the manifest keeps it and each rank plans with it. 70B full training on 1 x 8 H100 needs
    ZeRO-3 offload, whose CPU state (~1.5 TiB a node, DeepSpeed's figure) fits 4 TiB and not the 1.25 TiB a
    simulated node is assumed to have: a rank planning with its own figure finds nothing fits and stops the job."""
    from cudaload.facts.shapes import LLAMA_SHAPES
    from cudaload.launch import check_launched_plan, manifest_plan_arguments

    model, h100 = LLAMA_SHAPES["70B"], Machine.simulated("H100", count=8)
    files = cudaload.launch_files(model, machine=h100, train="full", emit=("torchrun",), node_memory="4TiB")
    assert files.plan.decision("parallelism").value == "deepspeed-zero3-offload"
    assert files.manifest["node_memory"] == 4 * 2**40
    arguments = manifest_plan_arguments(files.manifest)
    launch = Launch(launcher="torchrun", rank=3, local_rank=3, world_size=8, local_world_size=8)
    rank_machine = Machine.simulated("H100", count=8, launch=launch)
    rank = cudaload.plan(model, machine=rank_machine, finetune=True, train="full", **arguments)
    check_launched_plan(rank, files.manifest)
    without = {k: v for k, v in arguments.items() if k != "node_memory"}
    guessed = cudaload.plan(model, machine=rank_machine, finetune=True, train="full", **without)
    assert guessed.decision("parallelism").value is None and "1577.0 GiB" in guessed.decision("parallelism").reason
    with pytest.raises(cudaload.LaunchMismatchError, match="parallelism"):
        check_launched_plan(guessed, files.manifest)
    # Not given: the manifest keeps none, and each rank reads its own node's RAM.
    small = cudaload.launch_files(LLAMA_SHAPES["7B"], machine=h100, nodes=2, emit=("torchrun",))
    assert small.manifest["node_memory"] is None and "node_memory" not in manifest_plan_arguments(small.manifest)


def test_a_deepspeed_config_clips_gradients_as_the_trainer_does(tmp_path: Path) -> None:
    """launch/deepspeed.py `deepspeed_config`: transformers' Trainer checks a DeepSpeed config against its
    TrainingArguments and refuses a gradient_clipping other than max_grad_norm (transformers 5.22
    integrations/deepspeed.py: `HfTrainerDeepSpeedConfig.trainer_config_process`, fill_match
    "gradient_clipping"): the config written clips as TrainingArguments' default does."""
    import dataclasses
    import json

    from transformers import TrainingArguments

    from cudaload.facts.shapes import LLAMA_SHAPES

    h100 = Machine.simulated("H100", count=8)
    files = cudaload.launch_files(
        LLAMA_SHAPES["70B"], machine=h100, nodes=2, main_address="10.0.0.1",
        parallelism="deepspeed-zero3-offload", emit=("deepspeed",),
    )  # fmt: skip
    files.write(tmp_path)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    default = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "max_grad_norm")
    # "auto": Trainer fills it with max_grad_norm (policy/engine_deepspeed.py), whatever TrainingArguments say
    assert config["gradient_clipping"] == "auto" and default == 1.0


@pytest.fixture(scope="module")
def got_ocr2_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GOT-OCR2's default config: its top class has no SDPA, its Qwen2 language model has."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = tmp_path_factory.mktemp("got-ocr2")
    CONFIG_MAPPING["got_ocr2"]().save_pretrained(path)
    return path


def test_attention_per_sub_model_is_passed_only_for_the_option_it_was_decided_with(got_ocr2_config: Path) -> None:
    """loaders/kwargs.py `from_pretrained_kwargs`: the plan's per-sub-model attention reaches from_pretrained
    as transformers' dict ("" for the top; modeling_utils `_check_and_adjust_attn_implementation` per
    sub-model) for the decided option; a fallback option is passed as it is, for every part."""
    plan = cudaload.plan(str(got_ocr2_config), machine=Machine.simulated())
    assert plan.decision("attn_implementation").value == "eager"
    assert plan.decision("attn_implementation_per_sub_model").value == "text_config=sdpa, vision_config=eager"
    decided = cudaload.from_pretrained_kwargs(plan)["attn_implementation"]
    assert decided == {"": "eager", "text_config": "sdpa", "vision_config": "eager"}
    assert cudaload.from_pretrained_kwargs(plan.with_attention("sdpa"))["attn_implementation"] == "sdpa"


def test_an_attention_you_chose_is_kept_for_every_sub_model(got_ocr2_config: Path) -> None:
    """policy/attention.py `decide_sub_model_attention`: attention you pass is applied to every part (never
    silently changed), so no per-sub-model decision is added, even where a part has SDPA."""
    plan = cudaload.plan(str(got_ocr2_config), machine=Machine.simulated(), attn_implementation="eager")
    assert plan.decision("attn_implementation").source == "user"
    with pytest.raises(KeyError):
        plan.decision("attn_implementation_per_sub_model")
    assert cudaload.from_pretrained_kwargs(plan)["attn_implementation"] == "eager"


@pytest.mark.parametrize("name", ["banana", "xformers"])
def test_an_attention_name_close_to_none_gets_no_guess(config_only: Path, name: str) -> None:
    """planner/arguments.py: "did you mean" only for a near miss (difflib ratio >= 0.6, as for the GPU names);
    a name like no known one lists the known names instead of a misleading guess."""
    with pytest.raises(cudaload.AttentionUnavailableError) as raised:
        cudaload.plan(str(config_only), attn_implementation=name)
    assert "did you mean" not in str(raised.value) and "Known here: " in str(raised.value)


@pytest.mark.parametrize(
    ("quantization_config", "quantize"),
    [({"load_in_4bit": True}, "4bit"), ({"load_in_8bit": True}, "8bit"), ({"quant_method": "gptq", "bits": 4}, None)],
)
def test_a_quantization_dict_without_a_method_is_read_as_bitsandbytes(
    config_only: Path, quantization_config: dict[str, Any], quantize: str | None
) -> None:
    """planner/arguments.py `_bitsandbytes_bits`: a dict with load_in_4bit/8bit and no quant_method is a
    BitsAndBytesConfig to transformers (quantizers/auto.py `AutoQuantizationConfig.from_dict` adds the
    bitsandbytes method), so the fine-tuning estimate follows its bits; another method's is not read as one."""
    plan = cudaload.plan(
        str(config_only), machine=Machine.simulated("A10G"), finetune=True, quantize=None,
        quantization_config=quantization_config,
    )  # fmt: skip
    assert plan.decision("quantize").value == quantize


def test_a_subfolder_that_exists_is_planned_from_its_own_config(tmp_path: Path) -> None:
    """planner/gather.py: subfolder= reads <folder>/<subfolder>/config.json, as transformers' cached_file
    does; one that is not there is refused, naming the folders there are."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path / "llm")  # fmt: skip
    plan = cudaload.plan(str(tmp_path), subfolder="llm", machine=Machine.simulated())
    assert plan.kwargs["subfolder"] == "llm"
    with pytest.raises(cudaload.ModelConfigError, match=r"subfolder='vision'.*has no such folder.*\['llm'\]"):
        cudaload.plan(str(tmp_path), subfolder="vision", machine=Machine.simulated())


def test_cudaloads_own_spread_is_judged_as_transformers_will_place_it() -> None:
    """planner/gather.py and policy/placement.py `judge_upstream_placement`: ~33.7 GiB under 2 x 17.6 GiB of
    budget fits by the sums, but transformers' device_map="auto" keeps the largest layer's room on GPU 0
    and puts the rest on disk: the plan says so (tests/test_upstream_round4.py has the numbers)."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=50,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, dtype="bfloat16",
    )  # fmt: skip
    plan = cudaload.plan(config, machine=Machine.simulated("A10G", count=2))
    assert plan.kwargs["device_map"] == "auto"
    assert any("transformers will put" in w and "on disk" in w for w in plan.warnings)


def test_a_probe_estimate_decodes_from_the_second_new_token() -> None:
    """policy/measured.py `probe_estimate`: as `record_estimate` above, the first new token comes out of the
    prefill, so decoding costs nothing for 0 or 1 new tokens and grows by one token's time after that."""
    from cudaload.policy.measured import probe_estimate

    probe, model = _probe(1.3), shrunk(QWEN_06B, checkpoint_dtype="float32")
    decode = {n: probe_estimate(probe, model, "float32", Workload(8, n)).decode for n in (0, 1, 2, 11)}  # type: ignore[union-attr]
    assert decode[0] == decode[1] == 0.0 and decode[2] > 0
    assert math.isclose(decode[11], 10 * decode[2])


class SafetensorError(Exception):
    """Named as safetensors' own error (its Rust binding raises `safetensors_rust.SafetensorError`)."""


@pytest.mark.parametrize(
    ("raised", "cause"),
    [
        (SafetensorError("Error while deserializing"), "the weights file is truncated or corrupt"),
        (ImportError("needs the foo package"), "the checkpoint needs a package that is not installed"),
        (OSError("no file named model.safetensors"), "a file the model needs is missing or unreadable"),
    ],
)
def test_a_load_failure_is_named_by_its_likely_cause(
    config_only: Path, monkeypatch: pytest.MonkeyPatch, raised: Exception, cause: str
) -> None:
    """loaders/attribution.py: what from_pretrained raised, when no other attention can help, is explained
    by its kind: a corrupt safetensors file, a missing package, a missing file."""

    def failing(cls: Any, *args: Any, **kwargs: Any) -> Any:
        raise raised

    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(failing))
    with pytest.raises(LoadFailedError, match=f"Likely cause: {cause}"):
        cudaload.load(str(config_only), machine=Machine.simulated())


@pytest.mark.parametrize(("length", "shown"), [(58, "'" + "a" * 58 + "'"), (59, "'" + "a" * 58 + "…")])
def test_an_unknown_load_failure_shows_each_argument_up_to_60_characters(
    config_only: Path, monkeypatch: pytest.MonkeyPatch, length: int, shown: str
) -> None:
    """loaders/attribution.py: for a cause cudaload does not know, the message lists what from_pretrained
    was called with, each value's repr whole up to 60 characters, else its first 59 and an ellipsis."""

    def failing(cls: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("something else")

    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(failing))
    with pytest.raises(LoadFailedError, match="not one cudaload recognises") as raised:
        cudaload.load(str(config_only), machine=Machine.simulated(), revision="a" * length)
    assert f"revision={shown}:" in str(raised.value) or f"revision={shown}," in str(raised.value)


@pytest.mark.slow
def test_a_plan_that_fell_back_passes_the_attention_it_fell_back_to(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """loaders/apply.py: after flash_attention_2 fails at load (transformers' `_flash_attn_import_error`:
    no flash-attn here), the applied plan's from_pretrained arguments name the attention it fell back to,
    the same one its decision names."""
    import transformers.modeling_flash_attention_utils as flash_utils

    monkeypatch.setattr(flash_utils, "_loaded_implementation", None)
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        model = cudaload.load(str(tiny_models["llama"]), machine=a100, device_map="cpu", dtype="bfloat16")
    applied = model.cudaload_plan
    assert [f.option for f in applied.fallbacks] == ["flash_attention_2"]
    fell_to = applied.plan.decision("attn_implementation").value
    assert applied.plan.kwargs["attn_implementation"] == fell_to == applied.attn_implementation == "sdpa"


@pytest.mark.parametrize(("heads", "kv_heads", "splits"), [(64, 8, True), (64, 4, False), (60, 8, False)])
def test_tensor_parallel_needs_every_head_count_to_split_over_a_nodes_ranks(
    heads: int, kv_heads: int, splits: bool
) -> None:
    """policy/parallelism.py: "tp+fsdp" shards attention heads over a node's ranks, which needs both the
    query heads and the key-value heads to divide by them (transformers' tensor-parallel plan splits each
    projection by heads); one that does not divide rules it out, whichever it is."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    model = replace(LLAMA_SHAPES["70B"], attention_heads=heads, kv_heads=kv_heads)
    h100 = Machine.simulated("H100", count=8)
    plan = cudaload.plan(model, machine=h100, finetune=True, nodes=2, interconnect="infiniband-ndr")
    reason = {r.value: r.reason for r in plan.decision("parallelism").rejected}["tp+fsdp"]
    assert ("do not split over 8 ranks of a node" in reason) is not splits, reason
    if not splits:
        assert reason.startswith(f"{heads} heads / {kv_heads} key-value heads")


def test_a_launch_of_one_rank_a_node_plans_as_many_nodes_of_one_rank() -> None:
    """policy/parallelism.py `planned_layout`: a rank plans the job it is in, nodes = world size / ranks on
    a node; torchrun's LOCAL_WORLD_SIZE 1 (one GPU a node) is 2 nodes of 1 rank, not 1 node of 2."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    launch = Launch(launcher="torchrun", rank=1, local_rank=0, world_size=2, local_world_size=1)
    plan = cudaload.plan(LLAMA_SHAPES["7B"], machine=Machine.simulated("H100", launch=launch), finetune=True)
    assert plan.finetune is not None and plan.finetune.parallelism is not None
    assert (plan.finetune.parallelism["nodes"], plan.finetune.parallelism["ranks_per_node"]) == (2, 1)


@pytest.mark.parametrize(
    ("flags", "native"),
    [(("avx2", "avx512f", "avx512_fp16"), True), (("avx2", "amx_fp16"), True), (("avx2", "avx512f"), False)],
)
def test_either_native_fp16_flag_makes_float16_a_trade_on_an_unmeasured_cpu(flags: tuple, native: bool) -> None:
    """policy/precision.py, the static CPU table: AVX512-FP16 or AMX-FP16 (either one) runs fp16 natively,
    so float16 is rejected as a trade you may take; without both it is converted op by op."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    plan = cudaload.plan(LLAMA_SHAPES["7B"], machine=Machine.simulated(None, cpu_flags=flags))
    reason = {r.value: r.reason for r in plan.decision("dtype").rejected}["float16"]
    assert ("runs it natively" in reason) is native and ("no native fp16" in reason) is not native


def test_sizes_are_written_in_kib_below_one_mib_and_in_mib_from_it() -> None:
    """policy/fit.py `format_bytes` (every size in a reason or warning): the unit changes at 1 MiB exactly."""
    from cudaload.policy.fit import format_bytes

    assert format_bytes(2**20 - 1024) == "1023.0 KiB" and format_bytes(2**19) == "512.0 KiB"
    assert format_bytes(2**20) == "1.0 MiB" and format_bytes(-(2**20)) == "-1.0 MiB"


@pytest.mark.parametrize(
    ("gpu", "bitsandbytes", "usable"),
    [("A10G", "0.45.0", False), (None, "0.45.0", False), ("A10G", "0.46.1", True), (None, "0.46.1", True)],
)
def test_bitsandbytes_older_than_transformers_accepts_is_refused_on_any_device(
    gpu: str | None, bitsandbytes: str, usable: bool
) -> None:
    """policy/quantization.py `method_status`: the package's record (facts/quant_methods.py) holds the oldest
    bitsandbytes transformers accepts (import_utils BITSANDBYTES_MIN_VERSION, 0.46.1 in 5.22-5.25), which is
    also the first with a CPU backend: older is refused on a GPU and on a CPU alike, naming the bound."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    machine = Machine.simulated(gpu, packages={"bitsandbytes": bitsandbytes})
    if usable:
        plan = cudaload.plan(LLAMA_SHAPES["7B"], machine=machine, finetune=True, quantize="4bit")
        assert plan.decision("quantize").value == "4bit"
    else:
        with pytest.raises(cudaload.MissingPackageError, match=r"older than 0\.46\.1.*bitsandbytes>=0\.46\.1"):
            cudaload.plan(LLAMA_SHAPES["7B"], machine=machine, finetune=True, quantize="4bit")


def test_a_sharded_rank_holds_two_whole_layers_and_fsdp_its_tail_too() -> None:
    """policy/rank_sizing.py (its docstring): FSDP2 full shard holds two layers unsharded on each rank, the one
    running and the one prefetched, and the tail unit accelerate's fsdp2_prepare_model keeps whole (final norm +
    lm_head; the input embeddings are their own unit), hybrid shard the same; ZeRO-3 gathers 4 bytes a parameter
    of the largest layer (DeepSpeed's estimator), stages its one reduce bucket and keeps its coordinator's window of
    weights gathered (policy/zero_bytes.py); ZeRO-2 keeps whole weights
    (nothing gathered) but its fp32 gradient partition and two reduce buckets."""
    from cudaload.facts.interconnect import ParallelLayout, interconnect
    from cudaload.facts.shapes import LLAMA_SHAPES
    from cudaload.policy.rank_sizing import size_rank
    from cudaload.policy.training_shape import full_training_shape
    from cudaload.policy.zero_bytes import GATHERED_ELEMENTS

    model = LLAMA_SHAPES["7B"]
    shape = full_training_shape(model, dtype="bfloat16", seq_len=2048, checkpointing=True)
    layout = ParallelLayout(2, 8, interconnect(None))
    assert shape.layer_bytes > 0 and shape.root_bytes > shape.tail > 0
    buffers = {
        strategy: size_rank(strategy, shape, layout, micro_batch=1, gpu_link=450e9, tflops=None, overhead=0).buffers
        for strategy in ("fsdp", "fsdp-hybrid", "deepspeed-zero3", "deepspeed-zero3-offload")
    }
    assert buffers["fsdp"] == buffers["fsdp-hybrid"] == 2 * shape.layer_bytes + shape.tail
    bucket = 500_000_000 * 2
    largest = 4 * model.vocab_size * model.hidden_size
    gathered = 2 * min(model.parameters, GATHERED_ELEMENTS)  # the coordinator's window of bf16 weights
    assert buffers["deepspeed-zero3-offload"] == largest + bucket + gathered
    assert buffers["deepspeed-zero3"] == largest + bucket + gathered + 2 * model.parameters // 16
    zero2 = size_rank("deepspeed-zero2", shape, layout, micro_batch=1, gpu_link=450e9, tflops=None, overhead=0)
    assert zero2.buffers == 2 * bucket + 4 * model.parameters // 16 and zero2.cpu_offloaded == 0


@pytest.mark.parametrize(
    ("model_class", "task_type"),
    [("LlamaForTokenClassification", "TOKEN_CLS"), ("LlamaModel", "FEATURE_EXTRACTION")],
)
def test_a_model_class_you_name_gets_the_lora_task_of_its_head(model_class: str, task_type: str) -> None:
    """policy/training.py: a model loaded through its own class (model_class=..., no Auto class) gets peft's
    task type of the Auto class its name ends with ("...ForTokenClassification": TOKEN_CLS); a bare base
    model ("LlamaModel") matches no head and is a feature extractor, not a causal LM."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    model = replace(LLAMA_SHAPES["7B"], model_class=model_class, auto_class=model_class)
    plan = cudaload.plan(model, machine=Machine.simulated("A100"), finetune=True)
    assert plan.finetune is not None and plan.finetune.lora["task_type"] == task_type


def test_flash_attention_4_says_transformers_pads_a_narrower_value_head() -> None:
    """policy/flash_rules.py: for MLA (DeepSeek-V3: query-key 192, value 128) transformers pads V up to the
    query-key dim (integrations/flash_attention.py), so FA4 on sm100 is refused for 192/192, and says why."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    mla = replace(LLAMA_SHAPES["7B"], head_dims=(128, 192), qk_v_head_dims=(192, 128))
    b200 = Machine.simulated("B200", packages={"flash-attn": "2.8.3", "flash-attn-4": "4.0.1"})
    plan = cudaload.plan(mla, machine=b200)
    reason = {r.value: r.reason for r in plan.decision("attn_implementation").rejected}["flash_attention_4"]
    assert "transformers pads V 128 up to the query-key dim 192, so the kernel gets 192/192" in reason


def test_caps_without_a_cpu_key_send_the_rest_to_disk_and_none_to_the_cpu() -> None:
    """policy/placement.py `_capped_placement`: accelerate fills the GPUs you cap, then the "cpu" cap, then
    disk; with no "cpu" key transformers adds "disk" (integrations/accelerate.py
    `_init_infer_auto_device_map`), so nothing lands on the CPU."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    plan = cudaload.plan(LLAMA_SHAPES["7B"], machine=Machine.simulated("A10G"), max_memory={0: "4GiB"})
    reason = plan.decision("device_map").reason
    assert "(~4.0 GiB on the GPUs, ~8.6 GiB on disk)" in reason and "on the CPU" not in reason


@pytest.mark.parametrize("unknown", ["vocab_size", "hidden_size"])
def test_without_an_lm_head_prefill_time_is_proportional_to_the_prompt(unknown: str) -> None:
    """policy/measured.py `probe_estimate`: the lm_head term (vocab x hidden, once per prefill) is zero for a
    model whose config gives no vocabulary or hidden size, so the prefill estimate is the body's alone: twice
    the prompt, twice the time (with both known, the head's constant term breaks the proportion)."""
    from cudaload.policy.measured import probe_estimate

    probe = _probe(1.3)

    def prefill(model: Any, prompt: int) -> float:
        estimate = probe_estimate(probe, model, "float32", Workload(prompt, 1))
        assert estimate is not None
        return estimate.prefill

    headless = replace(shrunk(QWEN_06B, checkpoint_dtype="float32"), **{unknown: None})
    assert math.isclose(prefill(headless, 16), 2 * prefill(headless, 8), rel_tol=1e-12)
    headed = shrunk(QWEN_06B, checkpoint_dtype="float32")
    assert not math.isclose(prefill(headed, 16), 2 * prefill(headed, 8), rel_tol=1e-6)


def test_a_rank_that_sees_one_gpu_is_not_asked_about_tensor_parallel() -> None:
    """policy/tensor_parallel.py: tensor parallel splits layers over the GPUs a rank's process can drive; a
    launch that gives each rank one GPU (CUDA_VISIBLE_DEVICES per rank) leaves no tp_plan question."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    launch = Launch(launcher="torchrun", rank=1, local_rank=1, world_size=2, local_world_size=2)
    one = cudaload.plan(LLAMA_SHAPES["70B"], machine=Machine.simulated("H100", count=1, launch=launch))
    with pytest.raises(KeyError):
        one.decision("tp_plan")
    two = cudaload.plan(LLAMA_SHAPES["70B"], machine=Machine.simulated("H100", count=2, launch=launch))
    assert two.decision("tp_plan") is not None
