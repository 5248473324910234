"""A benchmark result as a PNG, sized to stay readable in a documentation page's ~700-pixel column.

Inference: one panel per metric in a grid three panels wide, a horizontal bar per variant (names on
the left of each row), the plan's bar in red and its name in bold, bare `from_pretrained` in grey.
Fine-tuning: step time, and peak memory measured beside the plan's estimate. Both figures are about
10 inches wide with 10-12 pt text, saved at 150 dpi (1500 pixels wide), so the text still reads at
half size. Needs matplotlib (`pip install matplotlib`); drawn from the result dict, so a
saved JSON file can be charted again."""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import MissingPackageError
from ..facts.packages import install_hint

__all__ = ["write_chart"]

# (result key, panel title, lower is better)
_PANELS = (
    ("load_s", "load (s)", True),
    ("prefill_s", "prefill (s)", True),
    ("decode_tokens_per_s", "decode (tokens/s)", False),
    ("end_to_end_s", "end to end (s)", True),
    ("peak_memory_bytes", "peak memory", True),
)
PLAN_COLOUR = "#d62728"
BARE_COLOUR = "#7f7f7f"
OTHER_COLOUR = "#1f77b4"
MiB = 2**20
GiB = 2**30

WIDTH_IN = 10.0
"""Both charts' width: shown in a ~700-pixel column, 1 pt of text is about 1 pixel there."""
FINETUNE_WIDTH_IN = 9.0
DPI = 150
COLUMNS = 3
"""Inference panels per row."""
TITLE_PT, LABEL_PT, VALUE_PT, CAPTION_PT = 12, 11, 10, 11


def check_chart(path: str) -> None:
    """Raise MissingPackageError now when matplotlib is missing: `bench --chart PATH` says so before the
    run, not after minutes of measuring."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise MissingPackageError(
            f"--chart {path} draws with matplotlib, which is not installed: {install_hint('matplotlib')} "
            "(or drop --chart; --out keeps the result as JSON to draw later)."
        )


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingPackageError(
            f"Charts need matplotlib, which is not installed: {install_hint('matplotlib')}."
        ) from exc
    matplotlib.use("Agg", force=False)  # files only; never a window
    from matplotlib import pyplot

    return pyplot


def _where(machine: dict[str, Any]) -> str:
    cpu = machine["cpu"]
    gpus = Counter(g["name"] for g in machine["gpus"])
    if not gpus:
        return f"{cpu['model']} ({cpu['cores']} cores)"
    return ", ".join(name if count == 1 else f"{count} x {name}" for name, count in gpus.items())


def _versions(result: dict[str, Any], packages: tuple[str, ...]) -> str:
    versions = result.get("versions") or {}
    return ", ".join(f"{name} {versions[name]}" for name in packages if versions.get(name))


def _caption(width_in: float, *parts: str) -> str:
    """The figure's title: each part on its own lines, wrapped well inside the figure's width
    (a character of CAPTION_PT text is about 0.55 em wide)."""
    chars = int(width_in * 72 / (0.55 * CAPTION_PT) * 0.9)
    return "\n".join(textwrap.fill(part, chars) for part in parts if part)


def _params(count: float | None) -> str:
    if not count:
        return "? params"
    return f"{count / 1e9:.3g}B params" if count >= 1e9 else f"{count / 1e6:.0f}M params"


def _memory_unit(largest_bytes: float) -> tuple[int, str]:
    """MiB, or GiB once the numbers would need five digits."""
    return (GiB, "GiB") if largest_bytes >= 10 * GiB else (MiB, "MiB")


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _height_of(caption: str) -> float:
    """Inches the caption takes at the top of a figure."""
    return (caption.count("\n") + 1) * CAPTION_PT * 1.3 / 72 + 0.15


def _value_labels(axis: Any, ys: Sequence[float], values: Sequence[float | None], limit: float) -> None:
    """Each bar's value at its end (n/a where none was measured); room on the right for the text."""
    for y, value in zip(ys, values, strict=True):
        axis.text(value or 0, y, f" {_number(value)}" if value is not None else " n/a", va="center", fontsize=VALUE_PT)
    axis.set_xlim(0, (limit or 1) * 1.3)


