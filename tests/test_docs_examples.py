"""Every example in README.md and docs/ runs as written (offline, on this CPU, with a tiny model), and
every output pasted in the docs is what a real run prints.

The examples and how they run are defined once, in tools/regenerate_docs.py: the tool writes the
outputs into the pages, this test runs the same examples the same way and compares.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("regenerate_docs", ROOT / "tools" / "regenerate_docs.py")
assert _spec is not None and _spec.loader is not None
docs_tool: Any = importlib.util.module_from_spec(_spec)
sys.modules["regenerate_docs"] = docs_tool
_spec.loader.exec_module(docs_tool)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOUND = {page: docs_tool.examples(page) for page in PAGES}
EXAMPLES = [e for examples, _ in FOUND.values() for e in examples]
SKIPPED = [s for _, skipped in FOUND.values() for s in skipped]
RUN_HERE = [e for e in EXAMPLES if e.covered_by is None]


# The pasted outputs are the docs set's (tools/regenerate_docs.py DOCS_SET: what the README's Install resolves). On
# another set (the pinned constraints/tested.txt) a simulated machine plans with the installed transformers (its
# kernels range, its flag names, the versions it lists), so the outputs differ there by design.
OTHER_SET = docs_tool.other_than_docs_set()


_MASKS = (
    (re.compile(r"\b(?:bfloat16|float16|float32|bf16|fp16|fp32)\b"), "<dtype>"),
    # How a CPU dtype decision's reason opens is what the CPU measured: "bf16 1.6x faster than fp32",
    # "tie: ...", or, with a bench record or the probe off, "fastest measured here" / "not measured here".
    # A probe other processes disturbed is not believed: "not measured reliably: ...", "not measured: ...".
    (re.compile(r"^(?:tie:|fastest measured here|not measured here|not measured reliably:|not measured:)"), "<dtype>"),
    (re.compile(r"\d+(?:\.\d+)?"), "N"),
    (re.compile(r"\b(?:True|False|true|false)\b"), "<bool>"),
)


# What the CPU dtype probe announces depends on the machine's load when the example runs, not on the example: it
# measures (or not: another example's record of the same shape is in the run's cache) and, beside other processes
# (the suite's other worker), says it was disturbed (planner/planning.py) before the plan keeps the checkpoint's dtype.
_PROBE_SAYS = re.compile(r"^cudaload: (?:measuring this CPU's dtypes|the CPU dtype probe for .* was disturbed)")


def shape(output: str) -> list[str]:
    """What an output of "this machine" keeps from one machine to another: its lines, in order, each
    with its indentation and its first word (a setting, a section, a label), and a printed value
    (a line starting with [, ( or {) whole, so its keys and its strings count; in every line the
    numbers, the dtype names and the booleans are masked (what the CPU measured decides those).
    A line that continues the one above (cudaload wraps its text for the terminal, hanging 6 or more in:
    a reason, a long value) is left out: how a measured reason wraps depends on its numbers, and so is what
    the dtype probe announces (`_PROBE_SAYS`)."""
    lines = []
    for line in output.splitlines():
        if _PROBE_SAYS.match(line):
            continue
        for pattern, mask in _MASKS:
            line = pattern.sub(mask, line)
        text = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if len(indent) >= 6 and not text.startswith(("x ", '"', "[", "]", "{", "}")):
            continue
        lines.append(indent + (text if text[:1] in "[({" else text.split(" ", 1)[0]) if text else "")
    return lines


# transformers 5.23 renamed gradient checkpointing (TrainingArguments' flags, the model's switch): the docs set
# prints the new names, the pinned set the old ones (capability/transformers_api.py: checkpointing_method).
_RENAMES = (("activation_checkpointing", "gradient_checkpointing"),)


def _renames(output: str) -> str:
    for new, old in _RENAMES:
        output = output.replace(new, old)
    return output


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    """Run every example once, in one worker (one import of torch and transformers for all)."""
    ran = docs_tool.run(RUN_HERE, tmp_path_factory.mktemp("docs-examples"))
    return dict(zip(RUN_HERE, ran, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("example", RUN_HERE, ids=[f"{e.page}:{e.line}" for e in RUN_HERE])
def test_example_runs_and_prints_what_the_page_shows(example: Any, results: dict[Any, Any]) -> None:
    result = results[example]
    assert result.ok, f"{example.page}:{example.line} failed ({example.kind}):\n{result.error}\n{result.output[-2000:]}"
    if example.output is None or (OTHER_SET and example.docs_set):
        return  # ran; its output is the docs set's decision (`<!-- output: docs set -->`)
    if example.this_machine:
        # Regenerated on the machine the page names: its CPU, its timings and what it measured differ
        # from this one's, but not what the example prints: the same lines, each with the same label,
        # and printed values (dicts, lists, tuples) with the same keys (see `shape`).
        if _cuda_visible():
            pytest.skip("ran; the pasted output is a CPU-only machine's, and this machine has a CUDA GPU")
        pasted, real = shape(_renames(example.output)), shape(_renames(result.output))
        assert real == pasted, (
            f"{example.page}:{example.line}: a real run prints other lines than the page shows (numbers and dtypes "
            "masked, each line cut to its first word); run `python tools/regenerate_docs.py "
            f"{example.page}` and review the diff:\n"
            + "\n".join(difflib.unified_diff(pasted, real, "page", "real run", lineterm=""))
        )
        return
    if OTHER_SET:
        # The pasted output is the docs set's: on another set (the pinned releases) the versions it prints and
        # the names transformers renamed differ by design, so the lines are compared as `shape` sees them, with
        # those names normalised: what the example prints must still be the same lines, labels and keys.
        pasted, real = shape(_renames(example.output)), shape(_renames(result.output))
        assert real == pasted, (
            f"{example.page}:{example.line}: on {', '.join(OTHER_SET)} a real run prints other lines than the page "
            "shows (numbers, versions and dtypes masked, each line cut to its first word):\n"
            + "\n".join(difflib.unified_diff(pasted, real, "page", "real run", lineterm=""))
        )
        return
    pasted, real = docs_tool.comparable(example.output), docs_tool.comparable(result.output)
    assert real == pasted, (
        f"{example.page}:{example.line}: the output pasted in the page is not what a real run prints; run "
        f"`python tools/regenerate_docs.py {example.page}` and review the diff:\n"
        + "".join(difflib.unified_diff(pasted.splitlines(True), real.splitlines(True), "page", "real run"))
    )


def test_the_docs_have_examples_with_outputs() -> None:
    # The extraction itself could silently find nothing (a changed fence syntax): it must not.
    assert len(EXAMPLES) >= 30
    assert sum(e.output is not None and not e.this_machine for e in EXAMPLES) >= 20
    assert {e.page for e in EXAMPLES} >= {"README.md", "docs/index.md", "docs/troubleshooting.md"}


def test_a_this_machine_output_keeps_its_shape_on_another_cpu_and_loses_it_when_the_example_changes() -> None:
    # Two CPUs' runs of docs/cpu-dtype.md's first example: other dtype, other numbers, other verdict.
    theirs = (
        "bfloat16\n"
        "tie: bf16 at 0.90x fp32's speed (0.88-2.65x over the middle of 5 rounds), kept the checkpoint's bfloat16\n"
        "  x float32 - est. 0.01 s, 1.12x faster than bfloat16 (median of the rounds), a tie\n"
        "  x float16 - est. 0.01 s, 2.4x faster than bfloat16, but fp16 overflows in some models\n"
    )
    ours = (
        "float32\n"
        "bf16 17.62x slower than fp32 (17.60-18.92x over the middle of 3 rounds): est. 0.10 s\n"
        "  x bfloat16 - est. 1.69 s, 17.62x slower than float32 (median of the rounds)\n"
        "  x float16 - est. 1.71 s, 17.8x slower than float32; fp16 also overflows in some models\n"
    )
    assert shape(ours) == shape(theirs) == ["<dtype>", "<dtype>", "  x", "  x"]
    # A printed dict keeps its keys and its strings; the values a CPU decides are masked.
    kwargs = "{'dtype': 'bfloat16', 'attn_implementation': 'sdpa', 'device_map': 'cpu'}\n"
    assert shape(kwargs) == shape(kwargs.replace("bfloat16", "float32"))
    assert shape("{'bf16': True, 'optim': 'adamw_torch'}") == shape("{'bf16': False, 'optim': 'adamw_torch'}")
    # What a broken or changed example prints instead does not pass for it.
    assert shape(kwargs) != shape(kwargs.replace("'cpu'", "'auto'"))  # another placement
    assert shape(kwargs) != shape(kwargs.replace("'device_map': 'cpu'", "'max_memory': 'cpu'"))  # another key
    assert shape(theirs) != shape(
        theirs.replace("  x float16 - est. 0.01 s, 2.4x faster than bfloat16, but fp16 overflows in some models\n", "")
    )  # a line fewer
    assert shape(theirs) != shape("Traceback (most recent call last):\n" + theirs)
    explain = "  dtype                bfloat16   tie\n  device_map           cpu        no CUDA GPU\n"
    assert shape(explain) != shape(explain.replace("device_map ", "use_kernels"))  # another setting
    # Beside another process the probe says it was disturbed (a real run's words, the suite's other worker busy):
    # the machine's load, not the example; any other line cudaload says still counts.
    busy = (
        "cudaload: the CPU dtype probe for /tmp/td was disturbed (a re-run disagreed (decode bf16 0.60x then 0.49x "
        "fp32's speed); it waited for a core 53% of the time): kept bfloat16; `cudaload probe /tmp/td` measures again\n"
    )
    measures = "cudaload: measuring this CPU's dtypes for /tmp/td, ~1 s of CPU (F.linear 256x256; once per machine)\n"
    assert shape(measures + busy + explain) == shape(explain)
    assert shape("cudaload: the test forward failed\n" + explain) != shape(explain)


def test_examples_not_run_here_say_why() -> None:
    for skipped in SKIPPED:
        assert len(skipped.why) > 10, skipped
    for example in EXAMPLES:
        if example.covered_by is not None:
            assert (ROOT / example.covered_by).is_file(), f"{example.page}:{example.line}: {example.covered_by}"


def test_python_blocks_are_examples_or_say_why_not(tmp_path: Path) -> None:
    """A ```python block is run unless it is marked: no block silently escapes the test."""
    for page in PAGES:
        fences = docs_tool.FENCE.findall(page.read_text())
        python_blocks = sum(kind == "python" for kind, _ in fences)
        found, skipped = FOUND[page]
        assert python_blocks == sum(e.kind in ("python", "file") for e in found) + len(skipped), page


def test_the_tool_pastes_real_outputs_back(tmp_path: Path) -> None:
    """regenerate() replaces a wrong pasted output with the real one, and leaves the rest of the page."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nprint(6 * 7)\n```\n\n```text\n41\n```\n\nThe end.\n")
    original = docs_tool.ROOT
    docs_tool.ROOT = tmp_path
    try:
        found, _ = docs_tool.examples(page)
        assert [(e.kind, e.output) for e in found] == [("python", "41\n")]
        docs_tool.regenerate([page])
    finally:
        docs_tool.ROOT = original
    assert page.read_text() == "# A page\n\n```python\nprint(6 * 7)\n```\n\n```text\n42\n```\n\nThe end.\n"


def test_the_tool_refuses_to_paste_another_sets_outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The pages show the docs set's outputs: regenerating them on another set stops before a page is touched."""
    page = tmp_path / "page.md"
    page.write_text("```python\nprint(6 * 7)\n```\n\n```text\n41\n```\n")
    monkeypatch.setattr(docs_tool, "DOCS_SET", {**docs_tool.DOCS_SET, "transformers": "0.0.1"})
    monkeypatch.setattr(sys, "argv", ["regenerate_docs.py", str(page)])
    with pytest.raises(SystemExit) as stopped:
        docs_tool.main()
    assert "transformers" in str(stopped.value) and "(docs set: 0.0.1)" in str(stopped.value)
    assert page.read_text().endswith("41\n```\n")


def test_the_docs_set_is_the_one_the_versions_page_says_users_get() -> None:
    # docs/versions.md's table: the right-hand column is what a user's install resolves, and the docs show it.
    table = (ROOT / "docs" / "versions.md").read_text()
    for name in ("transformers", "kernels"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert row.split("|")[3].strip().startswith(docs_tool.DOCS_SET[name]), row
