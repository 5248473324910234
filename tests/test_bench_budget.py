"""`cudaload bench` within its time on a busy machine (issue 50): the variants no plan on this machine can
choose are left out and said so, each variant has a time box, and the spread names the variant whose own rounds
it compares."""

from __future__ import annotations

from pathlib import Path

import cudaload
from cudaload.bench.harness import BenchRun, VariantBox
from cudaload.bench.inference import never_planned, variants_for
from cudaload.bench.rounds import RoundBudget


def test_fp16_is_left_out_on_a_cpu_and_kept_on_a_gpu_or_when_asked(tiny_models: dict[str, Path]) -> None:
    plan = cudaload.plan(str(tiny_models["llama"]), machine=cudaload.Machine.simulated(), probe=False)
    variants, skipped = variants_for(plan, on_cuda=False, all_variants=False)
    names = [v.name for v in variants]
    assert not any(name.startswith("float16/") for name in names) and names[-1] == "bare from_pretrained(path)"
    assert {s["variant"] for s in skipped} == {"float16/sdpa", "float16/eager"}
    assert all(s["why"] == never_planned("float16", on_cuda=False) for s in skipped)
    every, none_skipped = variants_for(plan, on_cuda=False, all_variants=True)
    assert none_skipped == [] and {"float16/sdpa", "float16/eager"} <= {v.name for v in every}
    on_gpu, kept = variants_for(plan, on_cuda=True, all_variants=False)
    assert kept == [] and len(on_gpu) == len(every)
    assert never_planned("bfloat16", on_cuda=False) is None and never_planned("float16", on_cuda=True) is None


def test_a_variant_past_its_time_box_is_measured_no_further() -> None:
    work = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, budget_s=100.0)
    box = VariantBox(RoundBudget(work, share=0.5), variants=5)  # 100 s x 0.5 / 5 = 10 s each
    box.add(0, 4.0)
    box.add(1, 30.0)
    assert box.over(1, 1) is None  # after the warm-up only: every variant gets a measured round
    assert box.over(0, 2) is None
    why = box.over(1, 2)
    assert why is not None and "time-boxed after 1 measured rounds" in why and "its share 10 s" in why
    fixed = VariantBox(RoundBudget(BenchRun(prompt_tokens=8, new_tokens=4, repeats=3), share=0.5), variants=5)
    fixed.add(1, 1e6)
    assert fixed.over(1, 3) is None  # a fixed --repeats N measures N rounds of every variant


def _row(name: str, spread: dict[str, float | None], **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "ok": True,
        "spread": spread,
        "is_plan": name == "bfloat16/sdpa",
        "is_baseline": name == "bfloat16/sdpa",
        "time_boxed": {},
        **extra,
    }


def test_the_report_says_what_was_skipped_boxed_and_whose_rounds_spread() -> None:
    from cudaload.bench import report

    variants = [
        _row("bfloat16/sdpa", {"load": 1.1, "prefill": 1.05, "decode": 1.02}),
        _row(
            "float32/eager",
            {"load": 1.3, "prefill": 1.2, "decode": 1.5},
            time_boxed={"run": "time-boxed after 1 measured rounds (31 s, its share 12 s)"},
        ),
    ]
    result = {
        "variants": variants,
        "skipped": [{"variant": "float16/sdpa", "why": "fp16 is never planned on a CPU"}],
        "workload": {"measured_rounds": 3},
        "mode": "full",
        "baseline": "bfloat16/sdpa",
        "best": {},
        "plan": {"variant": "bfloat16/sdpa"},
    }
    lines = report._reading_notes(result)
    assert "skipped float16/sdpa: fp16 is never planned on a CPU" in lines
    assert "float32/eager: prefill/decode time-boxed after 1 measured rounds (31 s, its share 12 s)" in lines
    spread = next(line for line in lines if line.startswith("run-to-run spread"))
    assert "load 1.30x (float32/eager)" in spread and "of each variant's own measured rounds" in spread


# Issue 50, item 3 (the default bench within 90 s quiet and 180 s with 4 CPU-bound neighbours): a variant stops
# once its rounds have decided how it compares with the plan, and a machine whose cores are taken is measured
# on one torch thread.


class _FakeModel:
    """What `harness` reads of a loaded model, without torch."""

    dtype = "torch.float32"
    config = type("Config", (), {"_attn_implementation": "sdpa", "pad_token_id": 0})()

    def get_memory_footprint(self) -> int:
        return 1000

    def parameters(self) -> list[object]:
        return []


