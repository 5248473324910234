"""`cudaload bench` within its time on a busy machine (issue 50): the variants no plan on this machine can
choose are left out and said so, each variant has a time box, and the spread names the variant whose own rounds
it compares."""

from __future__ import annotations

from pathlib import Path

import cudaload
from cudaload.bench.harness import BenchRun, VariantBox
from cudaload.bench.inference import never_planned, variants_for


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
    box = VariantBox(work, share=0.5, variants=5)  # 100 s x 0.5 / 5 = 10 s each
    box.add(0, 4.0)
    box.add(1, 30.0)
    assert box.over(1, 1) is None  # after the warm-up only: every variant gets a measured round
    assert box.over(0, 2) is None
    why = box.over(1, 2)
    assert why is not None and "time-boxed after 1 measured rounds" in why and "its share 10 s" in why
    fixed = VariantBox(BenchRun(prompt_tokens=8, new_tokens=4, repeats=3), share=0.5, variants=5)
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
