"""policy/settle.py: the placement step. Compose, place (through the `Placer` fact provider), judge again,
in at most `PLACEMENT_ROUNDS` rounds, all inside decide_plan: no policy function runs after it returns."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import cudaload
import cudaload.policy
from cudaload.facts.machine import Machine
from cudaload.policy import decide_plan
from cudaload.policy.settle import PLACEMENT_ROUNDS
from cudaload.request import Request
from model_shapes import llama

GiB = 1024**3
POLICY_DIR = str(Path(cudaload.policy.__file__).parent)
MIXED = ["T4", "A100"]  # cuda:0 runs fp16 (sm75), cuda:1 bf16 (sm80)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cudaload.demo import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


class _Spy:
    """Every call into a function defined under cudaload/policy/ (public or private, however it was imported),
    tagged with whether decide_plan (as the planner calls it) had returned; and every upstream placement."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import cudaload.capability.upstream_placement as upstream
        import cudaload.policy as policy

        self.phase = "before"
        self.calls: dict[str, list[str]] = {"before": [], "during": [], "after": []}
        self.placements: list[tuple[str, dict[Any, Any]]] = []
        real_decide, real_place = policy.decide_plan, upstream.upstream_placement

        def decide(*args: Any, **kwargs: Any) -> cudaload.Plan:
            self.phase = "during"
            result = real_decide(*args, **kwargs)
            self.phase = "after"
            return result

        def place(model: Any, auto_class: str, dtype: str, max_memory: Mapping[Any, Any], **kw: Any) -> Any:
            self.placements.append((dtype, dict(max_memory)))
            return real_place(model, auto_class, dtype, max_memory, **kw)

        monkeypatch.setattr(policy, "decide_plan", decide)  # the planner imports it when it decides
        monkeypatch.setattr(upstream, "upstream_placement", place)

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(POLICY_DIR):
            self.calls[self.phase].append(frame.f_code.co_name)

    def run(self, model: Path, **kwargs: Any) -> cudaload.Plan:
        sys.setprofile(self.profile)
        try:
            return cudaload.plan(model, **kwargs)
        finally:
            sys.setprofile(None)


@pytest.mark.parametrize(
    ("max_memory", "device_map", "dtype"),
    [
        ({0: "1GiB", 1: "1GiB"}, "auto", "float16"),  # filled both GPUs: the T4 decides
        ({0: "1GiB", 1: "1GiB"}, None, "float16"),  # first guessed on the A100, landed on both: judged again
        ({1: "1GiB", "cpu": "1GiB"}, "auto", "bfloat16"),  # transformers fills the A100 alone: the A100 decides
    ],
)
def test_no_policy_function_runs_after_decide_plan_returns(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Path, max_memory: dict[Any, str], device_map: Any, dtype: str
) -> None:
    spy = _Spy(monkeypatch)
    extra = {"device_map": device_map} if device_map is not None else {}
    result = spy.run(tiny_model, machine=Machine.simulated(MIXED), max_memory=max_memory, **extra)
    assert "settle_placement" in spy.calls["during"] and "judge_upstream_placement" in spy.calls["during"]
    assert spy.calls["after"] == []  # the planner gathers and the policy decides: nothing judges the Plan after
    assert 1 <= len(spy.placements) <= PLACEMENT_ROUNDS
    assert all(caps == max_memory for _, caps in spy.placements)
    assert result.kwargs["device_map"] == "auto" and result.dtype == dtype
    assert "did not settle" not in result.decision("device_map").reason


def test_a_spread_that_upstream_offloads_is_warned_inside_decide_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Qwen3-shaped 33.7 GiB on 2x A10G of tests/test_upstream_round4.py: upstream keeps room for the largest
    # layer on GPU 0 and, with no "cpu" key, sends the rest to disk. The warning is now the policy's own.
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=50,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        dtype="bfloat16",
    )
    spy = _Spy(monkeypatch)
    sys.setprofile(spy.profile)
    try:
        result = cudaload.plan(config, machine=Machine.simulated("A10G", count=2))
    finally:
        sys.setprofile(None)
    assert spy.calls["after"] == [] and len(spy.placements) == 1  # uniform GPUs: one round
    assert any("transformers will put" in w and "on disk" in w for w in result.warnings)


