"""Plans decided before, read back instead of decided again (planner/plan_store.py), and the exact JSON they are
stored in (plans/exact_json.py): a stored plan applies what deciding again would, any change of an input misses
it, and a fresh process that reads one never imports the policy."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import typing
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

import cudaload
from cudaload.capability import detect
from cudaload.planner import plan_store, planning
from cudaload.planner.plan_store import PLAN_RECORDS, applied, code_identity, plan_key, store_plan, stored_plan
from cudaload.plans import Decision, Plan, Rejected
from cudaload.plans.decision import ReadOnlyDict
from cudaload.plans.exact_json import NotExact, decode, encode


@pytest.fixture
def store_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The store as outside the tests (conftest.py turns it off), in a cache of this test's own."""
    monkeypatch.setattr(planning, "plan_key", plan_store.plan_key)
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "plans"


def _decided(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the policy's runs from here on."""
    import cudaload.policy

    calls: list[int] = []
    real = cudaload.policy.decide_plan

    def counted(*args: Any, **kwargs: Any) -> Plan:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cudaload.policy, "decide_plan", counted)
    return calls


# --- exact JSON -----------------------------------------------------------------------------------------------


def test_exact_json_reads_back_every_type_a_plan_holds() -> None:
    value = {
        "tuple": (1, "a", None),
        0: "a GPU index, an int key",
        "set": frozenset({"b", "a", "c"}),
        "read-only": ReadOnlyDict({"cpu": "10GiB", "nested": ReadOnlyDict({"x": [1.5, True]})}),
        "decision": Decision("dtype", ("bfloat16",), "why", (Rejected({"": 0}, "no"),), "user"),
    }
    back = decode(json.loads(json.dumps(encode(value))), {"Decision": Decision, "Rejected": Rejected})
    assert back == value
    assert type(back) is dict and list(back) == list(value)  # keys in order, the int key an int
    assert type(back["tuple"]) is tuple and type(back["set"]) is frozenset
    assert type(back["read-only"]) is ReadOnlyDict and type(back["read-only"]["nested"]) is ReadOnlyDict
    assert type(back["decision"].value) is tuple and type(back["decision"].rejected[0].value) is dict


def test_exact_json_writes_a_frozenset_the_same_whatever_its_order() -> None:
    items = [f"flag{i}" for i in range(40)]
    assert encode(frozenset(items)) == encode(frozenset(reversed(items)))


class _Colour(Enum):
    RED = 1


@pytest.mark.parametrize("value", [math.nan, math.inf, object(), {1, 2}, _Colour.RED, Path("/x"), b"bytes"])
def test_exact_json_refuses_a_value_without_an_exact_form(value: Any) -> None:
    with pytest.raises(NotExact):
        encode({"key": [value]})


@pytest.mark.parametrize(
    "data",
    [
        {"record": ["Popen", {"args": "rm -rf /"}]},  # not a record it is given: nothing is imported or built
        {"record": ["Decision"]},
        {"tuple": [1], "dict": []},  # two tags
        {"plain": 1},  # an object is always a tag
        {"dict": [[1]]},
        {"tuple": "abc"},
    ],
)
def test_exact_json_refuses_a_layout_it_does_not_write(data: Any) -> None:
    with pytest.raises(ValueError):
        decode(data, {"Decision": Decision})


def _records(hint: Any, found: set[type]) -> None:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint not in found:
            found.add(hint)
            hints = typing.get_type_hints(hint)
            for f in dataclasses.fields(hint):
                _records(hints[f.name], found)
        return
    for arg in typing.get_args(hint):
        _records(arg, found)


