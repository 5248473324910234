"""Rules that the seed-4 mutation sample (issue 41 item 7: `python tools/mutate.py --sample 40 --seed 4
--select imports`) changed without any test failing. One test per rule, each through a public entry point
(`cudaload.plan`, `cudaload.launch_files`, a policy or loader function by name imported inside the test), and
each docstring names the module and function it guards (tools/mutate.py maps a test file to a module by any
line naming it).

Each test was checked to fail with its rule mutated (`tools/mutate.py --seed 4 --sample 40 --select imports
--match ...`)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

import cudaload
from cudaload import Launch, Machine
from cudaload.facts.model import any_model
from cudaload.facts.stored_weights import read_quantization_config
from cudaload.request import Request
from model_shapes import llama

GiB = 2**30

# Simulated machines start from no packages in the tests (conftest.py): name what each rule needs.
WITH_BNB = {"bitsandbytes": "0.50.2", "peft": "0.21.2"}
BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}


def _launch(local_rank: int, strategy: str | None = None, zero_stage: int | None = None) -> Launch:
    return Launch(
        launcher="torchrun",
        rank=local_rank,
        local_rank=local_rank,
        world_size=2,
        local_world_size=2,
        strategy=strategy,
        zero_stage=zero_stage,
    )


# ---- policy/current_device.py ---------------------------------------------------------------------


def test_a_copy_too_big_for_any_gpu_keeps_every_gpu_of_a_mixed_machine() -> None:
    """cudaload.policy.current_device `placed_machine`: on a T4 + A100, a 16-bit copy that fits the A100 makes the
    A100 alone decide; one that fits neither GPU spreads over both, so both decide (the T4 among them: no
    bf16), not the GPU with the most free memory."""
    from cudaload.policy.current_device import placed_machine

    mixed = Machine.simulated(["T4", "A100"])
    assert [g.name for g in placed_machine(mixed, llama(8), Request()).gpus] == ["NVIDIA A100-SXM4-80GB"]
    assert placed_machine(mixed, llama(70), Request()) is mixed


def test_no_current_device_is_set_for_a_rank_that_loads_unquantized() -> None:
    """cudaload.policy.current_device `decide_rank_device`: only a quantized FSDP / ZeRO-3 rank needs its CUDA
    device made current (bitsandbytes loads onto torch.cuda.current_device()); an unquantized one, or a
    device_map you gave, leaves torch's current device alone."""
    from cudaload.policy.current_device import decide_rank_device

    fsdp = Machine.simulated("H100", count=2, launch=_launch(1, "fsdp"))
    quantized = decide_rank_device(fsdp, True, None)
    assert quantized is not None and quantized.value == 1
    assert decide_rank_device(fsdp, False, None) is None
    assert decide_rank_device(fsdp, True, {"": 1}) is None


@pytest.mark.parametrize(("strategy", "stage", "named"), [("fsdp", None, "FSDP"), ("deepspeed", 3, "DeepSpeed ZeRO-3")])
def test_the_rank_device_reason_names_the_launchs_own_sharder(strategy: str, stage: int | None, named: str) -> None:
    """cudaload.policy.current_device `sharder` (through `decide_rank_device`): the reason for setting a quantized
    rank's device names the sharder that launched it, FSDP or DeepSpeed ZeRO-3, never the other."""
    from cudaload.policy.current_device import decide_rank_device

    machine = Machine.simulated("H100", count=2, launch=_launch(1, strategy, stage))
    decision = decide_rank_device(machine, True, None)
    other = "DeepSpeed" if named == "FSDP" else "FSDP"
    assert decision is not None and f"{named} takes no device_map" in decision.reason
    assert other not in decision.reason


def test_training_arguments_are_judged_on_the_launchers_local_rank_gpu() -> None:
    """cudaload.policy.current_device `current_gpu_when_training`: TrainingArguments runs on LOCAL_RANK's GPU under
    a launcher (rank 1 of a T4 + A100 node is on the A100), and on cuda:0 without one."""
    from cudaload.policy.current_device import current_gpu_when_training

    launched = Machine.simulated(["T4", "A100"], launch=_launch(1))
    chosen = current_gpu_when_training(launched)
    assert chosen is not None and chosen.index == 1 and chosen.name == "NVIDIA A100-SXM4-80GB"
    alone = current_gpu_when_training(Machine.simulated(["T4", "A100"]))
    assert alone is not None and alone.index == 0


# ---- policy/attention_checks.py -------------------------------------------------------------------


