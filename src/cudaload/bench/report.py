"""The inference benchmark's result as a text table (from the result dict, so a saved JSON file
reads the same as a fresh run)."""

from __future__ import annotations

from typing import Any

from ..facts.spread import TIE_MARGIN
from .upstream_messages import format_messages

__all__ = ["format_generation", "format_report"]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_report(result: dict[str, Any], width: int | None = None) -> str:
    """The result as a table, the plan's row marked with `*`, laid out for `width` columns (None: the
    terminal's): prose wraps with a hanging indent, the speed-ups move to a table of their own when a
    row would not fit, and no number is cut."""
    from ..plans.layout import terminal_width

    width = terminal_width(width)
    lines = _header(result)
    lines += _table(result["variants"], width)
    lines.append("")
    lines += _summary_lines(result.get("summary"))
    lines.append(f"peak memory: {result['workload']['peak_memory']}")
    if result.get("interrupted"):
        lines.append("INTERRUPTED (Ctrl-C): the numbers are what was measured before it; rounds may be missing")
    if result.get("generation"):
        lines.append(format_generation(result["generation"], width))
    if result.get("overhead"):
        from .overhead import format_overhead

        lines.append(format_overhead(result["overhead"]))
    if result.get("tuning_record"):
        lines.append(f"tuning record saved: {result['tuning_record']} (plans of this model here now use it)")
    lines += _reading_notes(result)
    lines += format_messages(result.get("upstream_messages") or [])  # after the table, never between its rows
    if "written_to" in result:
        lines.append(f"written to {result['written_to']}")
    lines.append(f"took {result.get('wall_s', 0):.0f} s")
    return fit_lines(lines, width)


def fit_lines(lines: list[str], width: int) -> str:
    """Each line longer than `width` wrapped 4 past its indentation (the table's rows are laid out already)."""
    from ..plans.layout import wrap

    out: list[str] = []
    for text in "\n".join(lines).split("\n"):
        indent = text[: len(text) - len(text.lstrip(" "))]
        out += wrap(text.strip(), width, indent) if len(text) > width else [text]
    return "\n".join(out)


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
    ]


def _measured(row: dict[str, Any]) -> str:
    """A variant's medians (an interrupted variant: what it measured, the rest '-')."""
    memory = row["peak_memory_bytes"] / 2**20 if row["peak_memory_bytes"] else None
    return (
        f"{_fmt(row['load_s'], '7.3f')} {_fmt(row['prefill_s'], '9.3f')} {_fmt(row['prefill_tokens_per_s'], '8.0f')} "
        f"{_fmt(row['decode_tokens_per_s'], '8.1f')} {_fmt(row.get('end_to_end_s'), '10.3f')} {_fmt(memory, '6.0f')}"
    )


def _ratios(row: dict[str, Any]) -> str:
    """The plan's speed-up over a variant, or why it has none."""
    if not row["ok"]:
        if not any(row[key] is not None for key in ("load_s", "prefill_s", "decode_tokens_per_s")):
            return "interrupted before it was measured"
        return "interrupted: only what it measured, no ratios"
    s, paired = row["plan_speedup"], row["plan_speedup_paired"]
    flag = "" if row["finite_logits"] else "  (non-finite logits!)"
    return (
        f"{_fmt(s['load'], '.2f')} / {_fmt(s['prefill'], '.2f')} / {_fmt(s['decode'], '.2f')} / "
        f"{_fmt(s.get('end_to_end'), '.2f')} | {_fmt(paired['load'], '.2f')} / {_fmt(paired['prefill'], '.2f')} / "
        f"{_fmt(paired['decode'], '.2f')}{flag}"
    )


def _label(row: dict[str, Any]) -> str:
    label = str(row["name"]) + (" (plan)" if row["is_plan"] else "")
    if row.get("is_bare") and row.get("applied"):
        label += f" = {row['applied']}"
    return label


_COLUMNS = (  # two header lines, so that a row of numbers is 53 characters
    f"{'load':>7} {'prefill':>9} {'prefill':>8} {'decode':>8} {'end-to-end':>10} {'peak':>6}",
    f"{'s':>7} {'s':>9} {'tok/s':>8} {'tok/s':>8} {'s':>10} {'MiB':>6}",
)
# The paired side has no end-to-end ratio (rounds are paired per phase): its header names its 3 numbers.
_SPEEDUP = "plan speed-up: of medians load/prefill/decode/end-to-end | paired load/prefill/decode"


