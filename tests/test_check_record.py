"""A test forward that passed once for a checkpoint, its kwargs, these versions and this machine is not run
again on the next load (planner/check_proof.py reads the record, loaders/check_record.py skips or writes
it), it says so, and anything the proof depends on makes the next load run it again."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload.demo import build_tiny_model
from cudaload.errors import SettingError
from cudaload.facts.hub import HubKernel
from cudaload.planner import check_proof as check_proof_module
from cudaload.plans.check_proof import judge


@pytest.fixture(autouse=True)
def _proofs_used(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """conftest runs every test forward (CUDALOAD_VERIFY=full); these tests are about skipping it."""
    monkeypatch.delenv("CUDALOAD_VERIFY", raising=False)
    yield


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A tiny checkpoint of this test's own: its folder and file times are in the proof's key."""
    return build_tiny_model(tmp_path / "tiny")


@pytest.fixture
def forwards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the tiny model's forward calls (the test forward is the only one a load makes)."""
    from transformers import Qwen3ForCausalLM

    calls: list[int] = []
    real: Callable[..., Any] = Qwen3ForCausalLM.forward

    @functools.wraps(real)  # check_inputs reads the forward's parameters through __wrapped__
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Qwen3ForCausalLM, "forward", counted)
    return calls


def _load(model: Path, forwards: list[int], **kwargs: Any) -> tuple[cudaload.AppliedPlan, int]:
    """The applied plan of one load, and how many forwards it ran."""
    before = len(forwards)
    applied = cudaload.load(model, dtype="float32", **kwargs).cudaload_plan
    return applied, len(forwards) - before


def test_a_second_load_does_not_run_the_proven_forward_and_says_so(model: Path, forwards: list[int]) -> None:
    first, ran = _load(model, forwards)
    assert (ran, first.verified, first.check_proven) == (1, True, "")
    assert cudaload.plan(model, dtype="float32").check_proven is not None  # the planner read the record

    second, ran = _load(model, forwards)
    assert ran == 0
    assert second.verified is True
    assert second.check_proven.startswith("proven on this machine at ")
    assert "torch " in second.check_proven and "transformers " in second.check_proven
    assert second.plan.check_proven == second.check_proven
    text = second.explain()
    assert "test forward not run again, proven on this machine" in text
    assert 'verify="full"' in text and "CUDALOAD_VERIFY=full" in text
    assert second.to_dict()["check_proven"] == second.check_proven
    # Still checked, cheaply: the dtype and attention read back from the model, no weight missing.
    assert (second.dtype, second.attn_implementation, second.missing_weights) == ("float32", "sdpa", ())


def _rewrite_config(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    config["rope_theta"] = float(config.get("rope_theta") or 10000.0) * 2
    (model / "config.json").write_text(json.dumps(config))


def _touch_weights(model: Path) -> None:
    weights = model / "model.safetensors"
    info = weights.stat()
    os.utime(weights, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))  # the same bytes, rewritten later


def _new_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    real = check_proof_module.proof_versions
    monkeypatch.setattr(check_proof_module, "proof_versions", lambda machine: {**real(machine), "transformers": "9.9"})


@pytest.mark.parametrize(
    ("change", "kwargs"),
    [
        ("dtype", {"dtype": "bfloat16"}),
        ("attention", {"attn_implementation": "eager"}),
        ("config", {}),
        ("weights", {}),
        ("versions", {}),
    ],
)
def test_what_the_proof_depends_on_makes_the_forward_run_again(
    model: Path, forwards: list[int], monkeypatch: pytest.MonkeyPatch, change: str, kwargs: dict[str, Any]
) -> None:
    _load(model, forwards)
    if change == "config":
        _rewrite_config(model)
    elif change == "weights":
        _touch_weights(model)
    elif change == "versions":
        _new_transformers(monkeypatch)
    arguments = {"dtype": "float32", **kwargs}
    before = len(forwards)
    applied = cudaload.load(model, **arguments).cudaload_plan
    assert len(forwards) - before == 1, change
    assert applied.check_proven == ""
    again = cudaload.load(model, **arguments).cudaload_plan  # and that one is proven in turn
    assert again.check_proven != ""


