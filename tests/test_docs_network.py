"""Every Python snippet of README.md and docs/ reaches no network host as written (issue 46, item 1), on both of
bitsandbytes' CPU paths, without HF_HUB_OFFLINE.

bitsandbytes 0.50.2 (imported by peft, trl and transformers' Trainer) asks the Hub for
`kernels-community/quantization-bitsandbytes` at import when `has_avx512bf16()` says yes
(bitsandbytes/backends/cpu/ops.py); tests/bnb_cpu_kind.py forces that answer either way, so both paths run on
any CPU. Each snippet runs alone in a fresh interpreter (an import another snippet made would hide its own import
order), with `socket.getaddrinfo` and `socket.socket.connect` refusing and recording every host that is not this
machine: a snippet that imports Trainer before cudaload has loaded (as the README's QLoRA quick start did) records
the two lookups.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("bitsandbytes")

ROOT = Path(__file__).parents[1]
TESTS = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("regenerate_docs_network", ROOT / "tools" / "regenerate_docs.py")
assert _spec is not None and _spec.loader is not None
docs_tool: Any = importlib.util.module_from_spec(_spec)
sys.modules["regenerate_docs_network"] = docs_tool
_spec.loader.exec_module(docs_tool)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [e for page in PAGES for e in docs_tool.examples(page)[0] if e.kind == "python" and e.covered_by is None]
"""The runnable Python blocks. A block that is a script file (`# train.py`) runs under the page's own torchrun
command (tests/test_docs_examples.py), not alone: its imports follow the same rule (cudaload loads first)."""

# The snippet runs from SNIPPET (argv[1]) after this, in the folder where the docs' tiny model is; the report
# (hosts asked for, bitsandbytes' CPU answer) goes to REPORT (argv[2]) whatever the snippet does.
_GUARD = """
import atexit, json, runpy, socket, sys
snippet, report, tests, avx = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
sys.path.insert(0, tests)
import bnb_cpu_kind
bnb_cpu_kind.force(avx)
asked = []
local = ("localhost", "127.0.0.1", "::1", "0.0.0.0", None)
connect = socket.socket.connect
def refused_lookup(host, *args, **kwargs):
    if host not in local:
        asked.append(f"resolve {host}")
        raise socket.gaierror(socket.EAI_NONAME, f"test: no network for {host}")
    return socket._real_getaddrinfo(host, *args, **kwargs)
def refused_connect(self, address):
    if isinstance(address, tuple) and address[0] not in local:
        asked.append(f"connect {address[0]}")
        raise OSError(f"test: no network for {address[0]}")
    return connect(self, address)
socket._real_getaddrinfo = socket.getaddrinfo
socket.getaddrinfo, socket.socket.connect = refused_lookup, refused_connect
def record():
    seen = {"asked": asked}
    if "bitsandbytes.functional" in sys.modules:
        seen["avx512bf16"] = bool(sys.modules["bitsandbytes.functional"].has_avx512bf16())
    with open(report, "w") as out:
        json.dump(seen, out)
atexit.register(record)
sys.argv = [snippet]
runpy.run_path(snippet, run_name="__main__")
"""


@pytest.fixture(scope="module")
def docs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the docs' tiny model, as the snippets name it ("tiny-qwen3")."""
    from cudaload.demo import build_tiny_model

    folder = tmp_path_factory.mktemp("docs-network")
    build_tiny_model(folder / docs_tool.TINY_MODEL)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("avx512bf16", [True, False], ids=["avx512bf16", "avx2"])
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"{e.page}:{e.line}" for e in SNIPPETS])
def test_a_snippet_reaches_no_network_host(snippet: Any, avx512bf16: bool, docs_folder: Path, tmp_path: Path) -> None:
    code, report = tmp_path / "snippet.py", tmp_path / "report.json"
    code.write_text(snippet.code)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # as a user runs it
    env["CUDALOAD_CACHE"] = str(docs_folder / "cache")  # one cache for all: the CPU's dtypes measured once
    argv = [sys.executable, "-c", _GUARD, str(code), str(report), str(TESTS), "1" if avx512bf16 else "0"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=docs_folder, env=env, timeout=600)
    seen = json.loads(report.read_text())
    assert seen["asked"] == [], f"{snippet.page}:{snippet.line} asked the network: {seen['asked']}"
    assert done.returncode == 0, f"{snippet.page}:{snippet.line} failed:\n{done.stderr[-3000:]}"
    assert seen.get("avx512bf16", avx512bf16) is avx512bf16  # the forced path is the one bitsandbytes took


def test_the_snippets_are_found() -> None:
    pages = {e.page for e in SNIPPETS}
    assert "README.md" in pages and "docs/finetune.md" in pages and len(SNIPPETS) > 20
