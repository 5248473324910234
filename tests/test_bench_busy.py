"""The default `cudaload bench` beside CPU-bound neighbours (issue 50, item 3): a variant stopped once decided
keeps the verdict the full grid gives, the generation comparison stops a decided or time-boxed variant as the
grid does, and on busy cores it generates fewer new tokens, saying so."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cudaload.bench import generate_bench, harness, meters
from cudaload.bench.contention import busy_generation
from cudaload.bench.generate_bench import GenerationVariant
from cudaload.bench.harness import BenchRun, Variant
from cudaload.bench.results import rows_of
from cudaload.bench.verdict import verdict


class _Loader:
    """Loads in the seconds a table gives each variant's calls (the warm-up first), like `harness._Loader`."""

    def __init__(self, seconds: dict[str, list[float]]) -> None:
        self.seconds, self.calls, self.parameters, self.torch = seconds, dict.fromkeys(seconds, 0), 0, torch

    def load(self, v: Variant) -> tuple[Any, float]:
        self.calls[v.name] += 1
        model = SimpleNamespace(
            dtype="torch.float32",
            config=SimpleNamespace(_attn_implementation="sdpa"),
            get_memory_footprint=lambda: 1000,
            parameters=lambda: [],
        )
        return model, self.seconds[v.name][self.calls[v.name] - 1]

    def release(self) -> None:
        pass


_BAR = SimpleNamespace(set_description=lambda text: None, update=lambda n: None)


def _load_verdict(work: BenchRun) -> tuple[dict[str, Any], list[Variant]]:
    """The load verdict of three variants timed by `harness._time_loads` on a machine three times slower from
    the third measured round on: float32/eager is 1.5x the plan's time in every round (decided after two),
    float32/sdpa within the tie margin overall but on both sides of it round by round (never decided)."""
    plan = Variant("bfloat16", "sdpa", {}, is_plan=True)
    slow, close = Variant("float32", "eager", {}), Variant("float32", "sdpa", {})
    drift = [1.0, 1.0, 1.0, 3.0, 3.0, 3.0]  # the warm-up, then 5 measured rounds
    loader = _Loader(
        {
            plan.name: drift,
            slow.name: [1.5 * s for s in drift],
            close.name: [s * r for s, r in zip(drift, [1.0, 1.2, 0.85, 0.95, 1.0, 1.05], strict=True)],
        }
    )
    harness._time_loads([plan, slow, close], work, loader, _BAR, lambda line: None)  # type: ignore[arg-type]
    for v in (plan, slow, close):  # prefill/decode alike in every variant: the load decides
        v.prefill_s, v.decode_tps, v.generate_s = [1.0, 1.0], [10.0, 10.0], [4.0, 4.0]
    rows = rows_of([plan, slow, close], plan, prompt_tokens=8, batch=1)
    return verdict({"workload": {"device": "cpu"}, "variants": [r.to_dict() for r in rows]}), [plan, slow, close]


def test_a_variant_stopped_once_decided_keeps_the_verdict_of_every_round_measured() -> None:
    stopped, (plan, slow, close) = _load_verdict(BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, budget_s=1e9))
    assert len(slow.load_s) == 2 and len(plan.load_s) == len(close.load_s) == 5  # slow stopped, the rest ran on
    full, _ = _load_verdict(BenchRun(prompt_tokens=8, new_tokens=4, repeats=5))  # fixed: every round of each
    # the plan's median (3.0, its last rounds on the slowed machine) against slow's two early rounds (1.5) would
    # name slow the faster; over the rounds both measured the plan is 1.5x faster, as in every round of the grid
    assert stopped == full
    assert stopped["load"] == {"plan": "best", "vs_bare": None}


def _rounds(name: str, load: list[float], **flags: Any) -> dict[str, Any]:
    """A bench result's row with per-round loads (ms) and the same prefill/decode rounds as every other."""
    runs = {"load_s": [ms / 1e3 for ms in load], "prefill_s": [0.3, 0.3], "decode_tps": [12.0, 12.0]}
    runs["generate_s"] = [1.0] * len(load)
    return {"name": name, "dtype": name.split("/")[0], "ok": True, "runs": runs, **flags}


