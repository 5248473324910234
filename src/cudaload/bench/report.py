"""The inference benchmark's result as a text table (from the result dict, so a saved JSON file
reads the same as a fresh run)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_generation", "format_report"]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _partial(row: dict[str, Any]) -> str:
    """An interrupted variant: the medians of what it measured, the rest '-'; no ratios."""
    if not any(row[key] is not None for key in ("load_s", "prefill_s", "decode_tokens_per_s")):
        return "interrupted before it was measured"
    memory = row["peak_memory_bytes"] / 2**20 if row["peak_memory_bytes"] else None
    return (
        f"{_fmt(row['load_s'], '7.3f')} {_fmt(row['prefill_s'], '9.3f')} {_fmt(row['prefill_tokens_per_s'], '13.0f')} "
        f"{_fmt(row['decode_tokens_per_s'], '12.1f')} {_fmt(row.get('end_to_end_s'), '12.3f')} {_fmt(memory, '9.0f')}"
        "   interrupted: only what it measured, no ratios"
    )


def format_report(result: dict[str, Any]) -> str:
    """The result as a table, the plan's row marked with `*`."""
    lines = _header(result)
    lines += [_variant_line(row) for row in result["variants"]]
    lines.append("")
    lines += _summary_lines(result.get("summary"))
    lines.append(f"peak memory: {result['workload']['peak_memory']}")
    if result.get("interrupted"):
        lines.append("INTERRUPTED (Ctrl-C): the numbers are what was measured before it; rounds may be missing")
    if result.get("generation"):
        lines.append(format_generation(result["generation"]))
    if result.get("overhead"):
        from .overhead import format_overhead

        lines.append(format_overhead(result["overhead"]))
    if result.get("tuning_record"):
        lines.append(f"tuning record saved: {result['tuning_record']} (plans of this model here now use it)")
    lines += _reading_notes(result)
    if "written_to" in result:
        lines.append(f"written to {result['written_to']}")
    lines.append(f"took {result.get('wall_s', 0):.0f} s")
    return "\n".join(lines)


def _header(result: dict[str, Any]) -> list[str]:
    """What ran where (model, workload, machine, versions, plan), then the table's column titles."""
    machine, versions, model, work = result["machine"], result["versions"], result["model"], result["workload"]
    cpu = machine["cpu"]
    gpus = ", ".join(f"{g['name']} (sm {g['capability']})" for g in machine["gpus"]) or "no CUDA GPU"
    plan_kwargs = " ".join(f"{k}={v}" for k, v in result["plan"]["kwargs"].items())
    weights = "random weights" if model["random_weights"] else "its own weights"
    return [
        f"cudaload bench ({result['mode']}, {result['date']}): {model['name']}, {model['architecture']} "
        f"{model['parameters'] / 1e6:.0f}M params ({weights}), {model['checkpoint_dtype']} checkpoint; "
        f"batch {work['batch']} x prompt {work['prompt_tokens']} tokens + {work['new_tokens']} new tokens, "
        f"{work.get('threads', '?')} torch threads, median of {work['measured_rounds']} after "
        f"{work['warmup_rounds']} warm-up",
        f"machine: {cpu['model']}, {cpu['cores']} cores, {cpu['arch']}, ISA {' '.join(cpu['isa_flags']) or '-'}, "
        f"torch CPU capability {cpu['torch_cpu_capability']}; {gpus}",
        f"versions: python {versions['python']}, torch {versions['torch']}, transformers {versions['transformers']}, "
        f"cudaload {versions['cudaload']}",
        f"plan: {plan_kwargs} (attention chain {' -> '.join(result['plan']['attention_chain'])})",
        "",
        f"  {'variant':<44} {'load s':>7} {'prefill s':>9} {'prefill tok/s':>13} {'decode tok/s':>12} "
        f"{'end-to-end s':>12} {'peak MiB':>9}   plan speed-up load/prefill/decode/end-to-end: of medians | paired",
    ]


def _variant_line(row: dict[str, Any]) -> str:
    """One variant's table row: its medians and the plan's speed-up over it, or why it has none."""
    mark = "*" if row["is_plan"] else " "
    label = row["name"] + (" (plan)" if row["is_plan"] else "")
    if row.get("is_bare") and row.get("applied"):
        label += f" = {row['applied']}"
    if not row["ok"] and row["error"] is not None:
        return f"{mark} {label:<44} failed: {row['error']}"
    if not row["ok"]:  # no error: the run was stopped before this variant's rounds were all done
        return f"{mark} {label:<44} {_partial(row)}"
    s, paired = row["plan_speedup"], row["plan_speedup_paired"]
    memory = row["peak_memory_bytes"] / 2**20 if row["peak_memory_bytes"] else None
    flag = "" if row["finite_logits"] else "  (non-finite logits!)"
    return (
        f"{mark} {label:<44} {_fmt(row['load_s'], '7.3f')} {_fmt(row['prefill_s'], '9.3f')} "
        f"{_fmt(row['prefill_tokens_per_s'], '13.0f')} {_fmt(row['decode_tokens_per_s'], '12.1f')} "
        f"{_fmt(row.get('end_to_end_s'), '12.3f')} "
        f"{_fmt(memory, '9.0f')}   {_fmt(s['load'], '.2f')} / {_fmt(s['prefill'], '.2f')} / "
        f"{_fmt(s['decode'], '.2f')} / {_fmt(s.get('end_to_end'), '.2f')} | {_fmt(paired['load'], '.2f')} / "
        f"{_fmt(paired['prefill'], '.2f')} / {_fmt(paired['decode'], '.2f')}{flag}"
    )