def test_a_flash_attention_hub_kernel_is_blocked_only_without_a_gpu() -> None:
    """cudaload.policy.attention_checks `check_attention` (`_hub_repository`): a FlashAttention Hub kernel of your
    own repository is built for CUDA: on a CPU-only machine that is a blocker, on a GPU it is none."""
    from cudaload.policy.attention_checks import check_attention

    repo = "my-org/flash-attn-tuned"
    kernels = {"kernels": "0.17.2"}
    on_gpu = check_attention(repo, Machine.simulated("H100", packages=kernels), any_model(), "bfloat16")
    on_cpu = check_attention(repo, Machine.simulated(None, packages=kernels), any_model(), "bfloat16")
    assert on_gpu.blockers == ()
    assert on_cpu.blockers == ("FlashAttention Hub kernels are built for CUDA and there is no GPU here",)


# ---- policy/generation.py -------------------------------------------------------------------------


def test_weights_that_exactly_fill_the_gpu_are_not_offloaded() -> None:
    """cudaload.policy.generation `decide_generation`: with device_map="auto", weights that fill the GPU to the
    byte leave a KV budget of 0 but are not offloaded, so generate() still compiles a static cache; a few
    bytes more and accelerate offloads, which `_valid_auto_compile_criteria` refuses."""
    from cudaload.facts.kv_cache import GenerationFacts, KvLayers
    from cudaload.policy.generation import decide_generation

    facts = GenerationFacts(layers=(KvLayers("full_attention", 32, 8 * 256),), max_positions=131072)
    h100 = Machine.simulated("H100")
    free = h100.gpus[0].usable_memory

    def compile_decision(weights: int) -> cudaload.Decision:
        generation = decide_generation(
            h100,
            facts,
            dtype="bfloat16",
            attention="sdpa",
            weight_bytes=weights,
            device_map="auto",
            cache_implementation="static",
        )
        return generation.decision("generation.compile")

    full = compile_decision(free)
    assert full.value == "reduce-overhead (CUDA graphs)" and "offloaded" not in full.reason
    over = compile_decision(free + 100)
    assert over.value is False and "weights offloaded" in over.reason


# ---- policy/memory.py -----------------------------------------------------------------------------


def test_a_model_of_unknown_width_adds_no_kept_layer_inputs() -> None:
    """cudaload.policy.memory `estimate_training_memory`: gradient checkpointing keeps each layer's input
    (hidden_size x tokens a layer); for a model whose hidden_size is unknown none is invented, so its
    activation estimate does not grow with the layer count, while a known width's does, by exactly the
    kept inputs."""
    from cudaload.policy.memory import estimate_training_memory

    def activations(hidden: int | None, layers: int) -> int:
        model = replace(llama(1), hidden_size=hidden, num_layers=layers)
        return estimate_training_memory(
            model, dtype="bfloat16", quantize=None, r=16, targets=("q_proj",), seq_len=512
        ).activations

    assert activations(None, 32) == activations(None, 1)
    assert activations(4096, 32) - activations(4096, 1) == 31 * 512 * 4096 * 2


# ---- policy/parallelism.py ------------------------------------------------------------------------


def test_sharding_never_replaces_a_checkpoints_own_quantization_or_a_16_bit_base() -> None:
    """cudaload.policy.sharded_quantization `quantize_across_ranks`: 16-bit across the ranks replaces only the quantized
    base quantize="auto" chose for one GPU. A pre-quantized checkpoint keeps its own quantization across two
    nodes (it cannot be trained unquantized from its stored weights), and a model whose 16-bit LoRA fits
    one GPU keeps that reason, not "does not fit one GPU"."""
    h100s = Machine.simulated("H100", count=8, packages=WITH_BNB)
    checkpoint = replace(llama(70), quantization=read_quantization_config(BNB_4BIT))
    assert cudaload.plan(checkpoint, machine=h100s, finetune=True, nodes=2).decision("quantize").value == "checkpoint"
    small = cudaload.plan(llama(1), machine=h100s, finetune=True, nodes=2).decision("quantize")
    assert small.value is None and "LoRA fits" in small.reason and "does not fit one GPU" not in small.reason
    big = cudaload.plan(llama(70), machine=h100s, finetune=True, nodes=2).decision("quantize")
    assert big.value is None and "16-bit LoRA does not fit one GPU, but it fits each of the 16 ranks" in big.reason


# ---- policy/quantization.py -----------------------------------------------------------------------