def test_the_records_a_stored_plan_may_name_are_the_records_an_inference_plan_holds() -> None:
    found: set[type] = set()
    _records(Plan, found)
    from cudaload.plans import CheckProof, FinetunePlan
    from cudaload.plans.sections import ApplyFacts

    # Filled after the policy (CheckProof, ApplyFacts) or only for fine-tuning, which is not stored.
    assert set(PLAN_RECORDS.values()) == found - {CheckProof, ApplyFacts, FinetunePlan}
    assert all(PLAN_RECORDS[cls.__qualname__] is cls for cls in found - {CheckProof, ApplyFacts, FinetunePlan})


# --- the store -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "llama", "gpt2"])
@pytest.mark.parametrize(
    "asked",
    [
        {},
        {"generate": True},
        {"generate": None, "workload": "decode-heavy"},
        {"dtype": "float32", "max_memory": {"cpu": "8GiB"}},
    ],
)
def test_a_stored_plan_is_the_plan_the_policy_decides(
    tiny_models: dict[str, Path], store_on: Path, monkeypatch: pytest.MonkeyPatch, family: str, asked: dict[str, Any]
) -> None:
    # A probe measured now is said in the dtype's reason ("(cached)" once read back): another plan, another key.
    cudaload.plan(tiny_models[family], **asked)
    stored = len(list(store_on.glob("*.json")))
    calls = _decided(monkeypatch)
    first = cudaload.plan(tiny_models[family], **asked)
    assert len(calls) in (0, 3)  # the plan, then at both ends of the RAM range before it is stored
    assert len(list(store_on.glob("*.json"))) == stored + (len(calls) > 0)
    first = cudaload.plan(tiny_models[family], **asked)
    decided = len(calls)
    again = cudaload.plan(tiny_models[family], **asked)
    assert len(calls) == decided  # read back: not decided again
    assert again == first and again.explain(width=120) == first.explain(width=120)
    for name in ("generation_fallbacks", "tokenizer", "hub_code", "check_proof", "apply_facts"):
        assert getattr(again, name) == getattr(first, name), name
    assert type(again.kwargs) is ReadOnlyDict and again.kwargs == first.kwargs