def test_the_verdict_reads_the_middle_half_of_the_paired_rounds_not_the_ratio_of_two_medians() -> None:
    # One busy default bench's load rounds (2026-12-07-bench-default-cpu-budget.json, 4 CPU-bound neighbours):
    # the plan and bare load the same bytes; their medians (94 vs 70 ms) said "bare faster", the full grid a tie.
    plan = _rounds("bfloat16/sdpa", [97, 94, 70, 115, 59], is_plan=True)
    bare = _rounds("bare from_pretrained(path)", [61, 106, 70, 68, 102], dtype="checkpoint", is_bare=True)
    result = {"workload": {"device": "cpu"}, "variants": [plan, bare]}
    assert verdict(result)["load"] == {"plan": "best", "vs_bare": "tie"}
    assert verdict(result)["end_to_end"] == {"plan": "best", "vs_bare": "tie"}
    # bare faster in 4 rounds of 5 by 1.6-2x, one round the other way: the middle half says bare is faster
    bare["runs"]["load_s"] = [s / 1e3 for s in (50, 48, 120, 52, 30)]
    assert verdict(result)["load"] == {"plan": "bare from_pretrained(path)", "vs_bare": "slower"}


def test_the_verdict_calls_a_side_on_two_rounds_only_past_twice_the_tie_margin() -> None:
    # bfloat16/eager's loads 1.16-1.20x faster than the plan's: a side on three rounds, a tie on two (the noise of
    # two rounds of 60-80 ms loads made that verdict in one default bench, rounds.SIDE_ROUNDS)
    plan = _rounds("bfloat16/sdpa", [70, 72, 71], is_plan=True)
    eager = _rounds("bfloat16/eager", [60, 61, 60])
    result = {"workload": {"device": "cpu"}, "variants": [plan, eager]}
    assert verdict(result)["load"]["plan"] == "bfloat16/eager"
    plan["runs"]["load_s"], eager["runs"]["load_s"] = plan["runs"]["load_s"][:2], eager["runs"]["load_s"][:2]
    assert verdict(result)["load"]["plan"] == "best"
    eager["runs"]["load_s"] = [0.050, 0.051]  # 1.4x on both rounds: past twice the margin
    assert verdict(result)["load"]["plan"] == "bfloat16/eager"


class _Planned:
    """The model generate_bench drives, without a model: the reference continuation only."""

    new, weights, pad = 4, 10, 0

    def generate(self, ids: torch.Tensor, mask: object, settings: object, clock: object = None, new: int = 4) -> Any:
        sequences = torch.ones(ids.shape[0], ids.shape[1] + new, dtype=torch.long)
        return SimpleNamespace(sequences=sequences, past_key_values=None)


