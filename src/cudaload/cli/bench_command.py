"""`cudaload bench`: runs the inference or fine-tuning benchmark, prints its table, and files the JSON
(and PNG) where asked."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..announce import fitted
from ..errors import MissingPackageError
from .output import OutputClosed, emit

__all__ = ["bench_command"]


def _failed(model: str, variants: list[dict[str, Any]], finetune: bool) -> str | None:
    """The error line when no variant of a benchmark ran at all (a broken checkpoint), else None."""
    if any(row.get("ok", row.get("error") is None) for row in variants):
        return None
    reasons = [row["error"] for row in variants if row.get("error")]
    found = reasons[0] if reasons else "nothing was measured"
    kind = "fine-tuning benchmark" if finetune else "benchmark"
    return (
        f"no variant of {model} could run in the {kind} ({found}). The table above lists each failure: check "
        "the checkpoint (re-save it with save_pretrained(), or pass --random-weights to time its shape)."
    )


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before minutes of measuring, what could only fail after them: an --out or --chart that
    is a folder or a device (/dev/full) or lies in a folder that is missing or not writable, and --save
    with --quick (a smoke test's one short round is not a measurement to plan with)."""
    import os
    from pathlib import Path

    from ..errors import SettingError

    if args.save and args.quick:
        raise SettingError(
            "--save with --quick: a smoke test (one short round) would be stored as this model's tuning record "
            "and steer later plans. Drop --quick to save a full measurement, or --save to keep the smoke test."
        )
    for flag, value in (("--out", args.out), ("--chart", args.chart)):
        if not value:
            continue
        path = Path(value)
        if path.exists() and not path.is_file():
            kind = "a folder" if path.is_dir() else "not a regular file (a device or a pipe)"
            raise SettingError(
                f"{flag} {value}: that is {kind}, so the result could not be written there. Name a file."
            )
        folder = path.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise SettingError(
                f"{flag} {value}: the folder {str(folder)!r} is missing or not writable, so the result could not be "
                "written after the run. Name a file in a folder you can write."
            )


def _can_draw() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def bench_command(args: argparse.Namespace) -> int:
    """`cudaload bench`: run, print the table, then file JSON (and PNG) where asked. Exit 130 after
    Ctrl-C (with what was measured), 2 when no variant could run at all."""
    import tempfile
    from pathlib import Path

    _check_outputs(args)

    from ..bench import format_report, result_path, run_bench, write_chart, write_result

    progress = sys.stderr.isatty()

    def log(line: str) -> None:
        line = fitted(f"[bench] {line}")  # fits the terminal as every other line does (issue 46)
        if not progress:
            emit(line, sys.stderr)
            return
        # A progress bar is drawn on stderr: write above it (tqdm clears and redraws it), never into it
        # ("1.80s/step][" then "bench] 31.1s" on the next line).
        from tqdm import tqdm

        try:
            tqdm.write(line, file=sys.stderr)
        except BrokenPipeError as exc:
            raise OutputClosed(sys.stderr) from exc

    if args.chart:  # before the run: a missing matplotlib is said now, not after minutes of measuring
        from ..bench.chart import check_chart

        check_chart(args.chart)
    kind = ""
    if "torch" not in sys.modules:  # seconds of CPU before the first phase line, 5-8 s on a busy machine
        log("importing torch and transformers (a few seconds)")
    if args.finetune:
        from ..bench.finetune_bench import run_finetune_bench
        from ..bench.finetune_report import format_finetune_report
        from ..bench.models import resolve_model

        with tempfile.TemporaryDirectory(prefix="cudaload-bench-") as tmp:
            model = resolve_model(
                args.model, Path(args.model_dir or tmp), quick=args.quick, random_weights=args.random_weights
            )
            result = run_finetune_bench(
                model.path,
                steps=args.steps,
                seq_len=args.seq_len,
                batch_size=args.batch or 1,
                quick=args.quick,
                threads=args.threads,
                log=log,
            )
        kind, report = "finetune", format_finetune_report(result)
    else:
        result = run_bench(
            args.model,
            quick=args.quick,
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            batch=args.batch,
            repeats=args.repeats,
            threads=args.threads,
            generation=args.generation,
            generation_batch=args.generation_batch,
            random_weights=args.random_weights,
            model_dir=args.model_dir,
            save=args.save,
            overhead=args.overhead,
            progress=progress,
            log=log,
            all_variants=args.all_variants,
        )
        report = format_report(result)  # laid out for this terminal
    emit(report)  # first: a file that cannot be written below does not lose the measurements
    if args.out:
        emit(f"written: {write_result(result, args.out)}")
        if (
            not args.chart and _can_draw() and Path(args.out).suffix != ".png"
        ):  # the clearest view of a run: beside its JSON, where it can be drawn
            emit(f"written: {write_chart(result, Path(args.out).with_suffix('.png'))}")
    if args.results:
        from ..capability import detect

        filed = result_path(args.results, detect(), kind)
        emit(f"written: {write_result(result, filed)}")
        if not args.chart:  # the chart beside the JSON, when matplotlib is there to draw it
            try:
                emit(f"written: {write_chart(result, filed.with_suffix('.png'))}")
            except MissingPackageError as exc:
                emit(f"no chart: {exc}")
    if args.chart:
        emit(f"written: {write_chart(result, args.chart)}")
    if not (args.out or args.results or args.chart):  # the report's last line: where its record could be
        emit("not kept: --out FILE.json keeps this result, --chart FILE.png draws it (--results DIR files both)")
    if result.get("interrupted"):
        return 130
    failed = _failed(args.model or "the default model", result["variants"], finetune=bool(args.finetune))
    if failed is not None:
        emit(f"cudaload: error: {failed}", sys.stderr)
        return 2
    return 0
