"""The side-by-side benchmark runs end to end (quick mode) and reports a well-formed result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudaload.bench import format_report, run_bench


@pytest.mark.slow
def test_quick_bench_reports_the_plan_and_every_alternative(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "r.json"
    result = run_bench(quick=True, out=str(out), model_dir=tmp_path, save=True)

    variants = result["variants"]
    plans = [v for v in variants if v["is_plan"]]
    assert len(plans) == 1
    plan = plans[0]
    assert plan["name"] == result["plan"]["variant"] == result["baseline"]
    assert (plan["dtype"], plan["attn_implementation"]) == (
        result["plan"]["kwargs"]["dtype"],
        result["plan"]["kwargs"]["attn_implementation"],
    )
    # The plan's row is the variant the plan chose: its dtype decision and its first attention.
    decided = {d["setting"]: d["value"] for d in result["plan"]["decisions"]}
    assert plan["name"] == f"{decided['dtype']}/{result['plan']['attention_chain'][0]}"
    assert plan["is_baseline"] and [v["name"] for v in variants if v["is_baseline"]] == [plan["name"]]

    # The plan's row is the one loaded with exactly the plan's from_pretrained kwargs; every other
    # dtype x attention row changes those two settings only (bare from_pretrained passes none).
    assert plan["kwargs"] == result["plan"]["kwargs"]
    for v in variants:
        if not v["is_bare"]:
            assert v["kwargs"] == {
                **result["plan"]["kwargs"],
                "dtype": v["dtype"],
                "attn_implementation": v["attn_implementation"],
            }, v["name"]

    # Every row's numbers are the medians of its measured rounds (one round each in quick mode).
    work = result["workload"]
    assert (work["prompt_tokens"], work["new_tokens"], work["measured_rounds"]) == (64, 16, 1)
    for v in variants:
        assert v["ok"], v["error"]
        runs = v["runs"]
        assert [len(runs["load_s"]), len(runs["prefill_s"]), len(runs["decode_tps"])] == [1, 1, 1], v["name"]
        assert (v["load_s"], v["prefill_s"], v["decode_tokens_per_s"]) == (
            runs["load_s"][0],
            runs["prefill_s"][0],
            runs["decode_tps"][0],
        )
        assert v["load_s"] > 0 and v["prefill_s"] > 0 and v["decode_tokens_per_s"] > 0 and v["generate_s"] > 0

    # The ratios' arithmetic is checked on a hand-made record (test_rows_of_a_hand_made_record); here,
    # that every row is compared with the plan's row: a ratio above 1 only where the row costs more
    # than the plan's, below 1 only where it costs less (so the plan's own row can only read 1).
    others = [v for v in variants if not v["is_plan"]]
    assert len(others) == 4  # three more dtype x attention rows (fp16 is skipped on a CPU) and bare from_pretrained
    costs = {
        "load": lambda v: v["load_s"],
        "prefill": lambda v: v["prefill_s"],
        "decode": lambda v: 1 / v["decode_tokens_per_s"],
        "end_to_end": lambda v: v["end_to_end_s"],
    }
    first_round = {
        "load": lambda v: v["runs"]["load_s"][0],
        "prefill": lambda v: v["runs"]["prefill_s"][0],
        "decode": lambda v: 1 / v["runs"]["decode_tps"][0],
    }
    for v in variants:
        assert set(v["plan_speedup"]) == set(costs) and set(v["plan_speedup_paired"]) == set(first_round)
        for ratios, metric_cost in ((v["plan_speedup"], costs), (v["plan_speedup_paired"], first_round)):
            for metric, of in metric_cost.items():
                value = ratios[metric]
                assert value is not None and value > 0, (v["name"], metric)
                if value > 1:
                    assert of(v) > of(plan), (v["name"], metric, value)
                if value < 1:
                    assert of(v) < of(plan), (v["name"], metric, value)

    # Every dtype x attention alternative a plan here can choose was measured, each once, with the plan's
    # device_map; fp16, which no plan picks on a CPU, is left out and the result says why.
    names = [v["name"] for v in variants]
    assert len(names) == len(set(names))
    for dtype in ("float32", "bfloat16"):
        for attn in ("sdpa", "eager"):
            assert f"{dtype}/{attn}" in names
    assert [s["variant"] for s in result["skipped"]] == ["float16/sdpa", "float16/eager"]
    assert all("never planned on a CPU" in s["why"] for s in result["skipped"])
    # The plan was measured here, as load() would plan it, for this run's token counts.
    planned = next(d for d in result["plan"]["decisions"] if d["setting"] == "dtype")
    assert "probed on this CPU" in planned["reason"] and "a 64-token prompt + 16 new tokens" in planned["reason"]
    (bare,) = [v for v in variants if v["is_bare"]]
    assert bare["kwargs"] == {} and bare["applied"] == "bfloat16/sdpa"  # the checkpoint's dtype, transformers' default
    assert all(v["finite_logits"] is True for v in variants)

    # The summary: per metric, the row named best has the lowest cost of all the rows (decode: the
    # highest tokens/s); the plan costs at least as much as the best (exactly as much when it is the
    # best), and its ratio to bare is above 1 only where it costs more than bare (below: less).
    cost = {
        "load": lambda v: v["load_s"],
        "prefill": lambda v: v["prefill_s"],
        "decode": lambda v: 1 / v["decode_tokens_per_s"],
        "end_to_end": lambda v: v["end_to_end_s"],
        "memory": lambda v: v["peak_memory_bytes"],
    }
    assert set(result["summary"]) == set(cost)
    assert result["best"] == {metric: row["best"] for metric, row in result["summary"].items()}
    by_name = {v["name"]: v for v in variants}
    for metric, row in result["summary"].items():
        of = cost[metric]
        best = by_name[row["best"]]
        assert of(best) == min(of(v) for v in variants), metric
        if metric == "decode":
            assert best["decode_tokens_per_s"] == max(v["decode_tokens_per_s"] for v in variants)
        assert row["plan_over_best"] >= 1.0, metric
        if of(plan) == of(best):
            assert row["plan_over_best"] == 1.0, metric
        over_bare = row["plan_over_bare"]
        assert over_bare is not None and over_bare > 0, metric
        if over_bare > 1:
            assert of(plan) > of(bare), metric
        if over_bare < 1:
            assert of(plan) < of(bare), metric

    import os
    import platform

    import torch
    import transformers

    saved = json.loads(out.read_text())
    assert saved["variants"] == variants
    cpu = saved["machine"]["cpu"]
    assert cpu["model"] and cpu["cores"] == len(os.sched_getaffinity(0)) and cpu["arch"] == platform.machine()
    assert len(saved["machine"]["gpus"]) == torch.cuda.device_count()
    assert saved["versions"]["python"] == platform.python_version()
    assert saved["versions"]["torch"] == torch.__version__
    assert saved["versions"]["transformers"] == transformers.__version__
    assert saved["date"].endswith("+00:00")
    assert saved["plan"]["kwargs"]["dtype"] == plan["dtype"]

    report = format_report(result)
    assert f"* {plan['name']} (plan)" in report
    assert "x bare" in report and "tuning record saved" in report
    # The verdict is recorded as the saved JSON reads again; a quick run (a tiny model) does not print it.
    from cudaload.bench.verdict import verdict

    assert saved["verdict"] == verdict(saved) and set(saved["verdict"]) == {"load", "prefill", "decode", "end_to_end"}
    assert "verdict (" not in report
    said = next(line for line in format_report({**result, "mode": "full"}, 1000).splitlines() if "verdict (" in line)
    place = saved["verdict"]["load"]["plan"]
    assert ("load: the plan is best" if place == "best" else f"load: {place} beats the plan") in said

    # --save: a later plan of the same model on this machine uses the measured grid. The quick run
    # used 1 thread; with another thread count the record is stale and the plan says so.
    import cudaload

    model_dir = str(tmp_path / "qwen3-quick")
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        tuned = cudaload.plan(model_dir, workload=(64, 16)).decision("dtype")
        torch.set_num_threads(2 if previous == 1 else previous)
        stale = cudaload.plan(model_dir).decision("dtype")
    finally:
        torch.set_num_threads(previous)
    assert "cudaload bench --save" in tuned.reason and result["tuning_record"] in tuned.reason
    # How the policy weighs a record's numbers is checked on hand-made records
    # (test_a_saved_record_decides_by_the_workload). Here: fp16 is never chosen on CPU, and a dtype
    # whose sdpa row was faster at load, at prefill and at decode cannot lose to the other.
    row = {v["dtype"]: v for v in variants if v["attn_implementation"] == "sdpa" and not v["is_bare"]}
    assert tuned.value in ("float32", "bfloat16")
    for winner, loser in (("float32", "bfloat16"), ("bfloat16", "float32")):
        w, lo = row[winner], row[loser]
        faster = w["load_s"] < lo["load_s"] and w["prefill_s"] < lo["prefill_s"]
        if faster and w["decode_tokens_per_s"] > lo["decode_tokens_per_s"]:
            assert tuned.value == winner, (tuned.reason, w, lo)
    assert "stale: threads '1' there" in stale.reason


def _hand_made_record():
    """Five variants measured in three rounds, with numbers picked so every ratio is easy by hand."""
    from cudaload.bench.harness import Variant

    def row(dtype, attn, load, prefill, decode, generate, peak, **kw):
        return Variant(
            dtype,
            attn,
            {},
            load_s=load,
            prefill_s=prefill,
            decode_tps=decode,
            generate_s=generate,
            peak_bytes=peak,
            **kw,
        )

    return [
        # medians: load 3.0, prefill 0.5, decode 90 tok/s, generate 1.1 -> end to end 4.1 s
        row("bfloat16", "sdpa", [2.0, 4.0, 3.0], [0.5, 0.4, 0.6], [100, 80, 90], [1.0, 1.2, 1.1], 1000, is_plan=True),
        # medians: load 4.0, prefill 0.9, decode 50, generate 2.0 -> 6.0 s; per round (over the plan's
        # round): load 2.0, 1.0, 2.0; prefill 2.0, 1.0, 1.5; decode 100/50, 80/80, 90/45 = 2.0, 1.0, 2.0
        row("float32", "sdpa", [4.0, 4.0, 6.0], [1.0, 0.4, 0.9], [50, 80, 45], [2.0, 2.1, 1.9], 2000),
        # every number half the plan's time (twice its rate): load 1.5, prefill 0.25, decode 180, 2.05 s
        row("bfloat16", "eager", [1.0, 2.0, 1.5], [0.25, 0.2, 0.3], [200, 160, 180], [0.5, 0.6, 0.55], 1000),
        row("float16", "sdpa", [], [], [], [], None, error="RuntimeError: boom"),
        # twice the plan's times, half its rate: load 6.0, prefill 1.0, decode 45, 8.2 s; least memory
        row("checkpoint", "default", [6.0] * 3, [1.0] * 3, [45] * 3, [2.2] * 3, 800, is_bare=True),
    ]


def test_rows_of_a_hand_made_record() -> None:
    from cudaload.bench.results import baseline_of, rows_of, summarise

    variants = _hand_made_record()
    baseline = baseline_of(variants, ("sdpa", "eager"), "bfloat16")
    assert baseline is variants[0]
    rows = {r.name: r for r in rows_of(variants, baseline, prompt_tokens=64, batch=2)}
    plan, fp32, eager, fp16, bare = (rows[n] for n in [v.name for v in variants])
    assert [r.is_baseline for r in rows.values()] == [True, False, False, False, False]

    assert (plan.load_s, plan.prefill_s, plan.decode_tokens_per_s, plan.end_to_end_s) == (3.0, 0.5, 90, 4.1)
    assert plan.prefill_tokens_per_s == 256.0  # 2 prompts x 64 tokens in 0.5 s
    assert fp32.prefill_tokens_per_s == pytest.approx(142.2222, abs=1e-4)  # 128 tokens / 0.9 s
    assert (fp32.end_to_end_s, bare.end_to_end_s) == (6.0, 8.2)
    assert fp32.spread == {"load": 1.5, "prefill": 2.5, "decode": 1.778}  # 6/4, 1.0/0.4, 80/45
    # Of the medians: 4.0/3.0, 0.9/0.5, 90/50, 6.0/4.1; paired: the median of the per-round ratios.
    assert fp32.plan_speedup == {"load": 1.3333, "prefill": 1.8, "decode": 1.8, "end_to_end": 1.4634}
    assert fp32.plan_speedup_paired == {"load": 2.0, "prefill": 1.5, "decode": 2.0}
    assert eager.plan_speedup == {"load": 0.5, "prefill": 0.5, "decode": 0.5, "end_to_end": 0.5}
    assert eager.plan_speedup_paired == {"load": 0.5, "prefill": 0.5, "decode": 0.5}
    assert bare.plan_speedup == {"load": 2.0, "prefill": 2.0, "decode": 2.0, "end_to_end": 2.0}
    assert not fp16.ok and fp16.error == "RuntimeError: boom"
    assert set(fp16.plan_speedup.values()) == set(fp16.plan_speedup_paired.values()) == {None}

    best, summary = summarise(list(rows.values()))
    assert best == {
        "load": "bfloat16/eager",
        "prefill": "bfloat16/eager",
        "decode": "bfloat16/eager",
        "end_to_end": "bfloat16/eager",
        "memory": "bare from_pretrained(path)",
    }
    # The plan's cost over the best's and over bare's: twice eager's times, half bare's; memory
    # 1000 over 800 bytes against both.
    for metric in ("load", "prefill", "decode", "end_to_end"):
        assert summary[metric] == {"best": "bfloat16/eager", "plan_over_best": 2.0, "plan_over_bare": 0.5}, metric
    assert summary["memory"] == {"best": "bare from_pretrained(path)", "plan_over_best": 1.25, "plan_over_bare": 1.25}


def test_the_baseline_is_what_load_would_fall_back_to_when_the_plans_variant_failed() -> None:
    from dataclasses import replace

    from cudaload.bench.results import baseline_of, rows_of

    variants = _hand_made_record()
    variants[0] = replace(variants[0], error="RuntimeError: sdpa failed")
    baseline = baseline_of(variants, ("sdpa", "eager"), "bfloat16")
    assert baseline is variants[2]  # bfloat16/eager: the next link of the chain, in the plan's dtype
    assert baseline_of(variants, ("sdpa", "eager"), "float16") is None  # float16/sdpa failed, no eager row
    fp32 = rows_of(variants, baseline, prompt_tokens=64, batch=1)[1]
    # Over eager's medians: load 4.0/1.5, prefill 0.9/0.25, decode 180/50, end to end 6.0/2.05.
    assert fp32.plan_speedup == {"load": 2.6667, "prefill": 3.6, "decode": 3.6, "end_to_end": 2.9268}


def test_a_saved_record_decides_by_the_workload() -> None:
    # A bench record where bf16 loads and prefills faster but decodes slower than fp32: the dtype
    # chosen from it follows the workload. Estimates (record measured at 64 prompt tokens):
    #   (64, 16): fp32 0.30 + 0.10 + 15/50 = 0.70 s, bf16 0.10 + 0.05 + 15/20 = 0.90 s -> float32
    #   (64, 2):  fp32 0.30 + 0.10 + 1/50 = 0.42 s,  bf16 0.10 + 0.05 + 1/20 = 0.20 s  -> bfloat16
    #   (512, 16): prefill x8: fp32 0.30 + 0.80 + 0.30 = 1.40 s, bf16 0.10 + 0.40 + 0.75 = 1.25 s -> bfloat16
    from dataclasses import replace

    from cudaload import Machine, TuningRecord, Workload
    from cudaload.facts.machine import TunedVariant
    from cudaload.facts.model import any_model
    from cudaload.policy import Request, decide_plan

    model = replace(any_model(), checkpoint_dtype="bfloat16")
    machine = Machine.simulated()
    record = TuningRecord(
        model_key=model.shape_key,
        prompt_tokens=64,
        new_tokens=16,
        variants=(
            TunedVariant("float32", "sdpa", 0.30, 0.10, 50.0),
            TunedVariant("bfloat16", "sdpa", 0.10, 0.05, 20.0),
            TunedVariant("float16", "sdpa", 0.01, 0.01, 500.0),  # fastest, never chosen on CPU
        ),
        fingerprint=tuple(sorted(machine.fingerprint().items())),
        measured_at="2026-12-03",
        path="/cache/tuning/x.json",
    )
    tuned = replace(machine, tuning=(record,))
    chosen = {
        workload: decide_plan(tuned, model, Request(workload=Workload(*workload))).decision("dtype")
        for workload in [(64, 16), (64, 2), (512, 16)]
    }
    assert {w: d.value for w, d in chosen.items()} == {(64, 16): "float32", (64, 2): "bfloat16", (512, 16): "bfloat16"}
    assert "est. 0.70 s" in chosen[64, 16].reason and "est. 0.20 s" in chosen[64, 2].reason
    assert "est. 1.25 s" in chosen[512, 16].reason
    assert all("/cache/tuning/x.json" in d.reason for d in chosen.values())


def test_workload_settings_are_checked() -> None:
    from cudaload import SettingError
    from cudaload.bench.harness import workload_for

    assert workload_for(quick=True).repeats == 1
    chosen = workload_for(quick=False, prompt_tokens=32, new_tokens=8, batch=4, repeats=2)
    assert (chosen.prompt_tokens, chosen.new_tokens, chosen.batch, chosen.repeats) == (32, 8, 4, 2)
    for bad in ({"batch": 0}, {"new_tokens": -1}, {"repeats": 1.5}, {"prompt_tokens": True}):
        with pytest.raises(SettingError, match="whole number of at least 1"):
            workload_for(quick=True, **bad)


def test_the_model_is_the_users_when_its_weights_are_here(tiny_models, tmp_path: Path) -> None:
    from cudaload import ModelConfigError
    from cudaload.bench.models import resolve_model

    mine = resolve_model(str(tiny_models["llama"]), tmp_path, quick=True, random_weights=False)
    assert mine.path == tiny_models["llama"] and not mine.random_weights
    assert mine.architecture == "LlamaForCausalLM" and mine.vocab_size == 256
    with pytest.raises(ModelConfigError, match=r"no config\.json"):
        resolve_model(str(tmp_path), tmp_path, quick=True, random_weights=False)
    # Not on this machine and the Hub is off limits (HF_HUB_OFFLINE in the tests): a clear error.
    with pytest.raises(ModelConfigError, match="its weights are not on this machine"):
        resolve_model("someone/not-downloaded-model", tmp_path, quick=True, random_weights=False)


@pytest.mark.slow
def test_bench_cli_runs_a_config_only_model_and_files_json_and_chart(tiny_models, tmp_path: Path, monkeypatch) -> None:
    """`cudaload bench MODEL --results DIR`: a folder with only a config gets random weights of its
    shape; the JSON and the chart are filed under DIR/<machine>/<date>."""
    pytest.importorskip("matplotlib")
    from cudaload.cli import main

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text((tiny_models["llama"] / "config.json").read_text())
    args = ["bench", str(config_only), "--quick", "--batch", "2", "--prompt-tokens", "8", "--new-tokens", "4"]
    args += ["--model-dir", str(tmp_path / "built"), "--results", str(tmp_path / "results"), "--no-overhead"]
    assert main(args) == 0
    (filed,) = (tmp_path / "results").glob("*/*.json")
    assert filed.parent.name.startswith(("cpu-", "cuda-"))
    assert filed.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads(filed.read_text())
    assert result["model"]["random_weights"] is True and result["model"]["architecture"] == "LlamaForCausalLM"
    assert result["model"]["name"] == str(config_only)
    assert result["workload"]["batch"] == 2 and result["overhead"] is None
    plan = next(v for v in result["variants"] if v["is_plan"])
    assert plan["ok"] and plan["peak_memory_bytes"] >= plan["weights_bytes"] > 0
    # Two prompts of 8 tokens: prefill tokens/s counts both.
    assert plan["prefill_tokens_per_s"] == pytest.approx(2 * 8 / plan["prefill_s"])


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_measured(tiny_models, tmp_path: Path, monkeypatch) -> None:
    from cudaload.bench import harness

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    real_run = harness._run
    calls = []

    def interrupted_on_the_third_run(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_run(*args, **kwargs)

    monkeypatch.setattr(harness, "_run", interrupted_on_the_third_run)
    result = run_bench(str(tiny_models["llama"]), quick=True, repeats=1, prompt_tokens=8, new_tokens=4)
    assert result["interrupted"] is True
    rows = result["variants"]
    assert all(r["runs"]["load_s"] for r in rows)  # phase 1 finished before the interrupt
    assert not any(r["runs"]["prefill_s"] for r in rows)  # the warm-up round was cut short
    assert "INTERRUPTED" in format_report(result)


@pytest.mark.slow
def test_overhead_is_measured_in_fresh_processes(tiny_models, tmp_path: Path) -> None:
    from cudaload.bench.overhead import GOALS, format_overhead, run_overhead

    costs = run_overhead(str(tiny_models["llama"]), repeats=1)
    heavy = costs["heavy_imports"]
    assert heavy["import"] == [] and heavy["detect"] == [] and heavy["plan_cached"] == []
    seconds = {k: v["median"] for k, v in costs["seconds"].items()}
    assert all(value > 0 for key, value in seconds.items() if key != "probe_s")
    # (The medians, ratios and goals from given seconds: test_overhead_arithmetic_from_given_children.)
    assert set(costs["goals"]) == set(GOALS) and all(goal["met"] in (True, False) for goal in costs["goals"].values())
    assert costs["floor"]["bytes"] == sum(p.stat().st_size for p in tiny_models["llama"].glob("*.safetensors"))
    # Bare from_pretrained is given the plan's own kwargs (which dtype that is, from known inputs:
    # test_overhead_arithmetic_from_given_children).
    import cudaload

    assert costs["bare_kwargs"] == cudaload.from_pretrained_kwargs(cudaload.plan(str(tiny_models["llama"])))
    assert "what cudaload costs" in format_overhead(costs)


def test_overhead_arithmetic_from_given_children(tiny_models, monkeypatch, unmeasured_dtype: str) -> None:
    """run_overhead with its child processes replaced by given seconds: the medians, ratios and goals
    worked out by hand (3 rounds; each list is one kind's seconds, round by round)."""
    from cudaload.bench import overhead

    monkeypatch.setenv("CUDALOAD_PROBE", "0")  # the plan's dtype then follows from known facts
    given = {
        "import": [0.040, 0.030, 0.050],  # median 0.040 < 0.050: met
        "detect": [0.01, 0.02, 0.03],
        "plan-cold": [0.5, 0.7, 0.6],
        "plan-warm": [0.12, 0.11, 0.13],  # median 0.12, not < 0.100: NOT met
        "bare": [1.00, 0.90, 1.20],  # median 1.00
        "load": [1.10, 1.30, 1.00],  # median 1.10
        "load-no-verify": [1.04, 2.00, 1.00],  # median 1.04: 1.04x bare <= 1.05, met
    }
    probe, verify_s = [0.3, 0.2, 0.4], [0.05, 0.06, 0.04]
    seen_kwargs, warm_cache, warm_load = [], [], []

    def child(kind, model, cache, *, kwargs=None, verify=True):
        if kind == "plan" and Path(cache).name.startswith("cold"):
            return {"s": given["plan-cold"].pop(0), "heavy": [], "timings": {"probe": probe.pop(0)}}
        if kind == "plan" and not warm_cache:
            warm_cache.append(cache)  # the first plan fills the warm cache: not a measurement
            return {"s": 9.9, "heavy": [], "timings": {"probe": 9.9}}
        if kind == "plan":
            return {"s": given["plan-warm"].pop(0), "heavy": [], "timings": {}}
        if kind == "load" and not warm_load:
            warm_load.append(cache)  # the first load() writes the test forward's record: not a measurement
            return {"s": 9.9, "timings": {"verify": 9.9}}
        if kind == "bare":
            seen_kwargs.append(kwargs)
            return {"s": given["bare"].pop(0)}
        if kind == "load" and verify:
            return {"s": given["load"].pop(0), "timings": {"verify": verify_s.pop(0)}}
        if kind == "load":
            return {"s": given["load-no-verify"].pop(0), "timings": {}}
        return {"s": given[kind].pop(0), "heavy": []}

    monkeypatch.setattr(overhead, "_child", child)
    monkeypatch.setattr(overhead, "_page_cache_read_s", lambda folder: (0.25, 1000))
    costs = overhead.run_overhead(str(tiny_models["llama"]), repeats=3)

    assert all(not left for left in given.values()) and not probe and not verify_s  # every round read once
    medians = {k: v["median"] for k, v in costs["seconds"].items()}
    assert medians == {
        "import_s": 0.040,
        "detect_s": 0.02,
        "plan_first_s": 0.6,
        "plan_cached_s": 0.12,
        "load_s": 1.10,
        "load_no_verify_s": 1.04,
        "verify_s": 0.05,
        "bare_s": 1.00,
        "probe_s": 0.3,
    }
    assert costs["seconds"]["bare_s"] == {"median": 1.0, "min": 0.9, "max": 1.2, "runs": [1.0, 0.9, 1.2]}
    # load 1.04 / bare 1.00; with verification 1.10 / 1.00; bare 1.00 s over the 0.25 s floor.
    # load() on a cached plan: 1.10 / (1.2 x 1.00 + 0.05) = 0.88 of issue 37's limit.
    assert costs["ratios"] == {
        "load_over_bare": 1.04,
        "load_with_verify_over_bare": 1.1,
        "bare_over_floor": 4.0,
        "load_over_limit": 0.88,
    }
    assert warm_load == warm_cache  # the record was written in the cache every measured load() reads
    assert {name: goal["met"] for name, goal in costs["goals"].items()} == {
        "import_s": True,
        "plan_cached_s": False,
        "load_over_bare": True,
        "load_over_limit": True,
    }
    assert costs["floor"] == {"page_cache_read_s": 0.25, "bytes": 1000}
    # Bare from_pretrained, every round, is given the plan's kwargs: unmeasured, the static table's dtype.
    assert len(seen_kwargs) == 3 and all(k == seen_kwargs[0] for k in seen_kwargs)
    assert seen_kwargs[0]["dtype"] == unmeasured_dtype
    assert seen_kwargs[0]["attn_implementation"] == "sdpa"
    report = overhead.format_overhead(costs)
    assert "= 1.04x bare" in report and "plan_cached_s < 0.1: NOT met (0.12)" in report


@pytest.mark.parametrize(
    ("flags", "slug"),
    [
        (("avx2",), "cpu-simulated-cpu-avx2"),
        (("avx2", "avx512f", "avx512_bf16"), "cpu-simulated-cpu-avx512-bf16"),
        (("avx2", "avx512f", "avx512_bf16", "amx_bf16"), "cpu-simulated-cpu-amx-bf16"),
        ((), "cpu-simulated-cpu"),
    ],
)
def test_cpu_results_are_filed_by_model_and_widest_isa(flags, slug, tmp_path) -> None:
    # One hypervisor model name ("AMD EPYC") covers an AVX2 Zen 3 and an AVX512-BF16 Zen 4, whose
    # bf16 results are opposite: the ISA keeps their files apart.
    from datetime import datetime, timezone

    from cudaload import Machine
    from cudaload.bench import machine_slug, result_path

    machine = Machine.simulated(cpu_flags=flags)
    assert machine_slug(machine) == slug
    when = datetime(2026, 12, 3, tzinfo=timezone.utc)
    assert result_path(tmp_path, machine, "finetune", when) == tmp_path / slug / "2026-12-03-finetune.json"
    # A record of that day and kind is there: the next is filed beside it, never over it.
    (tmp_path / slug).mkdir()
    (tmp_path / slug / "2026-12-03-finetune.json").write_text("{}")
    assert result_path(tmp_path, machine, "finetune", when) == tmp_path / slug / "2026-12-03-finetune-2.json"
    (tmp_path / slug / "2026-12-03-finetune-2.json").write_text("{}")
    assert result_path(tmp_path, machine, "finetune", when).name == "2026-12-03-finetune-3.json"
    assert result_path(tmp_path, machine, "", when).name == "2026-12-03.json"  # another kind: its own name


def test_gpu_results_are_filed_by_gpu_name() -> None:
    from cudaload import Machine
    from cudaload.bench import machine_slug

    assert machine_slug(Machine.simulated("H100")).startswith("cuda-nvidia-h100")


def test_a_benchmark_scripts_record_leads_with_where_it_ran(tmp_path: Path) -> None:
    from cudaload.bench.environment import machine_slug, write_benchmark_record
    from cudaload.capability import detect

    named = write_benchmark_record(tmp_path / "x" / "named.json", tmp_path / "results", "probe-x", {"runs": [1]})
    record = json.loads(named.read_text())
    assert list(record)[:2] == ["machine", "versions"] and record["runs"] == [1]
    assert record["versions"]["cudaload"] and record["machine"]["cpu"]["isa_flags"] is not None
    filed = write_benchmark_record("results", tmp_path / "results", "probe-x", {})
    assert filed.parent == tmp_path / "results" / machine_slug(detect()) and filed.name.endswith("-probe-x.json")
    again = write_benchmark_record("results", tmp_path / "results", "probe-x", {"runs": [2]})
    assert again.name.endswith("-probe-x-2.json") and json.loads(filed.read_text()).get("runs") is None  # kept


@pytest.mark.slow
def test_load_costs_split_each_load_into_from_pretrained_and_cudaloads_own_share(tiny_models) -> None:
    from cudaload.bench.overhead import load_costs

    costs = load_costs(tiny_models["qwen3"], repeats=1)
    inside, own, cpu = costs["from_pretrained_cpu_s"], costs["own_cpu_s"], costs["cpu_s"]
    for kind in ("bare", "load", "load_no_verify", "bare_again", "load_again"):
        (total,), (spent,), (rest,) = cpu[kind]["runs"], inside[kind]["runs"], own[kind]["runs"]
        assert 0 < spent <= total, kind  # from_pretrained ran, counted once (an Auto class calls the model's)
        assert rest == pytest.approx(total - spent, abs=2e-4), kind
    # bare is from_pretrained and nothing else; load() also imports cudaload's modules and plans.
    assert own["bare"]["runs"][0] < own["load"]["runs"][0]
