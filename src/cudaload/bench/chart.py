"""A benchmark result as a PNG. Inference: one panel per metric, a bar per variant, the plan's bar
highlighted. Fine-tuning: step time, and peak memory measured beside the plan's estimate. Needs
matplotlib (`pip install "cudaload[bench]"`); drawn from the result dict, so a saved JSON file can
be charted again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import MissingPackageError

__all__ = ["write_chart"]

# (result key, panel title, lower is better)
_PANELS = (
    ("load_s", "load (s)", True),
    ("prefill_s", "prefill (s)", True),
    ("decode_tokens_per_s", "decode (tokens/s)", False),
    ("end_to_end_s", "end to end (s)", True),
    ("peak_memory_bytes", "peak memory (MiB)", True),
)
PLAN_COLOUR = "#d62728"
BARE_COLOUR = "#7f7f7f"
OTHER_COLOUR = "#1f77b4"
MiB = 2**20


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingPackageError(
            'Charts need matplotlib, which is not installed: pip install "cudaload[bench]" (or matplotlib).'
        ) from exc
    matplotlib.use("Agg", force=False)  # files only; never a window
    from matplotlib import pyplot

    return pyplot


def _where(machine: dict[str, Any]) -> str:
    cpu = machine["cpu"]
    return ", ".join(g["name"] for g in machine["gpus"]) or f"{cpu['model']} ({cpu['cores']} cores)"


def _save(pyplot: Any, figure: Any, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    pyplot.close(figure)
    return target


def write_chart(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw `result` (from `run_bench` or `run_finetune_bench`) into the PNG file `path`; returns the path."""
    if result.get("benchmark") == "cudaload.bench.finetune":
        return _finetune_chart(result, path)
    pyplot = _pyplot()
    rows = [r for r in result["variants"] if r["ok"]]
    if not rows:
        raise ValueError("no variant ran: nothing to chart")
    names = [r["name"] + (" (plan)" if r["is_plan"] else "") for r in rows]
    colours = [PLAN_COLOUR if r["is_plan"] else BARE_COLOUR if r["is_bare"] else OTHER_COLOUR for r in rows]
    figure, axes = pyplot.subplots(1, len(_PANELS), figsize=(4 * len(_PANELS), 0.45 * len(rows) + 2.2), sharey=True)
    for axis, (key, title, lower_better) in zip(axes, _PANELS, strict=True):
        values = [(r[key] or 0) / (2**20 if key.endswith("bytes") else 1) for r in rows]
        axis.barh(range(len(rows)), values, color=colours)
        axis.set_title(title + (" - lower is better" if lower_better else " - higher is better"), fontsize=9)
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
        for y, value in enumerate(values):
            axis.text(value, y, f" {value:.3g}", va="center", fontsize=7)
    axes[0].set_yticks(range(len(rows)), names, fontsize=8)
    model, work, where = result["model"], result["workload"], _where(result["machine"])
    figure.suptitle(
        f"cudaload bench {result['date'][:10]}: {model['name']} ({model['parameters'] / 1e6:.0f}M params), "
        f"batch {work['batch']} x {work['prompt_tokens']} + {work['new_tokens']} tokens, median of "
        f"{work['measured_rounds']}; {where}; plan in red, bare from_pretrained in grey",
        fontsize=9,
    )
    figure.tight_layout()
    return _save(pyplot, figure, path)


def _finetune_chart(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Step time per variant; peak (total) and step memory, measured bar beside the estimate's."""
    pyplot = _pyplot()
    rows = [r for r in result["variants"] if r.get("error") is None]
    if not rows:
        raise ValueError("no variant ran: nothing to chart")
    names = [r["name"] for r in rows]
    figure, axes = pyplot.subplots(1, 3, figsize=(13, 0.6 * len(rows) + 2.4), sharey=True)
    times = [r["step_time"]["median_s"] for r in rows]
    axes[0].barh(range(len(rows)), times, color=OTHER_COLOUR)
    axes[0].set_title("step time (s) - lower is better", fontsize=9)
    for y, value in enumerate(times):
        axes[0].text(value, y, f" {value:.3g}", va="center", fontsize=7)
    for axis, part, title in ((axes[1], "total", "peak memory (MiB)"), (axes[2], "step", "step memory (MiB)")):
        measured = [r["memory"][part]["bytes"] / MiB for r in rows]
        estimated = [(r["memory"][part]["estimate_bytes"] or 0) / MiB for r in rows]
        ys = range(len(rows))
        axis.barh([y - 0.2 for y in ys], measured, height=0.4, color=OTHER_COLOUR, label="measured")
        axis.barh([y + 0.2 for y in ys], estimated, height=0.4, color=PLAN_COLOUR, label="plan's estimate")
        for y, (m, e) in enumerate(zip(measured, estimated, strict=True)):
            axis.text(m, y - 0.2, f" {m:.3g}", va="center", fontsize=7)
            axis.text(e, y + 0.2, f" {e:.3g}", va="center", fontsize=7)
        axis.set_title(title + ": measured vs estimate", fontsize=9)
        axis.set_xlim(0, max(measured + estimated) * 1.2)
    for axis in axes:
        axis.grid(axis="x", alpha=0.3)
    axes[0].invert_yaxis()
    axes[0].set_yticks(range(len(rows)), names, fontsize=8)
    model, work = result["model"], result["workload"]
    size = f"{model['parameters'] / 1e6:.0f}M params" if model.get("parameters") else "?"
    figure.suptitle(
        f"cudaload bench --finetune {result['date'][:10]}: {model.get('architecture') or 'model'} ({size}), "
        f"seq_len {work['seq_len']} x batch {work['batch_size']}, {work['statistic']}; {_where(result['machine'])}",
        fontsize=9,
    )
    figure.legend(*axes[1].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(pyplot, figure, path)