def test_a_trainable_prequantized_checkpoint_is_fine_tuned_as_stored() -> None:
    """cudaload.policy.quantization `_checkpoint_quantize` (through `cudaload.plan(finetune=True)`): a bitsandbytes
    4-bit checkpoint, whose quantizer trains, gets quantize "checkpoint"; an MXFP4 one, whose quantizer does
    not (Mxfp4HfQuantizer.is_trainable is False), raises and says how to dequantize it."""
    h100 = Machine.simulated("H100", packages={**WITH_BNB, "triton": "3.5.0", "kernels": "0.17.2"})
    bnb = replace(llama(1), quantization=read_quantization_config(BNB_4BIT))
    assert cudaload.plan(bnb, machine=h100, finetune=True).decision("quantize").value == "checkpoint"
    mxfp4 = replace(llama(1), quantization=read_quantization_config({"quant_method": "mxfp4"}))
    with pytest.raises(cudaload.QuantizationError, match="cannot train"):
        cudaload.plan(mxfp4, machine=h100, finetune=True)


# ---- policy/rank_sizing.py ------------------------------------------------------------------------


def test_tensor_parallel_moves_four_activation_all_reduces_a_layer() -> None:
    """cudaload.policy.rank_sizing `size_rank` ("tp+fsdp"): Megatron tensor parallelism all-reduces a layer's
    activations twice in the forward and twice in the backward (Shoeybi et al. 2019, section 3), each ring
    all-reduce a reduce-scatter plus an all-gather, 2 x (n-1)/n of the tensor a rank. On one node of 8 that
    is all of the rank's traffic (nothing crosses nodes)."""
    from cudaload.facts.interconnect import ParallelLayout, interconnect
    from cudaload.facts.shapes import LLAMA_SHAPES
    from cudaload.policy.rank_sizing import size_rank
    from cudaload.policy.training_shape import full_training_shape

    hidden = 4096
    shape = full_training_shape(LLAMA_SHAPES["7B"], dtype="bfloat16", seq_len=2048, checkpointing=True)
    shape = replace(shape, layer_bytes=12 * hidden * hidden * shape.dtype_bytes)  # a Llama-style layer: 12 h^2
    one_node = ParallelLayout(1, 8, interconnect(None))
    size = size_rank("tp+fsdp", shape, one_node, micro_batch=1, gpu_link=450e9, tflops=None, overhead=0)
    activation = 2048 * hidden * shape.dtype_bytes
    assert size.cross_node_bytes == 0
    assert size.comm_bytes == int(4 * 2 * 7 / 8 * activation * shape.layers)


# ---- launch/files.py ----------------------------------------------------------------------------


def test_only_a_multi_node_accelerate_launch_passes_the_main_address() -> None:
    """cudaload.launch `launch_files` (accelerate-launch.sh): the default address "$MASTER_ADDR" is read by
    the shell, so a job of several nodes passes it as --main_process_ip; one node rendezvous locally and
    passes none."""
    from cudaload.facts.shapes import LLAMA_SHAPES

    h100s = Machine.simulated("H100", count=8)

    def script(nodes: int) -> str:
        files = cudaload.launch_files(
            LLAMA_SHAPES["70B"], machine=h100s, nodes=nodes, emit=("accelerate",), parallelism="fsdp"
        )
        return files.files["accelerate-launch.sh"]

    assert "--main_process_ip" not in script(1)
    assert '--main_process_ip "${MASTER_ADDR}" train.py' in script(2)


# ---- loaders/readback.py --------------------------------------------------------------------------


def test_an_attention_that_cannot_be_read_back_is_not_reported() -> None:
    """cudaload.loaders.readback `read_back`: only what is read from the model is compared. A model with no
    config (nothing to read the attention from) differs in nothing; one that reports another attention is
    named with both values; a plan that leaves attn_implementation to transformers compares none."""
    from cudaload.loaders.readback import read_back

    plan = cudaload.plan(llama(1), machine=Machine.simulated(None), attn_implementation="sdpa")
    assert plan.kwargs["attn_implementation"] == "sdpa"
    assert read_back(plan, SimpleNamespace()) == ()
    eager = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    assert read_back(plan, eager) == (
        f"{plan.model}: the plan's attn_implementation is 'sdpa', and the loaded model uses 'eager'.",
    )
    unplanned = replace(plan, kwargs={k: v for k, v in plan.kwargs.items() if k != "attn_implementation"})
    assert read_back(unplanned, eager) == ()
