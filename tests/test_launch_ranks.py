"""What a launched rank checks before it loads a weight (issue 47): the manifest read as a bounded regular file
of a known schema, the model as well as the decisions and the layout, a Plan as well as a model name, a process
no launcher started, the same verdict on every rank; and the layout inputs checked where they enter."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

import cudaload
from cudaload.capability.launch import read_launch
from cudaload.errors import LaunchManifestError, LaunchMismatchError, PlacementError, SettingError
from cudaload.launch import MANIFEST, check_launched_plan, read_manifest
from cudaload.launch.agree import rank_record, verdict

CPU = cudaload.Machine.simulated(None)
RANK0 = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


def _written(tmp_path: Path, model: Path, **kwargs: object) -> Path:
    files = cudaload.launch_files(model, machine=CPU, emit=["torchrun"], quantize=None, dtype="float32", **kwargs)  # type: ignore[arg-type]
    files.write(tmp_path / "launch")
    return tmp_path / "launch" / MANIFEST


def _rank_plan(model: Path, **kwargs: object) -> cudaload.Plan:
    return cudaload.plan(model, machine=CPU, finetune=True, nodes=1, quantize=None, dtype="float32", **kwargs)  # type: ignore[arg-type]


# ---- the manifest, read with care -------------------------------------------------------------------------------


def _read_in_time(where: str) -> BaseException | None:
    """read_manifest in a thread that must be done within 10 s (a FIFO would block it forever)."""
    found: list[BaseException | None] = []

    def read() -> None:
        try:
            read_manifest({"CUDALOAD_LAUNCH": where})
            found.append(None)
        except BaseException as exc:
            found.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), f"read_manifest({where!r}) still running after 10 s"
    return found[0]


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    error = _read_in_time(str(fifo))
    assert isinstance(error, LaunchManifestError) and str(fifo) in str(error) and "regular file" in str(error)


def test_dev_zero_and_a_huge_file_are_refused(tmp_path: Path) -> None:
    error = _read_in_time("/dev/zero")
    assert isinstance(error, LaunchManifestError) and "/dev/zero" in str(error)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (2 << 20))
    error = _read_in_time(str(huge))
    assert isinstance(error, LaunchManifestError) and "bytes" in str(error)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda m: m.pop("decisions"), "'decisions' is missing"),
        (lambda m: m.update(nodes="2"), "'nodes' is str"),
        (lambda m: m.update(nodes=True), "'nodes' is bool"),
        (lambda m: m.update(ranks_per_node=0), "'ranks_per_node' is 0"),
        (lambda m: m.update(decisions=[]), "'decisions' is list"),
        (lambda m: m.update(cudaload_launch=2), "version 3"),  # written before the node RAM was kept
        (lambda m: m.update(node_memory="2TiB"), "'node_memory' is str"),
    ],
)
def test_a_tampered_manifest_names_itself(tmp_path: Path, tiny_models: dict[str, Path], change, said: str) -> None:
    path = _written(tmp_path, tiny_models["llama"])
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(LaunchManifestError, match="CUDALOAD_LAUNCH=") as caught:
        read_manifest({"CUDALOAD_LAUNCH": str(path)})
    assert said in str(caught.value) and str(path) in str(caught.value)


# ---- the model ---------------------------------------------------------------------------------------------------


def test_another_model_fails_the_check(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """A Qwen3, or a smaller Llama, launched against a Llama manifest: named, with both values."""
    from transformers import LlamaConfig, LlamaForCausalLM

    manifest = read_manifest({"CUDALOAD_LAUNCH": str(_written(tmp_path, tiny_models["llama"]))})
    assert manifest is not None
    check_launched_plan(_rank_plan(tiny_models["llama"]), manifest)  # the same model agrees
    with pytest.raises(LaunchMismatchError, match='model model_class: this rank "Qwen3ForCausalLM"'):
        check_launched_plan(_rank_plan(tiny_models["qwen3"]), manifest)
    smaller = tmp_path / "smaller-llama"
    config = LlamaConfig.from_pretrained(tiny_models["llama"])
    config.num_hidden_layers = 1
    LlamaForCausalLM(config).save_pretrained(smaller)
    with pytest.raises(LaunchMismatchError, match="model parameters") as caught:
        check_launched_plan(_rank_plan(smaller), manifest)
    assert "config_sha256" in str(caught.value) and "weights" in str(caught.value)


# ---- load_for_finetune under a launch ----------------------------------------------------------------------------


def test_a_plain_python_run_with_the_variable_set_is_told_so(
    tmp_path: Path, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = _written(tmp_path, tiny_models["llama"], nodes=2)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDALOAD_LAUNCH", str(manifest))
    with pytest.raises(LaunchMismatchError, match="no launcher started it") as caught:
        cudaload.load_for_finetune(tiny_models["llama"], machine=CPU, quantize=None, dtype="float32")
    assert "this launch runs" not in str(caught.value) and "bash torchrun-node0.sh" in str(caught.value)


def test_a_plan_under_a_launch_is_checked(
    tmp_path: Path, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = _written(tmp_path, tiny_models["llama"], ranks_per_node=1)
    for name, value in RANK0.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDALOAD_LAUNCH", str(manifest))
    other = _rank_plan(tiny_models["llama"], ranks_per_node=1, lora={"r": 64})
    with pytest.raises(LaunchMismatchError, match='"r": 64'):
        cudaload.load_for_finetune(other)


# ---- every rank, one verdict -------------------------------------------------------------------------------------


def test_every_rank_builds_the_same_message_from_the_same_records(tiny_models: dict[str, Path]) -> None:
    same = _rank_plan(tiny_models["llama"])
    other = _rank_plan(tiny_models["llama"], lora={"r": 64})
    records = [rank_record(same, 0, []), rank_record(other, 1, ["lora: this rank r=64, planned r=16"])]
    message = verdict(records, same.model)
    assert message is not None and message == verdict(list(reversed(records)), same.model)
    assert "rank 1 (" in message and "lora: this rank r=64" in message and "Ranks that agree with it: [0]" in message
    assert "decisions lora: rank 0" in message  # how the two ranks' plans differ, key by key
    assert verdict([rank_record(same, 0, []), rank_record(same, 1, [])], same.model) is None


# ---- layout inputs -----------------------------------------------------------------------------------------------

H100 = cudaload.Machine.simulated("H100", count=8)


def test_more_ranks_than_gpus_on_a_node_is_refused(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(PlacementError, match="ranks_per_node=16 on a node of 8 GPU"):
        cudaload.plan(tiny_models["llama"], machine=H100, finetune=True, nodes=1, ranks_per_node=16)
    cudaload.plan(tiny_models["llama"], machine=CPU, finetune=True, nodes=1, ranks_per_node=16)  # a CPU run


@pytest.mark.parametrize(
    "launch",
    [
        cudaload.Launch("torchrun", world_size=8, local_world_size=8),  # cudaload plan --world-size 8
        read_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "2"}),  # inside an allocation
    ],
)
def test_explicit_layout_flags_are_never_replaced_by_the_launch(tiny_models: dict[str, Path], launch) -> None:
    machine = cudaload.Machine.simulated("H100", count=8, launch=launch)
    with pytest.raises(PlacementError, match=r"nodes=4, ranks_per_node=2 asked, but this process runs in a launch"):
        cudaload.plan(tiny_models["llama"], machine=machine, finetune=True, nodes=4, ranks_per_node=2)


def test_a_world_not_divisible_by_the_local_world_is_refused(tiny_models: dict[str, Path]) -> None:
    machine = cudaload.Machine.simulated(
        "H100", count=8, launch=cudaload.Launch("torchrun", world_size=6, local_world_size=4)
    )
    with pytest.raises(PlacementError, match="not a whole number of nodes"):
        cudaload.plan(tiny_models["llama"], machine=machine, finetune=True)


def test_a_missing_local_world_size_is_derived_or_refused() -> None:
    every = [read_launch({"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r % 2)}) for r in range(4)]
    assert all("LOCAL_WORLD_SIZE is not set" in " ".join(launch.problems) for launch in every)
    slurm = read_launch({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NNODES": "2"})
    assert slurm.local_world_size == 2 and slurm.problems == ()


@pytest.mark.parametrize("kwargs", [{"parallelism": "fsdp"}, {"interconnect": "infiniband-ndr"}])
def test_layout_flags_without_a_layout_are_refused(tiny_models: dict[str, Path], kwargs: dict) -> None:
    with pytest.raises(SettingError, match="pass nodes"):
        cudaload.plan(tiny_models["llama"], machine=H100, finetune=True, **kwargs)


def test_the_cli_refuses_parallelism_without_nodes(tiny_models: dict[str, Path], capsys) -> None:
    from cudaload.cli import main

    assert main(["plan", str(tiny_models["llama"]), "--gpu", "H100", "--finetune", "--parallelism", "fsdp"]) != 0
    assert "--nodes" in capsys.readouterr().err
