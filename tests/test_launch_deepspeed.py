"""The DeepSpeed config a ZeRO plan carries, against the engines' own code: HF Trainer takes it from
`training_arguments()` and finds nothing to disagree with, accelerate's launcher takes the emitted YAML, and the
emitted files point at the config beside them. Runs after the suite with the deepspeed extra installed (.ci/run):
without deepspeed the module skips at import, as tests/test_torchao_load.py does."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

import cudaload
from cudaload.policy.engine_deepspeed import deepspeed_config, zero_stage

ZERO = ["deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero3-offload"]


def _files(model: Path, strategy: str, **kwargs: object) -> cudaload.LaunchFiles:
    return cudaload.launch_files(
        model, machine=cudaload.detect(), nodes=2, ranks_per_node=2,
        parallelism=strategy, quantize=None, script="train.py", **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("strategy", ZERO)
def test_trainer_takes_the_planned_config_without_a_mismatch(
    tiny_models: dict[str, Path], tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TrainingArguments(**training_arguments(plan)) carries the plan's DeepSpeed dict; HF Trainer fills its "auto"
    values, and `trainer_config_finalize` (which raises on any value that differs from TrainingArguments) passes."""
    from transformers import AutoModelForCausalLM, TrainingArguments

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    files = _files(tiny_models["llama"], strategy)
    kwargs = cudaload.training_arguments(files.plan, output_dir=str(tmp_path))  # this machine's (CPU) flags
    assert kwargs["deepspeed"] == json.loads(files.files["ds_config.json"])  # one source
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])  # before: ZeRO-3 would partition it
    args = TrainingArguments(**kwargs)
    args.hf_deepspeed_config.trainer_config_finalize(args, model, num_training_steps=3)
    filled = args.hf_deepspeed_config.config
    micro = files.plan.finetune.parallelism["sizes"][strategy]["micro_batch"]
    assert filled["train_micro_batch_size_per_gpu"] == micro == args.per_device_train_batch_size
    assert filled["gradient_clipping"] == args.max_grad_norm
    assert filled["zero_optimization"]["stage"] == zero_stage(strategy)
    assert "reduce_bucket_size" not in filled["zero_optimization"]
    assert "allgather_bucket_size" not in filled["zero_optimization"]


def test_offload_lets_trainer_keep_its_optimizer() -> None:
    """ZeRO-3 offload with Trainer's AdamW (what the rank sizing counts): without `zero_force_ds_cpu_optimizer`
    false, deepspeed 0.19.8 raises ZeRORuntimeException for it, and accelerate 1.16 swaps it for DeepSpeedCPUAdam
    (a C++ op JIT-compiled on each new machine)."""
    from deepspeed.runtime.config import get_zero_force_ds_cpu_optimizer

    offload = deepspeed_config("deepspeed-zero3-offload")
    assert offload["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert get_zero_force_ds_cpu_optimizer(offload) is False
    assert get_zero_force_ds_cpu_optimizer(deepspeed_config("deepspeed-zero3")) is True


@pytest.mark.parametrize("strategy", ZERO)
def test_accelerate_launch_takes_the_emitted_yaml(
    tiny_models: dict[str, Path], tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate 1.16 as `accelerate launch` reads the emitted YAML and the script's command line: the DeepSpeed
    config is the one beside the files (not the working directory's), and `DeepSpeedPlugin._deepspeed_config_checks`
    passes with the fields the launcher hands the ranks (it raised on mixed_precision beside deepspeed_config_file)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin

    files = _files(tiny_models["llama"], strategy)
    out = tmp_path / "files"
    files.write(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ds_config.json").write_text("{}")
    monkeypatch.chdir(elsewhere)
    script = (out / "accelerate-launch.sh").read_text()
    assert f"{'$(cd'}" in script and '/ds_config.json"' in script
    argv = [
        "--config_file",
        str(out / "accelerate-config.yaml"),
        "--deepspeed_config_file",
        str(out / "ds_config.json"),
    ]
    args, defaults, mp_from_config = _validate_launch_command(launch_command_parser().parse_args([*argv, "x.py"]))
    assert args.use_deepspeed and Path(args.deepspeed_config_file) == out / "ds_config.json"
    # accelerate 1.16 `launch_command`: the fields the ranks' DeepSpeedPlugin checks
    fields = [*defaults.deepspeed_config, *(["mixed_precision"] if mp_from_config else [])]
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(fields).lower())
    DeepSpeedPlugin._deepspeed_config_checks(None)  # type: ignore[arg-type]


def test_accelerate_launch_sh_passes_the_config_beside_it(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """accelerate-launch.sh run from another folder (which holds its own ds_config.json) names the one beside it."""
    files = _files(tiny_models["llama"], "deepspeed-zero3")
    out = tmp_path / "files"
    files.write(out)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "accelerate").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake / "accelerate").chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ds_config.json").write_text("{}")
    import subprocess

    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "MASTER_ADDR": "127.0.0.1"}
    done = subprocess.run(
        ["bash", str(out / "accelerate-launch.sh")], cwd=elsewhere, env=env, capture_output=True, text=True, check=True
    )
    argv = json.loads(done.stdout)
    assert argv[argv.index("--deepspeed_config_file") + 1] == str(out / "ds_config.json")


@pytest.mark.parametrize("strategy", ZERO)
def test_torchrun_ranks_are_placed_as_deepspeed_ranks(tiny_models: dict[str, Path], strategy: str) -> None:
    """The torchrun scripts export what `accelerate launch` sets for DeepSpeed, so a rank's launch reads as
    DeepSpeed with its stage (ZeRO-3: no device_map, partitioned at load)."""
    from cudaload.capability.launch import read_launch

    files = _files(tiny_models["llama"], strategy)
    script = files.files["torchrun-node0.sh"]
    exports = dict(
        line.removeprefix("export ").split("=", 1) for line in script.splitlines() if line.startswith("export ACC")
    )
    launch = read_launch({"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", **exports})
    assert (launch.strategy, launch.zero_stage) == ("deepspeed", zero_stage(strategy))
    assert launch.shards_parameters == (zero_stage(strategy) == 3)