def test_a_stored_plan_holds_over_its_ram_range_only(tiny_models: dict[str, Path], store_on: Path) -> None:
    from cudaload.policy import decide_plan

    machine = detect()
    available = machine.cpu.memory_available
    assert available is not None
    facts = planning.read_facts(str(tiny_models["qwen3"]), None, {})
    request = planning.split_overrides(
        {}, workload=cudaload.Workload(), hub_kernels=None, generation=None, training=None
    )
    key = plan_key(str(tiny_models["qwen3"]), machine, facts, request, {})
    assert key is not None

    def decide(judged: cudaload.Machine) -> Plan:
        return decide_plan(judged, facts, request)

    plan = decide(machine)
    assert store_plan(key, plan, machine, decide)

    def at(ram: int) -> cudaload.Machine:
        return replace(machine, cpu=replace(machine.cpu, memory_available=ram))

    high = min(int(available * 1.25), machine.cpu.memory_total or available)
    assert stored_plan(key, at(int(available * 0.85))) == plan
    assert stored_plan(key, at((available + high) // 2)) == plan
    assert stored_plan(key, at(high + 1)) is None
    assert stored_plan(key, at(int(available * 0.7))) is None
    assert stored_plan(key, replace(machine, cpu=replace(machine.cpu, memory_available=None))) is None

    # A plan that applies other settings at either end of the range is not stored.
    other = replace(plan, kwargs={**plan.kwargs, "dtype": "float16"})
    answers = iter([other, plan])
    key2 = "f" * 64
    assert not store_plan(key2, plan, machine, lambda judged: next(answers))
    assert stored_plan(key2, machine) is None


def test_what_applies_differs_when_a_setting_does(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(tiny_models["qwen3"], generate=True)
    assert plan.generation is not None
    assert applied(plan) == applied(replace(plan, decisions=()))  # the reasons are not applied
    assert applied(plan) != applied(replace(plan, kwargs={**plan.kwargs, "dtype": "float16"}))
    assert applied(plan) != applied(replace(plan, warnings=("a warning",)))
    compiled = replace(plan.generation, compile=not plan.generation.compile)
    assert applied(plan) != applied(replace(plan, generation=compiled))


def _key_inputs(model: Path) -> tuple[Any, ...]:
    machine = detect()
    facts = planning.read_facts(str(model), None, {})
    request = planning.split_overrides(
        {}, workload=cudaload.Workload(), hub_kernels=None, generation=None, training=None
    )
    return str(model), machine, facts, request, {}


def test_each_input_of_the_policy_is_in_the_key(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    model, machine, facts, request, overrides = _key_inputs(tiny_models["llama"])
    base = plan_key(model, machine, facts, request, overrides)
    assert base is not None and plan_key(model, machine, facts, request, overrides) == base
    changed = [
        (model, replace(machine, cpu=replace(machine.cpu, cores=machine.cpu.cores + 1)), facts, request),
        (
            model,
            replace(machine, software=replace(machine.software, packages=(("transformers", "9.9"),))),
            facts,
            request,
        ),
        (model, replace(machine, launch=replace(machine.launch, notes=("a note",))), facts, request),
        (model, machine, replace(facts, parameters=(facts.parameters or 0) + 1), request),
        (model, machine, facts, replace(request, workload=cudaload.Workload(prompt_tokens=7))),
        (model, machine, facts, replace(request, dtype="float16")),
    ]
    keys = {plan_key(*inputs, overrides) for inputs in changed}
    assert None not in keys and base not in keys and len(keys) == len(changed)

    # The config files transformers' own placement is built from, which the facts need not hold whole.
    copy = tmp_path / "llama"
    copy.mkdir()
    for file in Path(model).iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    assert plan_key(str(copy), machine, facts, request, overrides) == base  # the same bytes, another folder
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "unused_by_the_facts": 1}))
    assert plan_key(str(copy), machine, facts, request, overrides) not in (None, base)
    (copy / "config.json").write_text(json.dumps(config))
    (copy / "generation_config.json").write_text(json.dumps({"cache_implementation": "static"}))
    assert plan_key(str(copy), machine, facts, request, overrides) not in (None, base)


def test_the_ram_available_is_left_out_of_the_key(tiny_models: dict[str, Path]) -> None:
    model, machine, facts, request, overrides = _key_inputs(tiny_models["llama"])
    moved = replace(machine, cpu=replace(machine.cpu, memory_available=12345))
    assert plan_key(model, moved, facts, request, overrides) == plan_key(model, machine, facts, request, overrides)


def test_the_key_is_the_same_in_another_process_whatever_its_hash_seed(tiny_models: dict[str, Path]) -> None:
    code = (
        "import sys; from cudaload.capability import detect; from cudaload.planner import planning, plan_store; "
        "import cudaload; m = sys.argv[1]; facts = planning.read_facts(m, None, {}); "
        "r = planning.split_overrides({}, workload=cudaload.Workload(), hub_kernels=None, generation=None, "
        "training=None); print(plan_store.plan_key(m, detect(), facts, r, {}))"
    )
    keys = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code, str(tiny_models["gpt2"])], env=env, capture_output=True, text=True, check=True
        )
        keys.add(done.stdout.strip())
    assert len(keys) == 1 and len(next(iter(keys))) == 64


@pytest.mark.parametrize(
    "overrides",
    [
        {"trust_remote_code": True},  # its modeling files place the meta model
        {"subfolder": "inner"},
        {"revision": None, "gguf_file": "model.gguf"},
    ],
)
def test_no_key_where_the_inputs_are_not_all_in_it(tiny_models: dict[str, Path], overrides: dict[str, Any]) -> None:
    model, machine, facts, request, _ = _key_inputs(tiny_models["qwen3"])
    assert plan_key(model, machine, facts, request, overrides) is None


