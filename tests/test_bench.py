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
        assert v["load_s"] > 0 and v["prefill_s"] > 0 and v["decode_tokens_per_s"] > 0
        assert v["end_to_end_s"] == pytest.approx(v["load_s"] + v["generate_s"])
        assert v["prefill_tokens_per_s"] == pytest.approx(work["batch"] * 64 / v["prefill_s"], rel=1e-9)

    # The plan's own ratios are 1 by definition; every other row's are its numbers over the plan's
    # (decode: the plan's rate over the variant's), read from the two rows of the record.
    assert plan["plan_speedup"] == {"load": 1.0, "prefill": 1.0, "decode": 1.0, "end_to_end": 1.0}
    assert plan["plan_speedup_paired"] == {"load": 1.0, "prefill": 1.0, "decode": 1.0}
    others = [v for v in variants if not v["is_plan"]]
    assert len(others) == 6  # five more dtype x attention rows and bare from_pretrained
    for v in others:
        expected = {
            "load": v["load_s"] / plan["load_s"],
            "prefill": v["prefill_s"] / plan["prefill_s"],
            "decode": plan["decode_tokens_per_s"] / v["decode_tokens_per_s"],
            "end_to_end": v["end_to_end_s"] / plan["end_to_end_s"],
        }
        assert v["plan_speedup"] == pytest.approx(expected, abs=1e-4), v["name"]  # rounded to 4 places
        # Paired: the median of the per-round ratios; with one round, that round's ratio.
        paired = {
            "load": v["runs"]["load_s"][0] / plan["runs"]["load_s"][0],
            "prefill": v["runs"]["prefill_s"][0] / plan["runs"]["prefill_s"][0],
            "decode": plan["runs"]["decode_tps"][0] / v["runs"]["decode_tps"][0],
        }
        assert v["plan_speedup_paired"] == pytest.approx(paired, abs=1e-4), v["name"]

    # Every dtype x attention alternative was measured, each once, with the plan's device_map.
    names = [v["name"] for v in variants]
    assert len(names) == len(set(names))
    for dtype in ("float32", "bfloat16", "float16"):
        for attn in ("sdpa", "eager"):
            assert f"{dtype}/{attn}" in names
    # The plan was measured here, as load() would plan it, for this run's token counts.
    planned = next(d for d in result["plan"]["decisions"] if d["setting"] == "dtype")
    assert "probed on this CPU" in planned["reason"] and "a 64-token prompt + 16 new tokens" in planned["reason"]
    (bare,) = [v for v in variants if v["is_bare"]]
    assert bare["kwargs"] == {} and bare["applied"] == "bfloat16/sdpa"  # the checkpoint's dtype, transformers' default
    for v in variants:
        assert v["finite_logits"] is True
        if not v["is_bare"]:
            assert v["kwargs"]["device_map"] == result["plan"]["kwargs"]["device_map"]

    # The summary: per metric, the row named best has the lowest cost of all the rows (decode: the
    # highest tokens/s), and the plan's ratios are its cost over the best's and over bare's.
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
        assert row["plan_over_best"] == pytest.approx(of(plan) / of(best), abs=1e-4), metric
        assert row["plan_over_bare"] == pytest.approx(of(plan) / of(bare), abs=1e-4), metric

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
    # The policy's estimate from the record: load + prefill + (new - 1) decode steps, fp16 never chosen on CPU.
    rows = [v for v in variants if v["attn_implementation"] == "sdpa" and v["dtype"] in ("float32", "bfloat16")]
    fastest = min(rows, key=lambda v: v["load_s"] + v["prefill_s"] + 15 / v["decode_tokens_per_s"])
    assert tuned.value == fastest["dtype"]
    assert "stale: threads '1' there" in stale.reason


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
    assert costs["ratios"]["load_over_bare"] == pytest.approx(seconds["load_no_verify_s"] / seconds["bare_s"], rel=1e-3)
    for name, goal in costs["goals"].items():
        op, limit = GOALS[name]
        assert goal["met"] == (goal["value"] < limit if op == "<" else goal["value"] <= limit)
    assert costs["floor"]["bytes"] == sum(p.stat().st_size for p in tiny_models["llama"].glob("*.safetensors"))
    assert costs["bare_kwargs"]["dtype"] in ("float32", "bfloat16")
    assert "what cudaload costs" in format_overhead(costs)


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


def test_gpu_results_are_filed_by_gpu_name() -> None:
    from cudaload import Machine
    from cudaload.bench import machine_slug

    assert machine_slug(Machine.simulated("H100")).startswith("cuda-nvidia-h100")
