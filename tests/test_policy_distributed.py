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
MPIRUN = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}


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