def _summary_lines(summary: dict[str, Any] | None) -> list[str]:
    """The plan's cost against the best variant and bare from_pretrained, per metric."""
    if not summary:
        return []
    lines = [
        "the plan's cost / the best variant's and / bare from_pretrained(path)'s (time, decode: time per token, "
        "memory: peak bytes; 1.00 = as good, above 1 the plan costs more):"
    ]
    for metric, row in summary.items():
        lines.append(
            f"  {metric:<11} {_fmt(row['plan_over_best'], '.2f')}x best ({row['best']}), "
            f"{_fmt(row['plan_over_bare'], '.2f')}x bare"
        )
    return lines


def _reading_notes(result: dict[str, Any]) -> list[str]:
    """How to read the numbers: quick mode, what the ratios are against, noise, the fastest variants."""
    lines: list[str] = []
    if result["mode"] == "quick":
        lines.append("quick mode: a smoke test on a tiny model; its numbers compare nothing")
    if result["baseline"] is None:
        lines.append("no ratios: neither the plan's variant nor its fallbacks ran")
    elif not next(r for r in result["variants"] if r["is_plan"])["is_baseline"]:
        lines.append(f"the plan's variant failed; ratios are against its fallback {result['baseline']}")
    lines.append(
        "plan speed-up = variant time / plan time (decode: plan tok/s / variant tok/s): "
        ">1 the plan is faster, <1 that variant beats the plan; 'of medians' divides the medians, "
        "'paired' is the median of the same ratio taken in each round"
    )
    if result["workload"]["measured_rounds"] > 1:
        lines.append(_spread_line(result["variants"]))
    best = result["best"]
    plan_name = result["plan"]["variant"]
    verdicts = [f"{what} {name}{' (the plan)' if name == plan_name else ''}" for what, name in best.items()]
    lines.append("fastest: " + ", ".join(verdicts))
    return lines


def _spread_line(variants: list[dict[str, Any]]) -> str:
    """The worst run-to-run spread per phase: how close to 1 a ratio must be to count as noise."""
    worst = {
        what: max((r["spread"][what] for r in variants if r["ok"] and r["spread"][what]), default=None)
        for what in ("load", "prefill", "decode")
    }
    return (
        "run-to-run spread (max/min over measured rounds, worst variant): "
        + ", ".join(f"{what} {_fmt(value, '.2f')}x" for what, value in worst.items())
        + ": ratios closer to 1 than that are noise"
    )


def format_generation(section: dict[str, Any]) -> str:
    """The generation comparison as a table (from the result dict)."""
    lines = [
        f"generation: batch {section['batch']} (prompts of {min(section['prompt_lengths'])}-"
        f"{max(section['prompt_lengths'])} tokens, padded) + {section['new_tokens']} new tokens, greedy; "
        f"plan: {section['plan']['generate_kwargs'] or 'no generate() arguments'}, "
        f"padding {section['plan']['padding_side']}",
        f"  {'variant':<32} {'cache':<10} {'padding':<7} {'decode tok/s':>12} {'generate s':>10} {'peak MiB':>9} "
        f"{'KV MiB':>8} {'as alone':>8}   over default: decode / generate / memory",
    ]
    for row in section["variants"]:
        label = row["name"] + (" (= default)" if row["is_plan"] and row["is_default"] else "")
        mark = "*" if row["is_plan"] else " "
        cache = row["generate_kwargs"].get("cache_implementation", "default")
        if not row["ok"]:
            lines.append(f"{mark} {label:<32} {cache:<10} {row['padding_side']:<7} failed: {row['error']}")
            continue
        peak = row["peak_memory_bytes"] / 2**20 if row["peak_memory_bytes"] else None
        kv = row["kv_cache_bytes"] / 2**20 if row["kv_cache_bytes"] is not None else None
        s = row["speedup_over_default"]
        lines.append(
            f"{mark} {label:<32} {cache:<10} {row['padding_side']:<7} {_fmt(row['decode_tokens_per_s'], '12.1f')} "
            f"{_fmt(row['generate_s'], '10.3f')} {_fmt(peak, '9.0f')} {_fmt(kv, '8.2f')} "
            f"{row['matches_unpadded']}/{row['sequences']:<6}   {_fmt(s['decode'], '.2f')} / "
            f"{_fmt(s['generate'], '.2f')} / {_fmt(row['memory_over_default'], '.2f')}"
        )
    lines.append(
        f"  KV cache the plan estimates for batch x (longest prompt + new tokens - 1, what generate() keeps): "
        f"{section['kv_cache_bytes_planned'] / 2**20:.2f} MiB; 'as alone': {section['matches_unpadded']}"
    )
    return "\n".join(lines)
