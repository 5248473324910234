"""Run the examples in the docs, and paste their real outputs back.

    python tools/regenerate_docs.py README.md docs/index.md docs/decisions.md ...

Run it with the docs set installed (`DOCS_SET` below: the releases the README's Install resolves, so the
pages show what a user gets); it refuses to paste another set's outputs. In this project:
`HF_HUB_OFFLINE=1 PYTHONPATH=src .venv-newest/bin/python tools/regenerate_docs.py README.md docs/*.md`.

`tests/test_docs_examples.py` runs the same examples the same way and fails when a pasted output
differs from a real run, so an output in the docs is never typed by hand.

What counts as an example, in a page:
- a ```python block: run (in one Python process per call of this tool, each block in a fresh
  namespace, the working directory a scratch folder holding the tiny model `tiny-qwen3`). Its
  output block is a ```text block that follows it directly or with only an "Output..." paragraph
  between them; its stdout replaces that block.
- a ```python block whose first line is `# NAME.py ...`: not run, written to NAME.py in the scratch
  folder, for a later shell example to run (e.g. `$ torchrun ... NAME.py`).
- a ```text block whose first line is `$ COMMAND`: COMMAND is run with bash in the scratch folder;
  its output (stdout and stderr, as a terminal shows them) replaces the rest of the block. A
  command must exit 0 (show an expected failure with `; echo "exit status $?"`).
- an HTML comment right before an example's first block qualifies it:
  - `<!-- not run: WHY -->`: the block is not run (WHY is required);
  - `<!-- output: this machine -->`: the output depends on the machine that ran it (the CPU, its
    speed): it is regenerated, and the test checks that the example runs but does not compare;
  - `<!-- output: this machine; test: tests/FILE.py -->`: the same, but the docs test does not run
    it because tests/FILE.py runs the same code (used for the slow ones: a benchmark).
  - `<!-- output: docs set -->`: the output shows what the docs set's releases decide (which `kernels` the
    installed transformers accepts): on another dependency set the test runs it and compares nothing.
  Say in the page which machine such an output comes from.
Other blocks (```bash set-up steps, ```text without `$`, ```mermaid) are not examples.

Identical examples run once. When the test compares outputs, timings (`0.12s`, and floats with
six or more decimals, as `to_dict()` prints seconds) are masked: they differ from run to run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```([a-z]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*(not run|output)\s*:\s*(.*?)\s*-->\s*\Z", re.DOTALL)
SCRIPT = re.compile(r"#\s*(\w[\w.-]*\.py)\b")
TINY_MODEL = "tiny-qwen3"

# The dependency set the pasted outputs come from: what the README's Install resolves (the wheel without a
# constraints file: the newest releases on 2026-12-04, docs/versions.md's right-hand column, the set .ci/run's
# second suite installs), so a page shows what a user gets. The versions an output prints and the names
# transformers 5.23 renamed (`activation_checkpointing`) are this set's; tests/test_docs_examples.py compares the
# outputs exactly where this set is installed and line by line (`shape`) on another (the pinned constraints/tested.txt).
DOCS_SET = {
    "transformers": "5.25.0",
    "kernels": "0.19.1",
    "accelerate": "1.16.0",
    "peft": "0.21.2",
    "bitsandbytes": "0.50.2",
    "huggingface_hub": "2.4.0",
}


@dataclass(frozen=True)
class Example:
    """One runnable example of a page: `kind` is "python", "file" or "shell"."""

    page: str
    line: int
    kind: str
    code: str
    output: str | None = None
    """The output pasted in the page (None: the example shows none)."""
    output_span: tuple[int, int] | None = None
    """Where the output's text starts and ends in the page."""
    this_machine: bool = False
    """The output depends on the machine that ran it: regenerated, never compared."""
    covered_by: str | None = None
    """A test file that runs the same code: the docs test does not run this example."""
    docs_set: bool = False
    """The output is the docs set's decision: compared only where the docs set is installed."""


@dataclass(frozen=True)
class Skipped:
    """A block marked `<!-- not run: WHY -->`."""

    page: str
    line: int
    why: str