def _style(axis: Any, title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_title(title, fontsize=TITLE_PT)
    axis.grid(axis="x", alpha=0.3)
    axis.set_axisbelow(True)
    axis.xaxis.set_major_locator(MaxNLocator(nbins=4))
    axis.tick_params(axis="x", labelsize=VALUE_PT)
    axis.spines[["top", "right"]].set_visible(False)


def _save(pyplot: Any, figure: Any, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=DPI)
    pyplot.close(figure)
    return target


def write_chart(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw `result` (from `run_bench` or `run_finetune_bench`) into the PNG file `path`; returns the path."""
    if result.get("benchmark") == "cudaload.bench.finetune":
        return _finetune_chart(result, path)
    pyplot = _pyplot()
    from matplotlib.patches import Patch

    rows = [r for r in result["variants"] if r["ok"]]
    if not rows:
        raise ValueError("no variant ran: nothing to chart")
    names = [r["name"] + (" (plan)" if r["is_plan"] else "") for r in rows]
    colours = [PLAN_COLOUR if r["is_plan"] else BARE_COLOUR if r["is_bare"] else OTHER_COLOUR for r in rows]
    ys = list(range(len(rows)))
    model, work = result["model"], result["workload"]
    caption = _caption(
        WIDTH_IN,
        f"cudaload bench {result['date'][:10]}: {model['name']}, {_params(model.get('parameters'))}",
        f"batch {work['batch']} x {work['prompt_tokens']} + {work['new_tokens']} tokens, "
        f"median of {work['measured_rounds']}; {_where(result['machine'])}",
        _versions(result, ("torch", "transformers", "cudaload")),
    )
    grid_rows = -(-len(_PANELS) // COLUMNS)
    panel_height = 0.3 * len(rows) + 1.1  # the bars, the two-line title and the x axis
    figure, axes = pyplot.subplots(
        grid_rows,
        COLUMNS,
        figsize=(WIDTH_IN, grid_rows * panel_height + _height_of(caption)),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    cells = list(axes.flat)
    for axis, (key, title, lower_better) in zip(cells, _PANELS, strict=False):
        scale, unit = 1, ""
        if key.endswith("bytes"):
            scale, unit = _memory_unit(max(r[key] or 0 for r in rows))
            title = f"{title} ({unit})"
        values = [r[key] / scale if r[key] is not None else None for r in rows]
        axis.barh(ys, [v or 0 for v in values], color=colours)
        _style(axis, f"{title}\n{'lower' if lower_better else 'higher'} is better")
        _value_labels(axis, ys, values, max(v or 0 for v in values))
    axes[0, 0].invert_yaxis()  # shared: the first variant on top in every panel
    for line in axes[:, 0]:
        line.set_yticks(ys, names, fontsize=LABEL_PT)
        for label, row in zip(line.get_yticklabels(), rows, strict=True):
            if row["is_plan"]:
                label.set_fontweight("bold")
                label.set_color(PLAN_COLOUR)
    for spare in cells[len(_PANELS) :]:  # the grid's empty cell holds the key
        spare.axis("off")
        spare.legend(
            handles=[
                Patch(color=PLAN_COLOUR, label="the plan"),
                Patch(color=OTHER_COLOUR, label="other variants"),
                Patch(color=BARE_COLOUR, label="bare from_pretrained"),
            ],
            loc="center",
            fontsize=LABEL_PT,
            frameon=False,
        )
    figure.suptitle(caption, fontsize=CAPTION_PT)
    return _save(pyplot, figure, path)


def _finetune_chart(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Step time per variant; peak (total) and step memory, measured bar beside the estimate's."""
    pyplot = _pyplot()
    rows = [r for r in result["variants"] if r.get("error") is None]
    if not rows:
        raise ValueError("no variant ran: nothing to chart")
    names = [r["name"] for r in rows]
    ys = list(range(len(rows)))
    model, work = result["model"], result["workload"]
    architecture = model.get("architecture") or "model"
    caption = _caption(
        FINETUNE_WIDTH_IN,
        f"cudaload bench --finetune {result['date'][:10]}: {architecture} ({_params(model.get('parameters'))}), "
        f"seq_len {work['seq_len']} x batch {work['batch_size']}",
        f"{work['statistic']}; {_where(result['machine'])}",
        _versions(result, ("torch", "transformers", "peft", "bitsandbytes", "cudaload")),
    )
    height = 0.75 * len(rows) + 1.6 + _height_of(caption)  # the bars, titles, x axis and legend
    figure, axes = pyplot.subplots(1, 3, figsize=(FINETUNE_WIDTH_IN, height), sharey=True, layout="constrained")
    times = [r["step_time"]["median_s"] for r in rows]
    axes[0].barh(ys, times, height=0.6, color=OTHER_COLOUR)
    _style(axes[0], "step time (s)\nlower is better")
    _value_labels(axes[0], ys, times, max(times))
    for axis, part, title in ((axes[1], "total", "peak memory"), (axes[2], "step", "step memory")):
        estimates = [r["memory"][part]["estimate_bytes"] for r in rows]
        scale, unit = _memory_unit(max([r["memory"][part]["bytes"] for r in rows] + [e or 0 for e in estimates]))
        measured: list[float | None] = [r["memory"][part]["bytes"] / scale for r in rows]
        estimated = [e / scale if e is not None else None for e in estimates]
        limit = max(v or 0 for v in measured + estimated)
        for offset, values, colour, label in (
            (-0.2, measured, OTHER_COLOUR, "measured"),
            (0.2, estimated, PLAN_COLOUR, "plan's estimate"),
        ):
            at = [y + offset for y in ys]
            axis.barh(at, [v or 0 for v in values], height=0.4, color=colour, label=label)
            _value_labels(axis, at, values, limit)
        _style(axis, f"{title} ({unit})\nmeasured vs estimate")
    axes[0].invert_yaxis()
    axes[0].set_yticks(ys, names, fontsize=LABEL_PT)
    figure.suptitle(caption, fontsize=CAPTION_PT)
    figure.legend(*axes[1].get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=LABEL_PT)
    return _save(pyplot, figure, path)
