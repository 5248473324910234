"""Re-run the commands whose outputs the docs show, and paste the real outputs back.

    python tools/regenerate_docs.py docs/index.md docs/decisions.md ...

Two kinds of block are regenerated, in a scratch folder holding the tiny model `tiny-qwen3`:
- a ```text block whose first line is `$ COMMAND`: COMMAND is run in a shell, its output (stdout
  and stderr, as a terminal shows them) replaces the rest of the block;
- a ```text block that follows a ```python block directly or with only an "Output..." paragraph
  between them:
  the Python block is run, its stdout replaces the block.
Outputs are of this machine (timings and measured reasons included): say which machine in the page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BLOCK = re.compile(r"```(python|text)\n(.*?)```", re.DOTALL)


def _run(args: list[str] | str, cwd: Path, shell: bool = False) -> str:
    """stdout of `args`; a shell command's stderr is interleaved, as a terminal shows it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run(
        args,
        cwd=cwd,
        env=env,
        shell=shell,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if shell else subprocess.PIPE,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 and not shell:
        raise RuntimeError(f"{args!r} failed:\n{done.stderr[-2000:]}")
    return done.stdout if done.stdout.endswith("\n") else done.stdout + "\n"


def regenerate(page: Path, scratch: Path) -> None:
    text = page.read_text()
    out: list[str] = []
    last = 0
    previous_python: str | None = None
    previous_end = -1
    for match in BLOCK.finditer(text):
        kind, body = match.group(1), match.group(2)
        replacement = None
        if kind == "text" and body.startswith("$ "):
            command = body.splitlines()[0]
            replacement = command + "\n" + _run(command[2:], scratch, shell=True)
        elif kind == "text" and previous_python is not None:
            between = text[previous_end : match.start()].strip()
            if not between or (between.startswith("Output") and "\n\n" not in between):
                replacement = _run([sys.executable, "-c", previous_python], scratch)
        out.append(text[last : match.start()])
        out.append(f"```{kind}\n{replacement if replacement is not None else body}```")
        last = match.end()
        previous_python, previous_end = (body, match.end()) if kind == "python" else (None, -1)
    out.append(text[last:])
    page.write_text("".join(out))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cudaload-docs-") as tmp:
        scratch = Path(tmp)
        _run(
            [sys.executable, "-c", "from cudaload.demo import build_tiny_model; build_tiny_model('tiny-qwen3')"],
            scratch,
        )
        for name in sys.argv[1:]:
            regenerate(Path(name).resolve(), scratch)
            print(f"regenerated {name}", file=sys.stderr)


if __name__ == "__main__":
    main()