@dataclass(frozen=True)
class Result:
    output: str
    ok: bool
    error: str = ""
    seconds: float = 0.0


def _marker(text: str, start: int) -> tuple[str, str] | None:
    found = MARKER.search(text[:start].rstrip() + "\n", max(0, start - 300))
    return (found.group(1), found.group(2)) if found else None


def examples(page: Path) -> tuple[list[Example], list[Skipped]]:
    """The examples of a page, in order, and the blocks it marks as not run."""
    text = page.read_text()
    name = str(page.resolve().relative_to(ROOT))
    found: list[Example] = []
    skipped: list[Skipped] = []
    fences = list(FENCE.finditer(text))
    used_as_output: set[int] = set()
    for i, fence in enumerate(fences):
        if i in used_as_output:
            continue
        kind, body = fence.group(1), fence.group(2)
        line = text.count("\n", 0, fence.start()) + 1
        marker = _marker(text, fence.start())
        if marker and marker[0] == "not run":
            if not marker[1]:
                raise ValueError(f"{name}:{line}: '<!-- not run: WHY -->' needs a reason")
            skipped.append(Skipped(name, line, marker[1]))
            continue
        this_machine, covered_by, docs_set = False, None, False
        if marker is not None and marker[1] == "docs set":
            docs_set = True
        elif marker is not None:
            qualifier = re.fullmatch(r"this machine(?:;\s*test:\s*(\S+))?", marker[1])
            if qualifier is None:
                raise ValueError(f"{name}:{line}: unknown qualifier <!-- output: {marker[1]} -->")
            this_machine, covered_by = True, qualifier.group(1)
        if kind == "text" and body.startswith("$ "):
            command, _, output = body.partition("\n")
            span = (fence.start(2) + len(command) + 1, fence.end(2))
            found.append(Example(name, line, "shell", command[2:], output, span, this_machine, covered_by, docs_set))
        elif kind == "python" and SCRIPT.match(body):
            found.append(Example(name, line, "file", body))
        elif kind == "python":
            output: str | None = None
            span = None
            if i + 1 < len(fences) and fences[i + 1].group(1) == "text":
                following = fences[i + 1]
                between = text[fence.end() : following.start()].strip()
                if (not between or (between.startswith("Output") and "\n\n" not in between)) and not (
                    following.group(2).startswith("$ ")
                ):
                    output, span = following.group(2), (following.start(2), following.end(2))
                    used_as_output.add(i + 1)
            found.append(Example(name, line, "python", body, output, span, this_machine, covered_by, docs_set))
    return found, skipped


def other_than_docs_set() -> list[str]:
    """The packages of `DOCS_SET` installed here at another version (empty: this is the docs set)."""
    from importlib.metadata import PackageNotFoundError, version

    differ = []
    for name, wanted in DOCS_SET.items():
        try:
            found: str | None = version(name)
        except PackageNotFoundError:
            found = None
        if found != wanted:
            differ.append(f"{name} {found or 'not installed'} (docs set: {wanted})")
    return differ


def _environment() -> dict[str, str]:
    # The examples run in a scratch folder: a relative PYTHONPATH (`PYTHONPATH=src`) would name nothing there,
    # and the examples would import another copy of cudaload (an editable install's) without a word.
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        **os.environ,
        **({"PYTHONPATH": os.pathsep.join(paths)} if paths else {}),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TQDM_DISABLE": "1",
        "PYTHONHASHSEED": "0",
        # cudaload lays its text out for the terminal (COLUMNS first): the pasted outputs are 80 columns wide,
        # whatever terminal ran this tool, which is about what an output block shows on a laptop screen.
        "COLUMNS": "80",
        # `cudaload` and `python` in shell examples are this interpreter's, activated or not.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }


def _worker(spec_path: str, results_path: str) -> None:
    """Run the examples listed in `spec_path` here (cwd: the scratch folder); write their results."""
    items = json.loads(Path(spec_path).read_text())
    if any(TINY_MODEL in item["code"] for item in items):
        code = f"from cudaload.demo import build_tiny_model; build_tiny_model({TINY_MODEL!r})"
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    if any(item["kind"] == "python" for item in items):
        # Imported once here; each example then runs in a forked child, so it sees a fresh process
        # (no state left by an earlier example) without paying the imports again. Nothing here has
        # run a torch op yet, so no thread pool is forked.
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import cudaload  # noqa: F401
    results: list[Result] = []
    seen: dict[tuple[str, str], Result] = {}
    for item in items:
        kind, code, where = item["kind"], item["code"], f"{item['page']}:{item['line']}"
        if (kind, code) in seen:
            results.append(seen[kind, code])
            continue
        start = time.perf_counter()
        if kind == "file":
            script = SCRIPT.match(code)
            assert script is not None
            Path(script.group(1)).write_text(code)
            results.append(Result("", True, seconds=time.perf_counter() - start))
        elif kind == "shell":
            done = subprocess.run(
                ["bash", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
            )
            output = done.stdout if done.stdout.endswith("\n") else done.stdout + "\n"
            results.append(
                Result(output, done.returncode == 0, f"exit status {done.returncode}", time.perf_counter() - start)
            )
        else:
            results.append(replace(_run_forked(code, where), seconds=time.perf_counter() - start))
        seen[kind, code] = results[-1]
    Path(results_path).write_text(json.dumps([asdict(r) for r in results]))


def _run_forked(code: str, where: str) -> Result:
    """Run Python `code` in a forked child (a fresh process state); its stdout and outcome."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as report:
        pid = os.fork()
        if pid == 0:  # the child
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    exec(compile(code, where, "exec"), {"__name__": "__main__"})
            except BaseException:  # an example that raises (or exits) is a failed example
                result = Result(out.getvalue(), False, traceback.format_exc()[-3000:] + err.getvalue()[-2000:])
            else:
                result = Result(out.getvalue(), True)
            Path(report.name).write_text(json.dumps(asdict(result)))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        text = Path(report.name).read_text()
        if not text:
            return Result("", False, f"the example's process died (wait status {status})")
        return Result(**json.loads(text))


def comparable(output: str) -> str:
    """`output` with its timings masked (they differ from run to run)."""
    output = re.sub(r"\b\d+\.\d+s\b", "<seconds>", output)
    return re.sub(r"\b\d+\.\d{6,}(e-?\d+)?\b", "<seconds>", output)


def run(found: list[Example], scratch: Path | None = None) -> list[Result]:
    """Run `found` in order, in one worker process, in `scratch` (default: a new temporary folder)."""
    with contextlib.ExitStack() as stack:
        if scratch is None:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cudaload-docs-")))
        spec, results = scratch / ".examples.json", scratch / ".results.json"
        spec.write_text(json.dumps([asdict(e) for e in found]))
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec), str(results)],
            cwd=scratch,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the examples' worker failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return [Result(**r) for r in json.loads(results.read_text())]


def regenerate(pages: list[Path]) -> None:
    """Run every example of `pages` and write the real outputs into the pages."""
    per_page = {page: examples(page)[0] for page in pages}
    everything = [e for found in per_page.values() for e in found]
    results = iter(run(everything))
    for page, found in per_page.items():
        text = page.read_text()
        edits: list[tuple[tuple[int, int], str]] = []
        for example in found:
            result = next(results)
            if not result.ok:
                raise RuntimeError(f"{example.page}:{example.line} failed:\n{result.error}\n{result.output}")
            if example.output_span is not None:
                edits.append((example.output_span, result.output))
        for (start, end), output in sorted(edits, reverse=True):
            text = text[:start] + output + text[end:]
        page.write_text(text)
        print(f"regenerated {page.relative_to(ROOT)}", file=sys.stderr)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if differ := other_than_docs_set():
        sys.exit(
            f"regenerate_docs: {sys.executable} has {', '.join(differ)}: the pages show the docs set's outputs "
            "(DOCS_SET in this file, what the README's Install resolves). Run this tool with a Python that has the "
            "docs set installed, or, when a newer set is what users get now, update DOCS_SET and the README's and "
            "docs/versions.md's versions with it."
        )
    regenerate([Path(name).resolve() for name in sys.argv[1:]])


if __name__ == "__main__":
    main()
