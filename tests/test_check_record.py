"""A test forward that passed once for a checkpoint, its kwargs, these versions and this machine is not run
again on the next load (planner/check_proof.py reads the record, loaders/check_record.py skips or writes
it), it says so, and anything the proof depends on makes the next load run it again."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload.demo import build_tiny_model
from cudaload.errors import SettingError
from cudaload.planner import check_proof as check_proof_module


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
    assert json.loads(record.read_text())["key"] == proof.key  # written again after the full check
    assert _load(model, forwards)[1] == 0


def test_plans_the_record_does_not_apply_to_carry_no_proof(model: Path) -> None:
    simulated = cudaload.plan(model, machine=cudaload.Machine.simulated("A100"))
    assert simulated.check_proof is None and simulated.check_proven is None
    assert cudaload.plan(model, finetune=True, quantize=None).check_proof is None


def test_verify_takes_true_false_or_full(model: Path) -> None:
    with pytest.raises(SettingError, match='pass True, False, or "full"'):
        cudaload.load(model, verify="yes")  # type: ignore[arg-type]