def _table(variants: list[dict[str, Any]], width: int) -> list[str]:
    """The variants' table, the plan's row marked `*`: one table when its rows fit `width`, else the
    medians, then the plan's speed-ups in a second table with the same labels."""
    from ..plans.layout import wrap

    labels = [_label(r) for r in variants]
    # A label longer than the room beside the numbers takes a line of its own.
    label_width = min(max([len("variant"), *map(len, labels)]), max(len("variant"), width - 3 - len(_COLUMNS[0])))
    rows = []
    for row, label in zip(variants, labels, strict=True):
        failed = not row["ok"] and row["error"] is not None
        mark = "*" if row["is_plan"] else " "
        head = f"{mark} {label:<{label_width}} "
        if len(head) > label_width + 3:
            head = f"{mark} {label}\n{'':<{label_width + 3}}"
        rows.append((head, None if failed else _measured(row), f"failed: {row['error']}" if failed else _ratios(row)))
    whole = len(f"  {'':<{label_width}} {_COLUMNS[0]}   {_SPEEDUP}") <= width
    lines = [f"  {'':<{label_width}} {_COLUMNS[0]}".rstrip(), f"  {'variant':<{label_width}} {_COLUMNS[1]}"]
    lines[-1] += f"   {_SPEEDUP}" if whole else ""
    for head, measured, ratios in rows:
        if measured is None:  # failed: its error in place of the numbers
            lines += _cell(head, ratios, width)
        else:
            lines.append(head + measured + (f"   {ratios}" if whole else ""))
    if not whole:
        lines += ["", *wrap(f"{_SPEEDUP} (variant time / plan time):", width, "  ")]
        lines += [
            line for head, measured, ratios in rows if measured is not None for line in _cell(head, ratios, width)
        ]
    return lines


def _cell(head: str, text: str, width: int) -> list[str]:
    """`head` then `text`, wrapped under `text`'s column (4 in, when that column leaves too little room)."""
    from ..plans.layout import wrap

    first, _, last = head.rpartition("\n")
    lead = [first] if first else []
    if len(last) + len(text) <= width:
        return [*lead, last + text]
    column = len(last) if width - len(last) >= 30 else 4
    body = wrap(text, width - column, hang=0)
    return [*lead, last + body[0], *(" " * column + line for line in body[1:])]


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
    for left_out in result.get("skipped") or []:
        lines.append(f"skipped {left_out['variant']}: {left_out['why']}")
    for row in result["variants"]:
        for phase, why in (row.get("time_boxed") or {}).items():
            lines.append(f"{row['name']}: {'load' if phase == 'load' else 'prefill/decode'} {why}")
    if result["workload"]["measured_rounds"] > 1:
        lines.append(_spread_line(result["variants"]))
    best = result["best"]
    plan_name = result["plan"]["variant"]
    verdicts = [f"{what} {name}{' (the plan)' if name == plan_name else ''}" for what, name in best.items() if name]
    lines.append("fastest: " + (", ".join(verdicts) or "nothing was measured"))
    if result.get("verdict") and result["mode"] != "quick":  # an older result has none; quick compares nothing
        lines.append(_verdict_line(result["verdict"]))
    return lines


_AGAINST_BARE = {"tie": "as fast as bare", "faster": "faster than bare", "slower": "slower than bare"}


def _verdict_line(verdict: dict[str, dict[str, str | None]]) -> str:
    """What the run concludes per metric (`bench.verdict`): the plan's place among the variants it could be,
    and against bare from_pretrained; a ratio within the tie margin in the middle half of the rounds is a tie."""
    cells = []
    for metric, said in verdict.items():
        if said["plan"] is None:
            continue
        place = "the plan is best" if said["plan"] == "best" else f"{said['plan']} beats the plan"
        against = _AGAINST_BARE.get(said["vs_bare"] or "")
        cells.append(f"{metric}: {place}" + (f", {against}" if against else ""))
    return f"verdict (each variant against the plan round by round; a tie within {TIE_MARGIN:.0%}): " + (
        "; ".join(cells) or "nothing was compared"
    )


def _spread_line(variants: list[dict[str, Any]]) -> str:
    """The worst run-to-run spread per phase, each a variant's own rounds compared with each other (max/min of
    the same variant, the same phase), naming that variant: how close to 1 a ratio must be to count as noise."""
    cells = []
    for what in ("load", "prefill", "decode"):
        rows = [r for r in variants if r["ok"] and r["spread"][what]]
        worst = max(rows, key=lambda r: r["spread"][what], default=None)
        cells.append(f"{what} {_fmt(worst['spread'][what], '.2f')}x ({worst['name']})" if worst else f"{what} -")
    return (
        "run-to-run spread (max/min of each variant's own measured rounds; the worst): "
        + ", ".join(cells)
        + ": ratios closer to 1 than that are noise"
    )