def test_verify_full_and_the_environment_variable_run_it(
    model: Path, forwards: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _load(model, forwards)
    applied, ran = _load(model, forwards, verify="full")
    assert (ran, applied.check_proven, applied.verified) == (1, "", True)
    monkeypatch.setenv("CUDALOAD_VERIFY", "full")
    assert cudaload.plan(model, dtype="float32").check_proven is None
    applied, ran = _load(model, forwards)
    assert (ran, applied.check_proven) == (1, "")
    monkeypatch.delenv("CUDALOAD_VERIFY")
    assert _load(model, forwards)[1] == 0  # the full runs kept the record


def test_verify_false_neither_runs_it_nor_claims_a_proof(model: Path, forwards: list[int]) -> None:
    _load(model, forwards)
    applied, ran = _load(model, forwards, verify=False)
    assert (ran, applied.verified, applied.check_proven) == (0, None, "")


@pytest.mark.parametrize("garbage", [b"\x00not json", b"[1, 2]", b'{"kind": "check-forward"}', b"wrong-key"])
def test_a_corrupt_record_is_ignored_and_rewritten(model: Path, forwards: list[int], garbage: bytes) -> None:
    _load(model, forwards)
    proof = cudaload.plan(model, dtype="float32").check_proof
    assert proof is not None and proof.proven is not None
    record = Path(proof.path)
    if garbage == b"wrong-key":  # a well-formed record of another key, under this key's name
        data = json.loads(record.read_text())
        garbage = json.dumps({**data, "key": "0" * 16}).encode()
    record.write_bytes(garbage)
    applied, ran = _load(model, forwards)
    assert (ran, applied.check_proven) == (1, "")
    assert json.loads(record.read_text())["key"] == judge(proof).key  # written again after the full check
    assert _load(model, forwards)[1] == 0


def test_plans_the_record_does_not_apply_to_carry_no_proof(model: Path) -> None:
    simulated = cudaload.plan(model, machine=cudaload.Machine.simulated("A100"))
    assert simulated.check_proof is None and simulated.check_proven is None
    assert cudaload.plan(model, finetune=True, quantize=None).check_proof is None


def test_verify_takes_true_false_or_full(model: Path) -> None:
    with pytest.raises(SettingError, match='pass True, False, or "full"'):
        cudaload.load(model, verify="yes")  # type: ignore[arg-type]


def _poison(weights: Path, *, keep_times: bool) -> None:
    """Rewrite `weights` in place with all-NaN tensors of the same shapes (so the same size), and with
    `keep_times` restore its access and modification times as `touch -r`, `cp -p` and `tar x` do."""
    import torch
    from safetensors.torch import load_file, save_file

    info = weights.stat()
    tensors = {name: torch.full_like(t, float("nan")) for name, t in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    if keep_times:
        os.utime(weights, ns=(info.st_atime_ns, info.st_mtime_ns))
        assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (info.st_size, info.st_mtime_ns)


def _loads_nan_weights(model: Path | cudaload.Plan, forwards: list[int]) -> int:
    """How many forwards a load of poisoned weights ran: it must run the test forward and refuse them."""
    before = len(forwards)
    kwargs = {} if isinstance(model, cudaload.Plan) else {"dtype": "float32"}
    with pytest.raises(cudaload.LoadFailedError, match="non-finite"):
        cudaload.load(model, **kwargs)
    return len(forwards) - before


def test_nan_weights_with_the_same_size_and_modification_time_are_not_proven(model: Path, forwards: list[int]) -> None:
    _load(model, forwards)
    _poison(model / "model.safetensors", keep_times=True)  # the ctime moved: no one can set it back
    assert _loads_nan_weights(model, forwards) >= 1


def test_shards_an_index_puts_in_a_subfolder_are_in_the_proof(model: Path, forwards: list[int]) -> None:
    from safetensors import safe_open

    shards = model / "shards"
    shards.mkdir()
    shard = shards / "model-00001-of-00001.safetensors"
    (model / "model.safetensors").rename(shard)
    with safe_open(shard, "pt") as handle:
        names = list(handle.keys())
    index = {"metadata": {}, "weight_map": {name: "shards/model-00001-of-00001.safetensors" for name in names}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    first, ran = _load(model, forwards)
    assert (ran, first.verified) == (1, True)  # transformers loads the shards from the subfolder
    assert _load(model, forwards)[1] == 0
    _poison(shard, keep_times=False)
    assert _loads_nan_weights(model, forwards) >= 1


def test_a_pickled_plan_is_judged_when_applied_not_when_planned(model: Path, forwards: list[int]) -> None:
    _load(model, forwards)
    planned = cudaload.plan(model, dtype="float32")
    assert planned.check_proven is not None
    shipped = pickle.dumps(planned)
    _poison(model / "model.safetensors", keep_times=False)
    assert _loads_nan_weights(pickle.loads(shipped), forwards) >= 1


def test_a_plan_proven_on_one_host_runs_the_forward_on_another(
    model: Path, forwards: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _load(model, forwards)
    planned = cudaload.plan(model, dtype="float32")
    assert planned.check_proven is not None
    monkeypatch.setattr(socket, "gethostname", lambda: "host-b.example")
    before = len(forwards)
    applied = cudaload.load(planned).cudaload_plan
    assert (len(forwards) - before, applied.check_proven) == (1, "")
    assert cudaload.load(planned).cudaload_plan.check_proven != ""  # proven on host B in turn


def test_packages_installed_when_applying_are_in_the_proof(
    model: Path, forwards: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _load(model, forwards)
    planned = cudaload.plan(model, dtype="float32")
    site = tmp_path / "site"
    for dist in ("flash_attn-2.8.3", "flash_attn_3-3.0.0", "torchao-0.17.0", "triton-3.6.0"):
        (site / f"{dist}.dist-info").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    before = len(forwards)
    assert cudaload.load(planned).cudaload_plan.check_proven == ""
    assert len(forwards) - before == 1


@pytest.mark.parametrize(
    "change",
    ["flash-attn", "flash-attn-3", "flash-attn-4", "torchao", "triton", "driver", "hub kernel revision"],
)
def test_the_planning_key_holds_every_package_and_revision_that_runs_the_forward(model: Path, change: str) -> None:
    from cudaload.capability import detect

    machine = detect()
    planned = cudaload.plan(model, dtype="float32")
    kernel = HubKernel("kernels-community/flash-attn2", 1, "torch-cpu", "cached", "a" * 40)
    base = dataclasses.replace(machine, hub=dataclasses.replace(machine.hub, kernels=(kernel,)))
    software = base.software
    if change == "driver":
        other = dataclasses.replace(base, software=dataclasses.replace(software, driver="999.1"))
    elif change == "hub kernel revision":
        moved = dataclasses.replace(kernel, revision="b" * 40)
        other = dataclasses.replace(base, hub=dataclasses.replace(base.hub, kernels=(moved,)))
    else:
        packages = (*(p for p in software.packages if p[0] != change), (change, "9.9.9"))
        other = dataclasses.replace(base, software=dataclasses.replace(software, packages=packages))
    keys = {check_proof_module.check_proof(str(model), planned, m, {}).key for m in (base, other)}  # type: ignore[union-attr]
    assert len(keys) == 2, change


@pytest.mark.parametrize("word", ["banana", "ful", "1"])
def test_cudaload_verify_is_validated_when_applying(model: Path, monkeypatch: pytest.MonkeyPatch, word: str) -> None:
    planned = cudaload.plan(model, dtype="float32")
    monkeypatch.setenv("CUDALOAD_VERIFY", word)
    with pytest.raises(SettingError, match=r"CUDALOAD_VERIFY=.*accepted values are 'auto' or 'full'"):
        cudaload.load(planned)


def test_cudaload_verify_full_set_after_planning_runs_the_forward(
    model: Path, forwards: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _load(model, forwards)
    planned = cudaload.plan(model, dtype="float32")
    assert planned.check_proven is not None
    monkeypatch.setenv("CUDALOAD_VERIFY", "full")
    before = len(forwards)
    assert cudaload.load(planned).cudaload_plan.check_proven == ""
    assert len(forwards) - before == 1
    monkeypatch.setenv("CUDALOAD_VERIFY", "auto")
    assert cudaload.load(planned).cudaload_plan.check_proven != ""
