"""Where cudaload's "no Hub code or traffic unasked" promise stands: counted, not assumed, on both of
bitsandbytes' import paths whatever CPU runs the test.

bitsandbytes (0.48 to 0.50.2), imported by peft and transformers, fetches
`kernels-community/quantization-bitsandbytes` from the Hub *at import* on a CPU with AVX512-BF16
(bitsandbytes/backends/cpu/ops.py: `if has_avx512bf16(): ... get_kernel(...)`). cudaload imports it
first, refusing that fetch unless the plan has the user's consent (upstream_imports.import_bitsandbytes),
and planning imports neither peft nor bitsandbytes. tests/bnb_cpu_kind.py forces the CPU answer both ways.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

TESTS = Path(__file__).parent

# Runs SCRIPT's body in a fresh interpreter and records every host name resolved and every address
# connected to that is not this machine, bitsandbytes' CPU answer and what was imported.
_PROLOGUE = """
import json, socket, sys
sys.path.insert(0, sys.argv[2])
import bnb_cpu_kind
bnb_cpu_kind.force(sys.argv[3] == "1")
contacted = []
local = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
resolve, connect = socket.getaddrinfo, socket.socket.connect
def counted_resolve(host, *args, **kwargs):
    if host not in local:
        contacted.append(f"resolve {host}")
    raise socket.gaierror(f"test: no network for {host}")  # fail fast: the count is what matters
def counted_connect(self, address):
    if isinstance(address, tuple) and address[0] not in local:
        contacted.append(f"connect {address[0]}")
    return connect(self, address)
socket.getaddrinfo, socket.socket.connect = counted_resolve, counted_connect
import cudaload
"""
_EPILOGUE = """
from cudaload.upstream_imports import bitsandbytes_hub_kernel_refused
report = {"contacted": contacted, "refused": list(bitsandbytes_hub_kernel_refused()),
          "imported": sorted(m for m in ("peft", "bitsandbytes") if m in sys.modules)}
if "bitsandbytes" in sys.modules:
    from bitsandbytes.functional import has_avx512bf16
    report["avx512bf16"] = bool(has_avx512bf16())
print(json.dumps(report))
"""
FINETUNE = 'cudaload.load_for_finetune(sys.argv[1], quantize=None, dtype="float32", seq_len=16, **KWARGS)'
PLAN = 'cudaload.plan(sys.argv[1], finetune=True, quantize="4bit", machine=cudaload.Machine.simulated("A10G"))'


def _run(path: str, body: str, *, offline: bool, avx512bf16: bool, kwargs: str = "{}") -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    script = _PROLOGUE + f"KWARGS = {kwargs}\n" + body + "\n" + _EPILOGUE
    argv = [sys.executable, "-c", script, path, str(TESTS), "1" if avx512bf16 else "0"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("avx512bf16", [True, False], ids=["avx512bf16", "avx2"])
@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
def test_load_for_finetune_fetches_no_hub_code_unasked(tiny_models, offline: bool, avx512bf16: bool) -> None:
    seen, stderr = _run(str(tiny_models["llama"]), FINETUNE, offline=offline, avx512bf16=avx512bf16)
    assert seen["avx512bf16"] is avx512bf16  # the forced path is the one bitsandbytes took
    assert seen["contacted"] == []
    # On the AVX512-BF16 path bitsandbytes asked for its kernel and cudaload refused it, quietly: bitsandbytes'
    # "Failed to load CPU gemm_4bit_forward ... pip install kernels" advice would be wrong here.
    assert seen["refused"] == (["kernels-community/quantization-bitsandbytes"] if avx512bf16 else [])
    assert "gemm_4bit_forward" not in stderr


def test_with_consent_bitsandbytes_may_fetch_its_kernel(tiny_models) -> None:
    # hub_kernels=True is the user's consent: bitsandbytes' own import runs as it would without cudaload.
    seen, _ = _run(str(tiny_models["llama"]), FINETUNE, offline=False, avx512bf16=True, kwargs='{"hub_kernels": True}')
    assert seen["refused"] == []
    assert any("huggingface" in entry for entry in seen["contacted"])


@pytest.mark.parametrize("avx512bf16", [True, False], ids=["avx512bf16", "avx2"])
def test_planning_a_qlora_fine_tune_imports_neither_peft_nor_bitsandbytes(tiny_models, avx512bf16: bool) -> None:
    seen, stderr = _run(str(tiny_models["llama"]), PLAN, offline=False, avx512bf16=avx512bf16)
    assert seen == {"contacted": [], "refused": [], "imported": []}
    assert "bitsandbytes" not in stderr