_GENERATION_COLUMNS = (  # two header lines, so that a row of numbers is 37 characters
    f"{'decode':>8} {'generate':>8} {'peak':>6} {'KV':>6} {'as':>5}",
    f"{'tok/s':>8} {'s':>8} {'MiB':>6} {'MiB':>6} {'alone':>5}",
)
_OVER_DEFAULT = "over default generate(): decode / generate / memory"


def format_generation(section: dict[str, Any], width: int | None = None) -> str:
    """The generation comparison as a table (from the result dict) laid out for `width` columns (None: the
    terminal's): the ratios over default generate() beside the numbers when a row fits, else in a table of their
    own with the same labels, as the variants' speed-ups are (issue 46: the rows ran to 140 columns)."""
    from ..plans.layout import terminal_width, wrap

    width = terminal_width(width)
    rows = section["variants"]
    labels = [row["name"] + (" (= default)" if row["is_plan"] and row["is_default"] else "") for row in rows]
    caches = [row["generate_kwargs"].get("cache_implementation", "default") for row in rows]
    cache_width = max([len("cache"), *map(len, caches)])
    # A label longer than the room beside the numbers takes a line of its own (as in the variants' table).
    room = width - len(_GENERATION_COLUMNS[0]) - (2 + 1 + cache_width + 1 + len("padding") + 1)
    label_width = min(max([len("variant"), *map(len, labels)]), max(len("variant"), room))
    lead = 2 + label_width + 1 + cache_width + 1 + len("padding") + 1
    whole = lead + len(_GENERATION_COLUMNS[0]) + 3 + len(_OVER_DEFAULT) <= width
    lines = wrap(
        f"generation: batch {section['batch']} (prompts of {min(section['prompt_lengths'])}-"
        f"{max(section['prompt_lengths'])} tokens, padded) + {section['new_tokens']} new tokens, greedy; "
        f"plan: {section['plan']['generate_kwargs'] or 'no generate() arguments'}, "
        f"padding {section['plan']['padding_side']}",
        width,
    )
    lines.append(f"{'':<{lead}}{_GENERATION_COLUMNS[0]}")
    lines.append(
        f"  {'variant':<{label_width}} {'cache':<{cache_width}} {'padding'} {_GENERATION_COLUMNS[1]}"
        + (f"   {_OVER_DEFAULT}" if whole else "")
    )
    ratios: list[tuple[str, str]] = []
    for row, label, cache in zip(rows, labels, caches, strict=True):
        head = f"{'*' if row['is_plan'] else ' '} {label:<{label_width}} "
        if len(label) > label_width:
            head = f"{head.rstrip()}\n{'':<{label_width + 3}}"
        start = f"{head}{cache:<{cache_width}} {row['padding_side']:<7} "
        if not row["ok"]:
            lines += _cell(start, f"failed: {row['error']}", width)
            continue
        peak = row["peak_memory_bytes"] / 2**20 if row["peak_memory_bytes"] else None
        kv = row["kv_cache_bytes"] / 2**20 if row["kv_cache_bytes"] is not None else None
        s = row["speedup_over_default"]
        over = f"{_fmt(s['decode'], '.2f')} / {_fmt(s['generate'], '.2f')} / {_fmt(row['memory_over_default'], '.2f')}"
        numbers = (
            f"{_fmt(row['decode_tokens_per_s'], '8.1f')} {_fmt(row['generate_s'], '8.3f')} {_fmt(peak, '6.0f')} "
            f"{_fmt(kv, '6.2f')} {str(row['matches_unpadded']) + '/' + str(row['sequences']):>5}"
        )
        lines.append(start + numbers + (f"   {over}" if whole else ""))
        ratios.append((head, over))
    if not whole and ratios:
        lines += [f"  {_OVER_DEFAULT}:", *(head + over for head, over in ratios)]
    # an older result has neither key: `get`
    stopped = [f"{row['name']}: {row['stopped']}" for row in rows if row.get("stopped")]
    for said in [section.get("shortened"), *stopped]:
        lines += wrap(said, width, "  ") if said else []
    lines += wrap(
        f"KV cache the plan estimates for batch x (longest prompt + new tokens - 1, what generate() keeps): "
        f"{section['kv_cache_bytes_planned'] / 2**20:.2f} MiB; 'as alone': {section['matches_unpadded']}",
        width,
        "  ",
    )
    return "\n".join(lines)
