"""Distributed launches: detection from the environment each launcher really sets, and the
placement policy per rank (no processes started: facts passed in)."""

from __future__ import annotations

import pytest

from cudaload.capability.launch import read_launch

# What `accelerate launch --multi_gpu --num_processes 2` (1.16, CPU machine) put in rank 1's
# environment, recorded here: torchrun's variables and accelerate's together.
ACCELERATE_MULTI = {
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_MIXED_PRECISION": "no",
    "GROUP_RANK": "0",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "RANK": "1",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "none",
    "WORLD_SIZE": "2",
}
# `accelerate launch --cpu --num_processes 2` (no --mpirun_hostfile): one process, this environment.
ACCELERATE_CPU_ONE = {
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_MIXED_PRECISION": "no",
    "ACCELERATE_USE_CPU": "True",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
TORCHRUN_NODE1 = {  # torchrun --nnodes 2 --node_rank 1 --nproc_per_node 4: global rank 6
    "TORCHELASTIC_RUN_ID": "none",
    "GROUP_RANK": "1",
    "RANK": "6",
    "LOCAL_RANK": "2",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
}
MPIRUN = {  # Open MPI sets its local size too (OMPI_COMM_WORLD_LOCAL_SIZE)
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


@pytest.mark.parametrize(
    ("env", "launcher", "rank", "local_rank", "world", "local_world", "strategy"),
    [
        (ACCELERATE_MULTI, "accelerate", 1, 1, 2, 2, "ddp"),
        (ACCELERATE_CPU_ONE, "accelerate", 0, 0, 1, 1, None),
        (TORCHRUN_NODE1, "torchrun", 6, 2, 8, 4, "ddp"),
        (MPIRUN, "mpirun", 3, 1, 4, 2, "ddp"),
        ({**MPIRUN, "ACCELERATE_USE_CPU": "True", "ACCELERATE_MIXED_PRECISION": "no"}, "accelerate", 3, 1, 4, 2, "ddp"),
        # A stray ACCELERATE_* variable in the user's shell does not make a torchrun an accelerate launch.
        ({**TORCHRUN_NODE1, "ACCELERATE_LOG_LEVEL": "info"}, "torchrun", 6, 2, 8, 4, "ddp"),
    ],
)
def test_launch_detected_from_the_launchers_real_environment(
    env, launcher, rank, local_rank, world, local_world, strategy
) -> None:
    launch = read_launch(env)
    assert (launch.launcher, launch.rank, launch.local_rank, launch.world_size, launch.local_world_size) == (
        launcher,
        rank,
        local_rank,
        world,
        local_world,
    )
    assert launch.strategy == strategy and launch.problems == ()


def test_accelerate_cpu_launch_that_got_one_process_is_noted() -> None:
    assert any("started one" in n and "--mpirun_hostfile" in n for n in read_launch(ACCELERATE_CPU_ONE).notes)
    # Without MASTER_PORT accelerate was asked for one process: nothing to say.
    single = {k: v for k, v in ACCELERATE_CPU_ONE.items() if not k.startswith("MASTER_")}
    assert read_launch(single).notes == ()
    assert read_launch(ACCELERATE_MULTI).notes == ()


# --- placement per rank: tensor parallelism, spreading, FSDP/ZeRO-3 on CPU --------------------------

from dataclasses import replace  # noqa: E402

from cudaload import Machine  # noqa: E402
from cudaload.facts.machine import Launch  # noqa: E402
from cudaload.loaders import from_pretrained_kwargs  # noqa: E402
from cudaload.policy import Request, decide_plan  # noqa: E402
from cudaload.request import TrainingRequest  # noqa: E402
from model_shapes import llama  # noqa: E402


def _ranks(world: int, local: int | None = None, rank: int = 1, strategy: str = "ddp") -> Launch:
    local = world if local is None else local
    return Launch(
        "torchrun", rank=rank, local_rank=rank % local, world_size=world, local_world_size=local, strategy=strategy
    )


def _model(billions: float, *, heads: int = 32, kv: int = 8, tp: bool = True):
    return replace(llama(billions), attention_heads=heads, kv_heads=kv, tp_plan=tp)


# launch, GPUs, model -> tp_plan, device_map, words the reason must hold
TP_TABLE = [
    # 70B in bf16 (~131 GiB) exceeds one A100 but a quarter fits: TP over the node's 4 GPUs.
    (_ranks(4), 4, _model(70), "auto", None, "a 1/4 shard fits"),
    # 3 ranks do not divide 32 heads / 8 kv heads: each rank's copy spreads over the GPUs.
    (_ranks(3), 4, _model(70), None, "auto", "do not both divide WORLD_SIZE=3"),
    # No base_model_tp_plan in the config: transformers cannot shard it.
    (_ranks(4), 4, _model(70, tp=False), None, "auto", "no base_model_tp_plan"),
    # Ranks on two nodes: TP's per-layer all-reduce would cross the network.
    (_ranks(8, local=4, rank=5), 4, _model(70), None, "auto", "span 2 nodes"),
    # Fits one GPU: data parallel, TP rejected as all-reduce cost for nothing.
    (_ranks(4), 4, _model(8), None, {"": 1}, "fit one GPU"),
    # Even a 1/2 shard of 300B is too big for an A100.
    (_ranks(2), 2, _model(300), None, "auto", "still exceeds one GPU"),
]


@pytest.mark.parametrize(("launch", "count", "model", "tp_plan", "device_map", "why"), TP_TABLE)
def test_tensor_parallel_or_spread_under_torchrun(launch, count, model, tp_plan, device_map, why) -> None:
    machine = Machine.simulated("A100", count=count, launch=launch)
    plan = decide_plan(machine, model, Request())
    assert plan.kwargs.get("tp_plan") == tp_plan
    assert plan.kwargs.get("device_map") == device_map
    decision = plan.decision("tp_plan")
    assert decision.value == tp_plan and why in decision.reason + " ".join(r.reason for r in decision.rejected)
    if device_map == "auto":
        # Every rank of the node holds a whole copy: each gets its share of each GPU's budget, by
        # hand 80 GiB x 80% headroom / the node's ranks (64 GiB / 3 = 21.3, / 4 = 16.0, / 2 = 32.0).
        share = {2: "32.0GiB", 3: "21.3GiB", 4: "16.0GiB"}[launch.local_world_size]
        assert {gpu: plan.kwargs["max_memory"][gpu] for gpu in range(count)} == dict.fromkeys(range(count), share)
        assert why in plan.decision("device_map").reason
    if tp_plan == "auto":
        assert "max_memory" not in plan.kwargs


@pytest.mark.parametrize(
    ("machine", "request_"),
    [
        (
            Machine.simulated("A100", count=4, launch=_ranks(4)),
            Request(training=TrainingRequest(quantize=None)),
        ),  # training
        (Machine.simulated("A100", count=4), Request()),  # one process
        (Machine.simulated(None, launch=_ranks(2)), Request()),  # no GPU
        (Machine.simulated("A100", count=4, launch=_ranks(4, strategy="fsdp")), Request()),  # FSDP shards itself
    ],
)
def test_tensor_parallel_is_not_a_question_here(machine, request_) -> None:
    plan = decide_plan(machine, _model(70), request_)
    assert "tp_plan" not in plan.kwargs
    assert "tp_plan" not in [d.setting for d in plan.decisions]


def test_a_tp_plan_you_pass_drops_the_device_map() -> None:
    """transformers refuses tp_plan together with device_map; on a CPU the plan would set 'cpu'."""
    plan = decide_plan(Machine.simulated(None, launch=_ranks(2)), _model(1), Request(passthrough={"tp_plan": "auto"}))
    assert plan.kwargs["tp_plan"] == "auto" and "device_map" not in plan.kwargs
    assert "your tp_plan" in plan.decision("device_map").reason


def test_tp_plan_becomes_a_distributed_config_for_transformers() -> None:
    from dataclasses import replace

    from transformers.distributed import DistributedConfig

    from cudaload.planner.apply_facts import apply_facts

    decided = decide_plan(Machine.simulated("A100", count=4, launch=_ranks(4)), _model(70), Request())
    # plan() attaches what the installed transformers takes (planner/apply_facts.py); decide_plan alone does not.
    plan = replace(decided, apply_facts=apply_facts(decided, None))
    kwargs = from_pretrained_kwargs(plan)
    assert "tp_plan" not in kwargs and isinstance(kwargs["distributed_config"], DistributedConfig)
    assert kwargs["distributed_config"].tp_plan == "auto"
    # Without those facts (a plan rebuilt by hand), the loaders probe nothing: tp_plan= goes as planned.
    assert from_pretrained_kwargs(decided)["tp_plan"] == "auto"


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
@pytest.mark.parametrize("gpu", [None, "A100"])
def test_sharding_on_a_cpu_only_machine_warns_that_accelerate_runs_ddp(strategy, gpu) -> None:
    launch = replace(_ranks(2, strategy=strategy), zero_stage=3 if strategy == "deepspeed" else None)
    plan = decide_plan(
        Machine.simulated(gpu, count=2, launch=launch), _model(1), Request(training=TrainingRequest(quantize=None))
    )
    assert "device_map" not in plan.kwargs
    # DeepSpeed runs on its CPU accelerator under Trainer (tests/test_launch_deepspeed_runs.py): no such warning.
    assert any("plain DDP" in w for w in plan.warnings) == (gpu is None and strategy == "fsdp")
