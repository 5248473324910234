"""The fine-tuning benchmark: LoRA and QLoRA each measured in its own process, next to the plan's estimate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cudaload.bench.finetune_bench import _row, run_finetune_bench
from cudaload.bench.finetune_child import estimate_parts
from cudaload.bench.finetune_report import format_finetune_report, ratio, step_statistics, summarise


def test_ratio_is_none_without_both_numbers() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 3.0) == 0.3333
    assert ratio(None, 2.0) is None
    assert ratio(2.0, None) is None
    assert ratio(2.0, 0) is None


def test_step_statistics() -> None:
    assert step_statistics([0.3, 0.1, 0.2]) == {"median_s": 0.2, "min_s": 0.1, "max_s": 0.3, "spread": 3.0}
    assert step_statistics([]) == {"median_s": None, "min_s": None, "max_s": None, "spread": None}


def test_estimate_parts_split_the_estimate_as_measured() -> None:
    estimate = {"weights": 1000, "lora": 160, "activations": 500, "overhead": 1 << 30, "total": 1660 + (1 << 30)}
    # 10 adapter parameters: their fp32 gradients (40 bytes) are allocated by the step; the overhead is no allocation.
    assert estimate_parts(estimate, 10) == {"step": 540, "total": 1660}


def _child(step_times: list[float], step_bytes: int, total_bytes: int, *, quantize: str | None) -> dict[str, Any]:
    return {
        "plan": {"dtype": "float32", "quantization": quantize, "optimizer": "adamw_torch"},
        "device": "cpu",
        "optimizer": "torch AdamW",
        "autocast": None,
        "load_s": 0.5,
        "step_times_s": step_times,
        "loss": {"warmup": 8.0, "steps": [7.9, 7.5]},
        "trainable_parameters": 32768,
        "memory": {
            "method": "VmHWM reset by clear_refs",
            "baseline_bytes": 1 << 28,
            "before_load_bytes": 1 << 27,
            "step": {"bytes": step_bytes, "estimate_bytes": 4 << 20},
            "total": {"bytes": total_bytes, "estimate_bytes": 40 << 20},
        },
        "torch_threads": 2,
    }


def _result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "benchmark": "cudaload.bench.finetune",
        "date": "2026-12-03T00:00:00+00:00",
        "machine": {"cpu": {"model": "Test CPU", "cores": 2, "arch": "x86_64"}, "gpus": []},
        "versions": {
            "python": "3.11",
            "torch": "2.13.0",
            "transformers": "5.22.2",
            "peft": "0.21.2",
            "bitsandbytes": "0.50.2",
            "cudaload": "0.1.0",
        },
        "model": {"architecture": "Qwen3ForCausalLM", "parameters": 35_000_000, "shape": {"hidden_size": 512}},
        "workload": {
            "quick": False,
            "steps": 3,
            "seq_len": 256,
            "batch_size": 1,
            "threads": None,
            "statistic": "median of 3 timed steps after 1 warm-up step",
            "peak_memory": "resident memory",
        },
        "variants": rows,
        "summary": summarise(rows),
        "wall_s": 12.0,
    }


def test_rows_and_summary_compute_their_ratios_from_the_numbers() -> None:
    lora = _row("LoRA", None, _child([0.2, 0.1, 0.3], 6 << 20, 60 << 20, quantize=None))
    qlora = _row("QLoRA 4-bit", "4bit", _child([0.3, 0.6, 0.4], 4 << 20, 30 << 20, quantize="4bit"))
    assert lora["memory"]["step"]["ratio"] == 1.5 and lora["memory"]["total"]["ratio"] == 1.5
    assert lora["step_time"]["median_s"] == 0.2 and lora["step_time"]["spread"] == 3.0
    assert lora["loss"] == {"first": 8.0, "last": 7.5, "steps": [7.9, 7.5], "finite": True}
    summary = summarise([lora, qlora])["qlora_over_lora"]
    assert summary["step_time"] == 2.0  # medians 0.4 / 0.2
    assert summary["peak_memory"] == 0.5  # totals 30 / 60 MiB
    assert summary["peak_memory_estimate"] == 1.0


def test_a_failed_variant_is_a_row_with_its_error_and_no_ratio() -> None:
    lora = _row("LoRA", None, _child([0.2], 6 << 20, 60 << 20, quantize=None))
    failed = _row("QLoRA 4-bit", "4bit", {"error": "MissingPackageError: no bitsandbytes", "plan_error": "x"})
    assert failed["error"] == "MissingPackageError: no bitsandbytes" and failed["plan"] is None
    assert "step_time" not in failed
    assert summarise([lora, failed]) == {"qlora_over_lora": None}
    report = format_finetune_report(_result([lora, failed]))
    assert "QLoRA 4-bit  ?/none/?" in report and "failed: MissingPackageError: no bitsandbytes" in report
    assert "no ratio (a variant did not run)" in report


def test_report_has_a_row_per_variant_with_measured_estimate_and_ratio() -> None:
    lora = _row("LoRA", None, _child([0.2, 0.1, 0.3], 6 << 20, 60 << 20, quantize=None))
    qlora = _row("QLoRA 4-bit", "4bit", _child([0.3, 0.6, 0.4], 4 << 20, 30 << 20, quantize="4bit"))
    report = format_finetune_report(_result([lora, qlora]))
    lora_line = next(line for line in report.splitlines() if line.startswith("  LoRA "))
    # step s, spread, peak MiB, estimate MiB, ratio, step MiB, estimate MiB, ratio, trainable, losses
    assert lora_line.split()[2:12] == [
        "0.200",
        "3.00",
        "60.0",
        "40.0",
        "1.50",
        "6.0",
        "4.0",
        "1.50",
        "32,768",
        "8.0000",
    ]
    assert lora_line.endswith("8.0000 -> 7.5000")
    assert "float32/4bit/adamw_torch" in report
    assert "QLoRA / LoRA: step time 2.00x, peak memory 0.50x (estimate 1.00x)" in report


def test_bad_arguments_raise_before_any_process_starts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        run_finetune_bench(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        run_finetune_bench(tmp_path, steps=0)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        run_finetune_bench(tmp_path, threads=0)


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cudaload.demo import save_random_qwen3

    path = tmp_path_factory.mktemp("finetune-bench") / "qwen3"
    save_random_qwen3(
        path,
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    return path


def _installed(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


@pytest.mark.slow
def test_quick_finetune_bench_measures_lora_and_qlora(
    tiny_qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unmeasured_dtype: str
) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    # Unmeasured (the variants' processes inherit it): the plan's dtype follows from the machine.
    monkeypatch.setenv("CUDALOAD_PROBE", "0")
    lines: list[str] = []
    result = run_finetune_bench(tiny_qwen3, quick=True, log=lines.append)
    json.dumps(result)  # JSON-ready
    assert result["benchmark"] == "cudaload.bench.finetune" and result["schema"] == 1
    work = result["workload"]
    assert (work["steps"], work["seq_len"], work["threads"]) == (2, 64, 1)
    assert result["model"]["shape"]["hidden_size"] == 64 and result["model"]["parameters"] > 0
    on_cuda = bool(result["machine"]["gpus"])
    assert ("max_memory_allocated" if on_cuda else "VmHWM") in work["peak_memory"]

    variants = {v["quantize"]: v for v in result["variants"]}
    assert set(variants) == {None, "4bit"}
    # Which variants ran here is known before the run: LoRA everywhere, QLoRA wherever bitsandbytes
    # is installed (0.50 has a CPU backend, so CPU-only machines run 4-bit too).
    bnb = _installed("bitsandbytes")
    assert result["versions"]["bitsandbytes"] == bnb
    assert variants[None]["error"] is None, variants[None]["error"]  # LoRA without quantization runs everywhere
    if bnb is not None:
        assert variants["4bit"]["error"] is None, (
            f"QLoRA 4-bit failed although bitsandbytes {bnb} is installed: {variants['4bit']['error']}"
        )
    else:
        assert "bitsandbytes" in variants["4bit"]["error"], variants["4bit"]["error"]
    ran = [v for v in variants.values() if v["error"] is None]
    dtype, on_gpu = unmeasured_dtype, on_cuda
    # The plan's estimate, by hand, for this model at 64 tokens (vocab 1024, hidden 64, MLP 128, 2 layers,
    # q 4x16, kv 2x16; 205,184 parameters, of which 73,728 in the 14 projections; d = 2 bytes in
    # bf16/fp16, 4 in fp32); `step` = activations + the LoRA gradients (4 bytes each), `total` = weights +
    # LoRA (+ its gradient and AdamW state: 16 bytes a parameter; the 8-bit optimizer keeps every one of
    # these tensors, each under 4096 elements, in fp32 too) + activations:
    d = 2 if dtype in ("bfloat16", "float16") else 4
    lora = 16 * (128 + 96 + 96 + 128 + 192 + 192 + 192) * 2  # r x (fan in + fan out), 2 layers: 32,768
    kept = 2 * 64 * 64 * d  # checkpointing keeps each layer's input
    logits = 12 * 64 * 1024  # the loss's peak: 12 bytes a logit
    # one recomputed layer per token: 2 fp32 norms + attention (q, k, v, out) + SwiGLU + each adapter's
    # dropout mask (4 bytes on CPU, 1 on a GPU) and input (d), over the 512 fan-in of the 7 adapters
    layer = 64 * (2 * 4 * 64 + 4 * d * 64 + 3 * d * 128 + ((1 if on_gpu else 4) + d) * 512)
    activations = kept + max(layer, logits)
    weights = {
        None: 205_184 * d,
        # nf4 + double quant on the projections: 1/2 + 1/64 + 4/16384 bytes a weight; the rest in d bytes
        "4bit": 73_728 // 2 + 73_728 // 64 + 73_728 * 4 // 16_384 + (205_184 - 73_728) * d,
    }
    expected_optimizer = {
        None: ("adamw_torch_fused", "torch AdamW (fused)"),
        "4bit": ("paged_adamw_8bit", "bitsandbytes PagedAdamW8bit")
        if on_gpu
        else ("adamw_torch_fused", "torch AdamW (fused)"),
    }
    for v in ran:
        plan = v["plan"]
        assert plan["quantization"] == v["quantize"] and plan["dtype"] == dtype
        if v["quantize"] == "4bit":
            assert plan["quantization_config"]["load_in_4bit"] is True
        else:
            assert plan.get("quantization_config") is None
        assert plan["memory_estimate"]["assumes"]["seq_len"] == 64
        assert (plan["optimizer"], v["optimizer"]) == expected_optimizer[v["quantize"]]
        runs = v["step_time"]["runs_s"]
        assert len(runs) == 2 and all(t > 0 for t in runs)
        assert (v["step_time"]["min_s"], v["step_time"]["max_s"]) == (min(runs), max(runs))
        assert min(runs) <= v["step_time"]["median_s"] <= max(runs)
        assert v["trainable_parameters"] == plan["lora_parameters_estimated"] == lora
        assert v["loss"]["finite"] and all(math.isfinite(x) for x in (v["loss"]["first"], v["loss"]["last"]))
        assert v["loss"]["last"] == v["loss"]["steps"][-1] and len(v["loss"]["steps"]) == 2
        expected_estimate = {
            "step": activations + 4 * lora,
            "total": weights[v["quantize"]] + 16 * lora + activations,
        }
        for part in ("step", "total"):
            measured = v["memory"][part]
            assert measured["estimate_bytes"] == pytest.approx(expected_estimate[part], abs=8), part
            assert measured["bytes"] > 0
            assert measured["ratio"] > 0
    summary = result["summary"]["qlora_over_lora"]
    if bnb is not None:
        # (The ratios' arithmetic: test_rows_and_summary_compute_their_ratios_from_the_numbers.)
        assert set(summary) == {"step_time", "peak_memory", "peak_memory_estimate"}
        # The 4-bit base is smaller, and so is its estimate: (weights 4bit + rest) / (weights 16-bit + rest).
        lora_total = weights[None] + 16 * lora + activations
        qlora_total = weights["4bit"] + 16 * lora + activations
        assert summary["peak_memory_estimate"] == pytest.approx(qlora_total / lora_total, abs=1e-4)
        assert summary["peak_memory_estimate"] < 1
    else:
        assert summary is None
    report = format_finetune_report(result)
    assert "LoRA" in report and "QLoRA 4-bit" in report and "quick mode" in report
    assert any("LoRA: median step" in line for line in lines)


def test_the_chart_draws_the_variants_that_ran(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from cudaload.bench import write_chart

    lora = _row("LoRA", None, _child([0.2, 0.1, 0.3], 6 << 20, 60 << 20, quantize=None))
    failed = _row("QLoRA 4-bit", "4bit", {"error": "MissingPackageError: no bitsandbytes"})
    png = write_chart(_result([lora, failed]), tmp_path / "sub" / "finetune.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no variant ran"):
        write_chart(_result([failed]), tmp_path / "none.png")