def _generation(work: BenchRun, seconds: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> list[GenerationVariant]:
    """Three generation variants through `_compare_rounds`, each round's numbers from a table: (generate()
    seconds, decode tokens/s) per round; `seconds`: what a round of each costs on a fake clock (time boxes)."""
    table = {
        "plan": [(1.0, 100.0)] * 8,
        "default generate()": [(1.6, 60.0)] * 8,  # the plan faster in every round: decided after two
        "static cache": [(1.3, 80.0), (0.8, 120.0)] * 4,  # on both sides of the margin: never decided
    }
    now = [0.0]

    def fake_round(torch: Any, planned: Any, v: GenerationVariant, r: int, *rest: Any) -> None:
        now[0] += seconds[v.name]
        if r >= work.warmup:
            generate_s, decode = table[v.name][len(v.generate_s)]
            v.generate_s.append(generate_s)
            v.decode_tps.append(decode)

    monkeypatch.setattr(generate_bench, "_time_round", fake_round)
    monkeypatch.setattr(meters, "time", SimpleNamespace(perf_counter=lambda: now[0]))  # budget and boxes
    variants = [
        GenerationVariant("plan", {}, "left", is_plan=True),
        GenerationVariant("default generate()", {}, "right", is_default=True),
        GenerationVariant("static cache", {"cache_implementation": "static"}, "left"),
    ]
    said: list[str] = []
    prompts = [torch.full((5,), 3), torch.full((3,), 3)]
    memory = SimpleNamespace(watch=lambda v: nullcontext())
    generate_bench._compare_rounds(torch, _Planned(), variants, prompts, work, memory, lambda: None, said.append)  # type: ignore[arg-type]
    return variants


def test_the_generation_comparison_stops_a_variant_once_decided_and_runs_every_round_when_fixed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cheap = {"plan": 0.0, "default generate()": 0.0, "static cache": 0.0}
    plan, default, static = _generation(BenchRun(8, 4, repeats=5, budget_s=1e9), cheap, monkeypatch)
    assert len(default.generate_s) == 2 and len(plan.generate_s) == len(static.generate_s) == 5
    assert default.stopped is not None and "decode the plan faster in every round (1.67-1.67x)" in default.stopped
    assert static.stopped is None
    # its ratios over default generate() pair the plan's first two rounds with default's two
    row = plan.to_dict(default, batch=2)
    assert row["speedup_over_default"] == {"generate": 1.6, "decode": 1.6667} and row["rounds"] == 5
    fixed = _generation(BenchRun(8, 4, repeats=5), cheap, monkeypatch)
    assert [len(v.generate_s) for v in fixed] == [5, 5, 5] and all(v.stopped is None for v in fixed)


def test_a_generation_variant_past_its_time_box_is_measured_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    # 400 s of budget: the comparison's quarter, 100 s, is 33 s for each of the three variants
    # (the phase's own budget counts the same seconds: 20 s rounds of static cache leave it room for more rounds)
    costly = {"plan": 1.0, "default generate()": 1.0, "static cache": 20.0}
    plan, default, static = _generation(BenchRun(8, 4, repeats=5, budget_s=400.0), costly, monkeypatch)
    assert len(static.generate_s) == 1 and static.stopped is not None and "time-boxed after 1" in static.stopped
    assert len(plan.generate_s) >= 2 and len(default.generate_s) == 2  # default: decided, as above


def test_on_busy_cores_the_generation_comparison_generates_half_the_tokens_unless_asked() -> None:
    tokens, why = busy_generation(32, "the cores are busy (...)", asked=False)
    assert tokens == 16 and why is not None and "16 new tokens, not 32" in why and "--new-tokens 32" in why
    assert busy_generation(32, None, asked=False) == (32, None)  # free cores: the run's own
    assert busy_generation(32, "busy", asked=True) == (32, None)  # --new-tokens was given: kept
    assert busy_generation(3, "busy", asked=False) == (2, busy_generation(3, "busy", asked=False)[1])
    assert busy_generation(2, "busy", asked=False) == (2, None)  # two is the fewest a decode rate needs


def test_the_shortened_comparison_is_recorded_and_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudaload.bench import inference
    from cudaload.bench.report import format_generation

    seen: dict[str, Any] = {}

    def fake_compare(path: object, the_plan: object, work: BenchRun, *args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(new_tokens=work.new_tokens, shortened=kwargs["shortened"])
        return {}

    monkeypatch.setattr(generate_bench, "compare_generation", fake_compare)
    phases = SimpleNamespace(
        bench_model=SimpleNamespace(path="x", vocab_size=10),
        the_plan=SimpleNamespace(generation=object()),
        interrupted=False,
        on_cuda=False,
    )
    work = BenchRun(prompt_tokens=8, new_tokens=32)
    why = "generation: 16 new tokens, not 32: the cores are busy"
    inference._run_extras(phases, work, generation=True, save=False, overhead=False, say=print, fewer=(16, why))  # type: ignore[arg-type]
    assert seen == {"new_tokens": 16, "shortened": why}
    plan = GenerationVariant("plan", {}, "left", is_plan=True, is_default=True, generate_s=[1.0], decode_tps=[9.0])
    static = GenerationVariant("static cache", {"cache_implementation": "static"}, "left", stopped="time-boxed")
    section = {
        "batch": 2,
        "prompt_lengths": [5, 3],
        "new_tokens": 16,
        "plan": {"generate_kwargs": {}, "padding_side": "left"},
        "kv_cache_bytes_planned": 2**20,
        "matches_unpadded": "...",
        "variants": [plan.to_dict(plan, 2), static.to_dict(plan, 2)],
        "shortened": why,
    }
    text = format_generation(section, width=200)
    assert why in text and "static cache: time-boxed" in text


def test_a_busy_default_bench_times_its_rounds_in_cpu_seconds_and_a_quiet_or_asked_one_in_wall_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from cudaload.bench import contention, inference
    from cudaload.bench.harness import workload_for
    from cudaload.bench.meters import CPU_CLOCK, WALL_CLOCK, round_clock

    said: list[str] = []
    monkeypatch.setattr(contention, "others_load", lambda cores: 0.0)
    monkeypatch.setattr(contention, "core_share", lambda: 0.3)
    work, why = inference._threads_for(workload_for(quick=False), False, 2, said.append)
    assert work.threads == 1 and work.cpu_clock and why is not None and "in CPU seconds" in why
    asked, _ = inference._threads_for(workload_for(quick=False, threads=2), False, 2, said.append)
    assert not asked.cpu_clock  # --threads 2: measured as asked, in wall seconds
    monkeypatch.setattr(contention, "core_share", lambda: 0.95)
    quiet, _ = inference._threads_for(workload_for(quick=False), False, 2, said.append)
    assert not quiet.cpu_clock and quiet.threads is None
    assert round_clock(True) == (time.process_time, CPU_CLOCK)
    assert round_clock(False) == (time.perf_counter, WALL_CLOCK)


def test_a_round_is_timed_on_the_loaders_clock(tiny_models: dict[str, Any]) -> None:
    from itertools import count

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_models["llama"]), dtype=torch.float32)
    ticks = count()
    loader = harness._Loader(torch, False, tiny_models["llama"], clock=lambda: float(next(ticks)))
    prompt = torch.randint(2, 50, (1, 6))
    finite, prefill_s, decode_tps, generate_s = harness._run(model, prompt, 4, loader, torch)
    # one tick from the prefill's start to its end; generate(): one per token's stamp, and its end
    assert finite and prefill_s == 1.0 and generate_s == 5.0 and decode_tps == 1.0
    seconds = loader.load(harness.Variant("float32", "sdpa", {"dtype": torch.float32}))[1]
    assert seconds == 1.0