class _FakeLoader:
    """Loads in the seconds a table gives each variant's round (no clock read), like `harness._Loader`."""

    def __init__(self, seconds: dict[str, list[float]]) -> None:
        self.seconds, self.calls, self.parameters = seconds, {k: 0 for k in seconds}, 0
        import torch

        self.torch = torch

    def load(self, v: object) -> tuple[_FakeModel, float]:
        name = v.name  # type: ignore[attr-defined]
        self.calls[name] += 1
        rounds = self.seconds[name]
        return _FakeModel(), rounds[min(self.calls[name], len(rounds)) - 1]

    def release(self) -> None:
        pass

    def sync(self) -> None:
        pass


class _Bar:
    def set_description(self, text: str) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def _variants() -> list[object]:
    from cudaload.bench.harness import Variant

    return [
        Variant("bfloat16", "sdpa", {}, is_plan=True),
        Variant("float32", "eager", {}),  # three times the plan's time in every round: decided
        Variant("float32", "sdpa", {}),  # on both sides of the tie margin round after round: undecided
    ]


def test_a_variant_whose_rounds_decided_it_against_the_plan_is_loaded_no_further() -> None:
    from cudaload.bench import harness

    plan, slow, close = _variants()
    # the warm-up round first, then the measured ones
    loader = _FakeLoader(
        {
            plan.name: [1.0] * 8,  # type: ignore[attr-defined]
            slow.name: [3.0] * 8,  # type: ignore[attr-defined]
            close.name: [1.0, 1.3, 0.8, 1.3, 0.8, 1.3, 0.8, 1.3],  # type: ignore[attr-defined]
        }
    )
    work = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, budget_s=1e9)
    said: list[str] = []
    harness._time_loads([plan, slow, close], work, loader, _Bar(), said.append)  # type: ignore[arg-type]
    assert len(slow.load_s) == 2 and len(close.load_s) == len(plan.load_s) == 5  # type: ignore[attr-defined]
    assert "more cannot change the verdict" in slow.boxed["load"] and "3.00-3.00x" in slow.boxed["load"]  # type: ignore[attr-defined]
    assert "load" not in close.boxed  # type: ignore[attr-defined]
    assert any(line.startswith("float32/eager: load stopped after 2 measured rounds") for line in said)
    fixed = _variants()
    loader = _FakeLoader({v.name: [1.0 if v.is_plan else 3.0] * 8 for v in fixed})  # type: ignore[attr-defined]
    harness._time_loads(fixed, BenchRun(prompt_tokens=8, new_tokens=4, repeats=4), loader, _Bar(), said.append)  # type: ignore[arg-type]
    assert [len(v.load_s) for v in fixed] == [4, 4, 4]  # type: ignore[attr-defined]  # --repeats 4: every round


def test_the_run_phase_ends_once_every_variant_but_the_plan_is_decided(monkeypatch: object) -> None:
    from contextlib import nullcontext

    from cudaload.bench import harness

    plan, slow, close = _variants()
    # (prefill seconds, decode tokens/s) per call: close is a tie in prefill and decode, settled within 10%
    table = {plan.name: (1.0, 100.0), slow.name: (3.0, 30.0), close.name: (1.02, 98.0)}  # type: ignore[attr-defined]
    runs: dict[str, int] = {}

    def fake_run(model: object, prompt: object, new_tokens: int, sync: object, torch: object) -> tuple:
        name = model.name  # type: ignore[attr-defined]
        runs[name] = runs.get(name, 0) + 1
        prefill, decode = table[name]
        return True, prefill, decode, prefill + 4 / decode

    monkeypatch.setattr(harness, "_run", fake_run)  # type: ignore[attr-defined]
    for v in (plan, slow, close):
        v.model = v  # type: ignore[attr-defined]
    memory = type("Memory", (), {"watch": lambda self, v: nullcontext()})()
    work = BenchRun(prompt_tokens=8, new_tokens=4, repeats=5, budget_s=1e9)
    said: list[str] = []
    harness._time_runs([plan, slow, close], work, 100, _FakeLoader({}), memory, _Bar(), said.append)  # type: ignore[arg-type]
    assert runs == {plan.name: 3, slow.name: 3, close.name: 3}  # type: ignore[attr-defined]  # warm-up + 2, not 1 + 5
    assert "a tie with the plan in every round" in close.boxed["run"]  # type: ignore[attr-defined]
    assert "prefill the plan faster in every round (3.00-3.00x)" in slow.boxed["run"]  # type: ignore[attr-defined]


