"""A real torchrun: two processes, gloo on CPU, a DDP LoRA fine-tune through load_for_finetune."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKERS = Path(__file__).parent / "distributed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(worker: str, out: Path, *args: str) -> list[dict]:
    """Run tests/distributed/<worker> under a 2-process torchrun on CPU; its per-rank reports."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(WORKERS / worker),
        *args,
        str(out),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("quantize", ["none", "4bit"])
def test_torchrun_ddp_lora(tiny_models, tmp_path: Path, quantize: str) -> None:
    reports = _torchrun("ddp_worker.py", tmp_path, str(tiny_models["qwen3"]), quantize)
    for rank, report in enumerate(reports):
        launch = report["launch"]
        assert (launch["launcher"], launch["rank"], launch["local_rank"], launch["world_size"]) == (
            "torchrun",
            rank,
            rank,
            2,
        )
        assert launch["strategy"] == "ddp"
        assert report["planned_device_map"] == "cpu" and report["applied_device"] == "cpu"
        assert "rank" in report["device_decision"]
        assert report["training_arguments"]["ddp_find_unused_parameters"] is False
        assert report["lora_identical_across_ranks"] and report["lora_changed"]
        assert report["quantized"] == (quantize == "4bit")
    # Different data per rank, so different losses: the ranks really trained separately.
    assert reports[0]["losses"] != reports[1]["losses"]


def test_torchrun_trainer_is_data_parallel_on_cpu(tiny_models, tmp_path: Path) -> None:
    reports = _torchrun("trainer_worker.py", tmp_path, str(tiny_models["qwen3"]))
    for report in reports:
        assert report["world_size"] == 2 and report["use_cpu"] is True
        assert "DISTRIBUTED" in report["parallel_mode"]
        assert report["identical"] is True and report["changed"] is True and report["steps"] == 3