def test_no_key_for_a_finetuning_plan_or_a_value_without_an_exact_form(tiny_models: dict[str, Path]) -> None:
    model, machine, facts, request, overrides = _key_inputs(tiny_models["qwen3"])
    from cudaload.request import TrainingRequest

    assert plan_key(model, machine, facts, replace(request, training=TrainingRequest()), overrides) is None
    assert plan_key(model, machine, facts, replace(request, passthrough={"x": object()}), overrides) is None
    assert plan_key(str(Path(model) / "missing"), machine, facts, request, overrides) is None


def test_nothing_is_stored_for_a_simulated_machine_or_a_finetuning_plan(
    tiny_models: dict[str, Path], store_on: Path
) -> None:
    cudaload.plan(tiny_models["qwen3"], machine=cudaload.Machine.simulated("T4"))
    cudaload.plan(tiny_models["qwen3"], finetune=True)
    assert not store_on.exists() or not list(store_on.glob("*.json"))


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: "{not json",
        lambda data: json.dumps({**data, "schema": 0}),
        lambda data: json.dumps({**data, "key": "0" * 64}),
        lambda data: json.dumps({**data, "plan": {"record": ["Popen", {}]}}),
        lambda data: json.dumps({**data, "plan": {"record": ["Plan", {"model": "x"}]}}),  # fields missing
        lambda data: json.dumps({**data, "ram": [1, 2]}),
        lambda data: json.dumps({**data, "ram": "all"}),
    ],
)
def test_a_damaged_stored_plan_is_decided_again_and_rewritten(
    tiny_models: dict[str, Path], store_on: Path, monkeypatch: pytest.MonkeyPatch, damage: Any
) -> None:
    cudaload.plan(tiny_models["gpt2"])  # the probe measured (and said so): the plans after read it from the cache
    for path in store_on.glob("*.json"):
        path.unlink()
    first = cudaload.plan(tiny_models["gpt2"])
    (path,) = store_on.glob("*.json")
    good = json.loads(path.read_text())
    path.write_text(damage(good))
    calls = _decided(monkeypatch)
    assert cudaload.plan(tiny_models["gpt2"]) == first
    assert len(calls) == 3  # decided again, then at both ends of the range
    assert json.loads(path.read_text())["plan"] == good["plan"]


def test_the_code_identity_of_an_install_is_its_record_and_of_a_source_tree_its_files(tmp_path: Path) -> None:
    site = tmp_path / "site"
    package = site / "cudaload"
    (package / "policy").mkdir(parents=True)
    (package / "policy" / "rule.py").write_text("A = 1\n")
    code_identity.cache_clear()
    source = code_identity(str(package))
    (package / "policy" / "rule.py").write_text("A = 22\n")  # an edit of the policy, the same version
    code_identity.cache_clear()
    assert code_identity(str(package)) != source
    record = site / f"cudaload-{cudaload.__version__}.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("cudaload/policy/rule.py,,\n")
    code_identity.cache_clear()
    installed = code_identity(str(package))
    assert "RECORD" in installed
    record.write_text("cudaload/policy/rule.py,sha256=x,7\n")  # installed again
    os.utime(record, ns=(1, 1))
    code_identity.cache_clear()
    assert code_identity(str(package)) not in (installed, source)
    code_identity.cache_clear()


def test_a_fresh_process_loads_a_stored_plan_without_importing_the_policy(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    code = (
        "import json, sys; import cudaload; m = cudaload.load(sys.argv[1]); p = m.cudaload_plan.plan; "
        "print(json.dumps({'policy': 'cudaload.policy' in sys.modules, 'plan': p.to_json(), "
        "'explain': p.explain(width=120)}))"
    )
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache"), "CUDALOAD_PROBE": "0"}
    outs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", code, str(tiny_models["qwen3"])],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [out["policy"] for out in outs] == [True, False]
    assert outs[1]["plan"] == outs[0]["plan"] and outs[1]["explain"] == outs[0]["explain"]