def test_decided_needs_two_rounds_on_one_side_of_the_tie_margin_or_a_settled_tie() -> None:
    from cudaload.bench.rounds import decided

    assert decided([1.0], [3.0]) is None  # one round decides nothing
    assert decided([1.0, 1.0], [3.0, 2.0]) == "the plan faster in every round (2.00-3.00x)"
    assert decided([1.0, 1.0], [0.5, 0.6]) == "the plan slower in every round (0.50-0.60x)"
    assert decided([100.0, 100.0], [50.0, 40.0], rate=True) == "the plan faster in every round (2.00-2.50x)"
    assert decided([1.0, 1.0], [1.0, 1.05]) == "a tie with the plan in every round (1.00-1.05x)"
    assert decided([1.0, 1.0], [0.9, 1.1]) is None  # within the margin but not settled (22% apart)
    assert decided([1.0, 1.0], [1.0, 1.5]) is None  # one round a tie, one slower
    assert decided([1.0, 1.0, 1.0], [3.0, 3.0]) is not None  # a variant stopped earlier pairs with the first rounds


def test_the_speed_up_per_round_pairs_a_variant_stopped_early_with_the_plans_first_rounds() -> None:
    from cudaload.bench.harness import Variant
    from cudaload.bench.results import rows_of

    plan = Variant("bfloat16", "sdpa", {}, is_plan=True, load_s=[1.0, 2.0, 1.0], prefill_s=[1.0, 2.0, 1.0])
    plan.decode_tps, plan.generate_s = [100.0, 50.0, 100.0], [1.0, 1.0, 1.0]
    slow = Variant("float32", "eager", {}, load_s=[3.0, 6.0], prefill_s=[2.0, 4.0], decode_tps=[50.0, 25.0])
    slow.generate_s = [2.0, 2.0]
    rows = {r.name: r for r in rows_of([plan, slow], plan, prompt_tokens=8, batch=1)}
    assert rows["float32/eager"].plan_speedup_paired == {"load": 3.0, "prefill": 2.0, "decode": 2.0}


def test_core_share_is_cpu_over_wall_of_the_better_of_two_looks() -> None:
    from cudaload.bench.contention import core_share

    ticks = {"wall": 0.0, "cpu": 0.0, "looks": 0}

    def clock() -> float:  # every read moves the wall 0.05 s; this thread computes 40% of it, then 30%
        ticks["wall"] += 0.05
        ticks["cpu"] += 0.05 * (0.4 if ticks["looks"] < 5 else 0.3)
        ticks["looks"] += 1
        return ticks["wall"]

    share = core_share(0.2, clock=clock, cpu=lambda: ticks["cpu"])
    assert 0.3 < share <= 0.45


def test_a_default_bench_on_busy_cores_measures_on_one_thread_and_keeps_what_was_asked(monkeypatch: object) -> None:
    from cudaload.bench import contention, inference
    from cudaload.bench.contention import bench_threads
    from cudaload.bench.harness import workload_for

    threads, why = bench_threads(None, 2, 0.35)
    assert threads == 1 and why is not None and "35% of a core" in why and "--threads 2" in why
    assert bench_threads(None, 2, 0.95) == (None, None)  # free cores: torch's default
    assert bench_threads(3, 2, 0.1) == (3, None)  # --threads 3 is kept, busy or not
    assert bench_threads(None, 1, 0.1) == (None, None)  # one thread already
    # one look found a core free, but the last minute had 1.5 other runnable processes per core: busy
    threads, why = bench_threads(None, 2, 0.9, others=1.5)
    assert threads == 1 and why is not None and "1.5 per core busy over the last minute" in why
    assert bench_threads(None, 2, 0.9, others=0.2) == (None, None)
    assert contention.others_load(2, loadavg=lambda: (4.0, 3.0, 2.0)) == 1.5  # (4 - this process) / 2 cores
    monkeypatch.setattr(contention, "core_share", lambda: 0.3)  # type: ignore[attr-defined]
    said: list[str] = []
    work, why = inference._threads_for(workload_for(quick=False), False, 2, said.append)
    assert work.threads == 1 and said == [why]
    asked, none = inference._threads_for(workload_for(quick=False, threads=2), False, 2, said.append)
    assert asked.threads == 2 and none is None and len(said) == 1


