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
    # Ratios are the variant's time over the plan's (decode: the plan's rate over the variant's).
    for v in variants:
        assert v["plan_speedup"]["prefill"] == pytest.approx(v["prefill_s"] / plan["prefill_s"], rel=1e-3)
        assert v["plan_speedup"]["decode"] == pytest.approx(
            plan["decode_tokens_per_s"] / v["decode_tokens_per_s"], rel=1e-3
        )
        assert v["plan_speedup"]["end_to_end"] == pytest.approx(v["end_to_end_s"] / plan["end_to_end_s"], rel=1e-3)

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
        assert v["ok"], v["error"]
        assert v["load_s"] > 0 and v["prefill_s"] > 0 and v["decode_tokens_per_s"] > 0
        assert v["end_to_end_s"] == pytest.approx(v["load_s"] + v["generate_s"])
        assert v["finite_logits"] is True
        if not v["is_bare"]:
            assert v["kwargs"]["device_map"] == result["plan"]["kwargs"]["device_map"]
        assert all(ratio > 0 for ratio in (*v["plan_speedup"].values(), *v["plan_speedup_paired"].values()))
    for metric, row in result["summary"].items():
        best = next(v for v in variants if v["name"] == row["best"])
        assert row["plan_over_best"] >= 1.0 or best["is_plan"]  # nothing beats the best
        assert row["plan_over_bare"] > 0, metric

    saved = json.loads(out.read_text())
    assert saved["variants"] == variants
    assert saved["machine"]["cpu"]["model"] and saved["machine"]["cpu"]["cores"] >= 1
    assert isinstance(saved["machine"]["cpu"]["isa_flags"], list)
    assert isinstance(saved["machine"]["gpus"], list)
    assert {"python", "torch", "transformers"} <= set(saved["versions"])
    assert all(saved["versions"][k] for k in ("python", "torch", "transformers"))
    assert saved["date"].endswith("+00:00")
    assert saved["plan"]["kwargs"]["dtype"] == plan["dtype"]

    report = format_report(result)
    assert f"* {plan['name']} (plan)" in report
    assert "x bare" in report and "tuning record saved" in report

    # --save: a later plan of the same model on this machine uses the measured grid. The quick run
    # used 1 thread; with another thread count the record is stale and the plan says so.
    import torch

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
