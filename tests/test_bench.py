"""The side-by-side benchmark runs end to end (quick mode) and reports a well-formed result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudaload.bench import format_report, run_bench


@pytest.mark.slow
def test_quick_bench_reports_the_plan_and_every_alternative(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = run_bench(quick=True, out=str(out))

    variants = result["variants"]
    plans = [v for v in variants if v["is_plan"]]
    assert len(plans) == 1
    plan = plans[0]
    assert plan["name"] == result["plan"]["variant"] == result["baseline"]
    assert (plan["dtype"], plan["attn_implementation"]) == (
        result["plan"]["kwargs"]["dtype"],
        result["plan"]["kwargs"]["attn_implementation"],
    )
    assert plan["plan_speedup"] == plan["plan_speedup_paired"] == {"load": 1.0, "prefill": 1.0, "decode": 1.0}

    # Every dtype x attention alternative was measured, each once, with the plan's device_map.
    names = [v["name"] for v in variants]
    assert len(names) == len(set(names))
    for dtype in ("float32", "bfloat16", "float16"):
        for attn in ("sdpa", "eager"):
            assert f"{dtype}/{attn}" in names
    for v in variants:
        assert v["ok"], v["error"]
        assert v["load_s"] > 0 and v["prefill_s"] > 0 and v["decode_tokens_per_s"] > 0
        assert v["finite_logits"] is True
        assert v["kwargs"]["device_map"] == result["plan"]["kwargs"]["device_map"]
        assert all(ratio > 0 for ratio in (*v["plan_speedup"].values(), *v["plan_speedup_paired"].values()))

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