def test_the_verdict_names_the_plans_place_per_metric_among_the_variants_a_plan_can_choose() -> None:
    from cudaload.bench.verdict import verdict

    def row(name: str, load: float, prefill: float, decode: float, e2e: float, **flags: object) -> dict[str, object]:
        dtype = name.split("/")[0] if "/" in name else "checkpoint"
        times = {"load_s": load, "prefill_s": prefill, "decode_tokens_per_s": decode, "end_to_end_s": e2e}
        return {"name": name, "dtype": dtype, "ok": True, **times, **flags}

    result = {
        "workload": {"device": "cpu"},
        "variants": [
            row("bfloat16/sdpa", 1.1, 1.0, 50.0, 3.0, is_plan=True),
            row("bfloat16/eager", 1.0, 1.4, 52.0, 3.1),  # load 10% faster: a tie
            row("float32/sdpa", 2.0, 0.5, 49.0, 2.0),  # prefill and end to end: beats the plan
            row("float16/sdpa", 1.0, 1.0, 150.0, 1.0),  # fastest, but never planned on a CPU
            row("bare from_pretrained(path)", 0.5, 1.0, 50.0, 2.9, is_bare=True),
        ],
    }
    assert verdict(result) == {
        "load": {"plan": "bare from_pretrained(path)", "vs_bare": "slower"},
        "prefill": {"plan": "float32/sdpa", "vs_bare": "tie"},
        "decode": {"plan": "best", "vs_bare": "tie"},
        "end_to_end": {"plan": "float32/sdpa", "vs_bare": "tie"},
    }
    result["workload"] = {"device": "cuda"}  # on a GPU fp16 can be planned: it counts
    assert verdict(result)["decode"]["plan"] == "float16/sdpa"


def test_bare_that_loads_as_the_plan_runs_the_plans_rounds_instead_of_its_own() -> None:
    from cudaload.bench.harness import Variant
    from cudaload.bench.verdict import share_plan_rounds

    def variants(plan_kwargs: dict[str, object], bare_applied: str) -> list[Variant]:
        plan = Variant("bfloat16", "sdpa", plan_kwargs, is_plan=True, applied="bfloat16/sdpa", device="cpu")
        bare = Variant("checkpoint", "default", {}, is_bare=True, applied=bare_applied, device="cpu")
        return [plan, Variant("float32", "sdpa", {}, applied="float32/sdpa", device="cpu"), bare]

    planned = {"dtype": "bfloat16", "attn_implementation": "sdpa", "device_map": "cpu"}
    plan, fp32, bare = variants(planned, "bfloat16/sdpa")
    lines = share_plan_rounds([plan, fp32, bare], before=True)
    assert lines == [f"bare from_pretrained(path): prefill/decode {bare.boxed['run']}"] and "run" not in fp32.boxed
    assert "loads as the plan (bfloat16/sdpa on cpu)" in bare.boxed["run"]
    plan.prefill_s, plan.decode_tps, plan.generate_s, plan.peak_bytes = [1.0, 1.1], [50.0, 48.0], [2.0, 2.1], 7
    share_plan_rounds([plan, fp32, bare], before=False)
    assert (bare.prefill_s, bare.decode_tps, bare.generate_s) == ([1.0, 1.1], [50.0, 48.0], [2.0, 2.1])
    assert bare.peak_bytes == 7
    # another dtype read back, or a plan that sets what else runs differently (kernels): bare is measured itself
    apart = (({"dtype": "bfloat16"}, "float32/sdpa"), ({"dtype": "bfloat16", "use_kernels": True}, "bfloat16/sdpa"))
    for kwargs, applied in apart:
        plan, fp32, bare = variants(kwargs, applied)
        assert share_plan_rounds([plan, fp32, bare], before=True) == [] and bare.boxed == {}


def test_the_generation_warm_up_generates_a_few_tokens_and_the_first_measured_round_checks_the_output() -> None:
    from contextlib import nullcontext
    from types import SimpleNamespace

    import torch

    from cudaload.bench.generate_bench import GenerationVariant, _time_round

    class Planned:
        new, weights, pad = 8, 10, 0

        def __init__(self) -> None:
            self.calls: list[int] = []

        def generate(self, ids: torch.Tensor, mask: object, settings: object, clock: object, new: int = 8) -> object:
            self.calls.append(new)
            for _ in range(new):
                clock(None, None)  # type: ignore[operator]
            continuation = torch.ones(ids.shape[0], new, dtype=torch.long)
            return SimpleNamespace(sequences=torch.cat([ids, continuation], dim=1), past_key_values=None)

    planned, v = Planned(), GenerationVariant("plan", {}, "left", is_plan=True)
    prompts = [torch.full((5,), 3), torch.full((3,), 3)]
    reference = [torch.ones(8, dtype=torch.long)] * 2
    memory = SimpleNamespace(watch=lambda v: nullcontext())
    work = BenchRun(prompt_tokens=5, new_tokens=8, repeats=2, budget_s=1e9)
    for r in range(3):
        _time_round(torch, planned, v, r, prompts, reference, work, memory, lambda: None)  # type: ignore[arg-type]
    assert planned.calls == [work.warmup_new_tokens, 8, 8]  # the warm-up: 4 tokens, not the 8 measured
    assert v.matches_unpadded == 2 and len(v.decode_tps) == 2
