"""The fine-tuning benchmark's result read back: step-time statistics, QLoRA over LoRA ratios, and the
text table `cudaload bench --finetune` prints (`format_finetune_report`)."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["format_finetune_report", "ratio", "step_statistics", "summarise"]

MiB = 2**20


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator rounded to 4 places; None when either is missing or the denominator <= 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 4)


def step_statistics(times: list[float]) -> dict[str, float | None]:
    """Median, min, max and spread (max / min) of the timed steps' seconds."""
    if not times:
        return {"median_s": None, "min_s": None, "max_s": None, "spread": None}
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "spread": ratio(max(times), min(times)),
    }


def summarise(variants: list[dict[str, Any]]) -> dict[str, Any]:
    """QLoRA over LoRA: median step time, peak memory (total) and its estimate, from the rows."""
    by_quantize = {v["quantize"]: v for v in variants if v.get("error") is None}
    lora, qlora = by_quantize.get(None), by_quantize.get("4bit")
    if lora is None or qlora is None:
        return {"qlora_over_lora": None}
    return {
        "qlora_over_lora": {
            "step_time": ratio(qlora["step_time"]["median_s"], lora["step_time"]["median_s"]),
            "peak_memory": ratio(qlora["memory"]["total"]["bytes"], lora["memory"]["total"]["bytes"]),
            "peak_memory_estimate": ratio(
                qlora["memory"]["total"]["estimate_bytes"], lora["memory"]["total"]["estimate_bytes"]
            ),
        }
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MiB


def format_finetune_report(result: dict[str, Any]) -> str:
    """The result as a table: one row per variant, measured next to the plan's estimate."""
    machine, vers, model, work = result["machine"], result["versions"], result["model"], result["workload"]
    cpu = machine["cpu"]
    gpus = ", ".join(f"{g['name']} (sm {g['capability']})" for g in machine["gpus"]) or "no CUDA GPU"
    shape = model.get("shape") or {}
    size = f"{model['parameters'] / 1e6:.1f}M params" if model.get("parameters") else "? params"
    layout = ", ".join(f"{k} {shape[k]}" for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k in shape)
    lines = [
        f"cudaload bench --finetune ({'quick' if work['quick'] else 'full'}, {result['date']}): "
        f"{model.get('architecture') or 'model'} {size} ({layout}), seq_len {work['seq_len']} x batch "
        f"{work['batch_size']}, {work['statistic']}, {work['threads'] or 'default'} torch threads",
        f"machine: {cpu['model']}, {cpu['cores']} cores, {cpu['arch']}; {gpus}",
        f"versions: python {vers['python']}, torch {vers['torch']}, transformers {vers['transformers']}, "
        f"peft {vers.get('peft')}, bitsandbytes {vers.get('bitsandbytes')}, cudaload {vers['cudaload']}",
        "",
        f"  {'variant':<12} {'plan':<28} {'step s':>7} {'spread':>6} {'peak MiB':>9} {'est. MiB':>9} "
        f"{'meas/est':>8} {'step MiB':>9} {'est. MiB':>9} {'meas/est':>8} {'trainable':>10}  loss first -> last",
    ]
    for row in result["variants"]:
        plan = row.get("plan") or {}
        label = f"{plan.get('dtype', '?')}/{plan.get('quantization') or 'none'}/{plan.get('optimizer', '?')}"
        if row.get("interrupted"):
            lines.append(f"  {row['name']:<12} {label:<28} interrupted (Ctrl-C) before it was measured")
            continue
        if row.get("error") is not None:
            lines.append(f"  {row['name']:<12} {label:<28} failed: {row['error']}")
            continue
        t, total, step = row["step_time"], row["memory"]["total"], row["memory"]["step"]
        losses = row["loss"]
        lines.append(
            f"  {row['name']:<12} {label:<28} {_fmt(t['median_s'], '7.3f')} {_fmt(t['spread'], '6.2f')} "
            f"{_fmt(_mib(total['bytes']), '9.1f')} {_fmt(_mib(total['estimate_bytes']), '9.1f')} "
            f"{_fmt(total['ratio'], '8.2f')} {_fmt(_mib(step['bytes']), '9.1f')} "
            f"{_fmt(_mib(step['estimate_bytes']), '9.1f')} {_fmt(step['ratio'], '8.2f')} "
            f"{row['trainable_parameters']:>10,}  {losses['first']:.4f} -> {losses['last']:.4f}"
        )
    lines.append("")
    summary = (result.get("summary") or {}).get("qlora_over_lora")
    if summary:
        lines.append(
            f"QLoRA / LoRA: step time {_fmt(summary['step_time'], '.2f')}x, peak memory "
            f"{_fmt(summary['peak_memory'], '.2f')}x (estimate {_fmt(summary.get('peak_memory_estimate'), '.2f')}x)"
        )
    else:
        lines.append("QLoRA / LoRA: no ratio (a variant did not run)")
    if result.get("interrupted"):
        lines.append("INTERRUPTED (Ctrl-C): the rows above are what was measured before it")
    lines.append(f"peak: {work['peak_memory']}")
    lines.append(
        "estimate: total = weights + LoRA (weights, gradients, optimizer state) + activations (the plan's "
        "estimate less its overhead); step = activations + LoRA gradients"
    )
    lines.append(
        f"step s: {work['statistic']}; loss first -> last: the warm-up step's loss (before any update) -> "
        f"the last step's (after {work['steps']} updates on the same batch)"
    )
    if work["quick"]:
        lines.append("quick mode: a smoke test; its numbers compare nothing")
    if "written_to" in result:
        lines.append(f"written to {result['written_to']}")
    lines.append(f"took {result.get('wall_s', 0):.0f} s")
    return "\n".join(lines)