def test_the_generation_comparison_times_on_the_cpu_clock_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from itertools import count

    from cudaload.bench import meters

    ticks = count()
    monkeypatch.setattr(meters, "time", SimpleNamespace(process_time=lambda: float(next(ticks)), perf_counter=None))

    class Planned(_Planned):
        def generate(self, ids: torch.Tensor, mask: object, settings: object, clock: Any = None, new: int = 4) -> Any:
            for _ in range(new):
                clock(None, None)
            return super().generate(ids, mask, settings, clock, new)

    v = GenerationVariant("plan", {}, "left", is_plan=True)
    prompts, reference = [torch.full((5,), 3)], [torch.ones(4, dtype=torch.long)]
    memory = SimpleNamespace(watch=lambda v: nullcontext())
    work = BenchRun(prompt_tokens=5, new_tokens=4, repeats=1, cpu_clock=True)
    generate_bench._time_round(torch, Planned(), v, 1, prompts, reference, work, memory, lambda: None)  # type: ignore[arg-type]
    assert v.generate_s == [5.0] and v.decode_tps == [1.0]  # start, 4 stamps, end: all on the CPU clock


def test_two_rounds_decide_a_side_only_past_twice_the_tie_margin_three_past_it() -> None:
    from cudaload.bench.rounds import decided

    # the same bytes loaded twice, 0.83-0.86x apart in two rounds: not yet decided
    assert decided([1.0, 1.0], [0.83, 0.86]) is None and decided([1.0, 1.0], [1.2, 1.25]) is None
    assert decided([1.0, 1.0, 1.0], [0.83, 0.86, 0.84]) == "the plan slower in every round (0.83-0.86x)"
    assert decided([1.0, 1.0], [1.35, 1.4]) == "the plan faster in every round (1.35-1.40x)"
    assert decided([1.0, 1.0], [1.02, 1.05]) == "a tie with the plan in every round (1.02-1.05x)"  # ties: as before


class _WaitingLoader(_Loader):
    """`_Loader`, each load costing a second of CPU and `slower` times that of wall on the clocks patched into
    `meters` (the bench's round clocks)."""

    def __init__(self, seconds: dict[str, list[float]], clocks: dict[str, float], slower: float) -> None:
        super().__init__(seconds)
        self.clocks, self.slower = clocks, slower

    def load(self, v: Variant) -> tuple[Any, float]:
        self.clocks["cpu"] += 1.0
        self.clocks["wall"] += self.slower
        return super().load(v)


def test_on_busy_cores_the_load_phase_counts_cpu_seconds_within_a_wall_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    clocks = {"cpu": 0.0, "wall": 0.0}
    monkeypatch.setattr(
        meters, "time", SimpleNamespace(process_time=lambda: clocks["cpu"], perf_counter=lambda: clocks["wall"])
    )
    # two variants on both sides of the tie margin round after round: never decided, never settled
    close = [1.0, 1.3, 0.8, 1.3, 0.8, 1.3]

    def loads(slower: float) -> tuple[list[Variant], list[str]]:
        plan, other = Variant("bfloat16", "sdpa", {}, is_plan=True), Variant("bfloat16", "eager", {})
        loader = _WaitingLoader({plan.name: [1.0] * 6, other.name: close}, clocks, slower)
        # 2 s of CPU a round against the load phase's 15 s: 1 warm-up and 5 measured rounds would take 12 s
        work = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, budget_s=60.0, cpu_clock=True)
        said: list[str] = []
        harness._time_loads([plan, other], work, loader, _BAR, said.append)  # type: ignore[arg-type]
        return [plan, other], said

    # 6x the CPU seconds in wall (a sixth of a core): 12 s of wall a round, past the 15 s share after the
    # warm-up on a wall budget; on CPU seconds every round the budget allows
    (plan, other), said = loads(6.0)
    assert len(plan.load_s) == len(other.load_s) == 5 and not any("wall seconds" in line for line in said)
    # 50x (a process starved of the cores): the first measured round, then the wall bound, said
    (plan, other), said = loads(50.0)
    assert len(plan.load_s) == len(other.load_s) == 1
    assert [line for line in said if "wall seconds" in line] == [
        "load: stopped after 1 measured rounds: the next would end past 6x the phase's share in wall seconds "
        "(90 s; 200 s so far for 4.0 s of CPU)"
    ]