class _ScriptedPlacer:
    """A fake `Placer`: answers from a script (bytes on the GPUs it names), counting its calls."""

    def __init__(self, *answers: tuple[str, ...] | None) -> None:
        self.script: Iterator[tuple[str, ...] | None] = iter(answers)
        self.asked: list[str] = []

    def __call__(self, dtype: str, max_memory: Mapping[Any, Any]) -> dict[str, int] | None:
        self.asked.append(dtype)
        devices = next(self.script, ("0",))
        return None if devices is None else {device: GiB for device in devices}


def _capped(placer: _ScriptedPlacer | None) -> cudaload.Plan:
    # Llama-3-8B fits the A100 in 16 bits: the first guess judges the A100; your max_memory makes a spread.
    request = Request(max_memory={0: "10GiB", 1: "70GiB"})
    return decide_plan(Machine.simulated(MIXED), llama(8), request, placer=placer)


def test_a_placer_that_never_agrees_stops_at_the_bound_with_a_reason() -> None:
    # Judged on the A100 it lands on the T4 (not valid: judged again on every GPU); judged on every GPU it lands
    # on the T4 (valid, judged again there); judged on the T4 it lands on the A100. Never where it was judged.
    placer = _ScriptedPlacer(("0",), ("0",), ("1",), ("0",), ("1",))
    result = _capped(placer)
    assert len(placer.asked) == PLACEMENT_ROUNDS == 3
    assert placer.asked == ["bfloat16", "float16", "float16"]  # A100, every GPU, T4
    reason = result.decision("device_map").reason
    assert f"did not settle (at most {PLACEMENT_ROUNDS} rounds" in reason
    assert "judged on Tesla T4 (cuda:0), NVIDIA A100" in reason and "land on Tesla T4 (cuda:0)" in reason
    assert result.dtype == "float16"  # the plan judged on every GPU it may touch is kept: the T4 decides


@pytest.mark.parametrize(
    "script",
    [
        (("1",), ("0",), ("1",), ("0",)),
        (("0",), ("1",), ("0",), ("1",)),
        (("2",), ("0",), ("1",), ("2",)),
        (("0", "2"), ("1",), ("0",), ("2",)),
        (None, ("0",), None, ("1",)),
        (("cpu",), ("disk",), ("0",), ("1",)),
    ],
)
def test_the_bound_holds_for_any_placer(script: tuple[tuple[str, ...] | None, ...]) -> None:
    machine = Machine.simulated(["T4", "V100", "A100"])
    placer = _ScriptedPlacer(*script)
    composed: list[str] = []
    real = cudaload.policy._compose

    def compose(*args: Any) -> cudaload.Plan:
        composed.append(args[1].describe())
        return real(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cudaload.policy, "_compose", compose)
        result = decide_plan(machine, llama(8), Request(max_memory={0: "10GiB", 1: "10GiB", 2: "70GiB"}), placer=placer)
    assert 1 <= len(placer.asked) <= PLACEMENT_ROUNDS and len(composed) == len(placer.asked)
    assert len(set(composed)) == len(composed)  # no GPUs judged twice
    assert result.kwargs["device_map"] == "auto" and result.dtype in ("float16", "bfloat16")


def test_a_placer_that_agrees_settles_where_it_lands() -> None:
    # Upstream fills the A100 alone: judged there (bf16), one round, no note.
    placer = _ScriptedPlacer(("1",))
    result = _capped(placer)
    assert placer.asked == ["bfloat16"] and result.dtype == "bfloat16"
    assert "did not settle" not in result.decision("device_map").reason
    # Filling both GPUs, the T4 decides: judged again on every GPU, where it settles.
    both = _ScriptedPlacer(("0", "1"), ("0", "1"))
    result = _capped(both)
    assert both.asked == ["bfloat16", "float16"] and result.dtype == "float16"


def test_no_placer_or_no_answer_keeps_every_gpu_a_spread_may_touch() -> None:
    without = _capped(None)
    unknown = _ScriptedPlacer(None, None)
    answered_none = _capped(unknown)
    assert without.dtype == answered_none.dtype == "float16" and unknown.asked == ["bfloat16", "float16"]


def test_the_placer_is_asked_only_for_cudaloads_unquantized_spread() -> None:
    placer = _ScriptedPlacer(("1",))
    pinned = decide_plan(Machine.simulated(MIXED), llama(8), Request(device_map="cuda:0"), placer=placer)
    one_gpu = decide_plan(Machine.simulated("H100"), llama(8), Request(), placer=placer)
    assert pinned.kwargs["device_map"] == "cuda:0" and one_gpu.kwargs["device_map"] == "cuda:0"
    assert placer.asked == []
