"""Where cudaload's "no Hub code or traffic unasked" promise stands: counted, not assumed.

cudaload itself contacts nothing. One upstream import does: bitsandbytes (>= 0.48), imported by
peft and transformers, fetches `kernels-community/quantization-bitsandbytes` from the Hub *at
import* on a CPU with AVX512-BF16 (bitsandbytes/backends/cpu/ops.py: `if has_avx512bf16(): ...
get_kernel(...)`). HF_HUB_OFFLINE=1 stops it (kernels then only reads the local cache). The README
says exactly this; these tests hold it on whatever CPU runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

# Runs load_for_finetune in a fresh interpreter and records every host name resolved and every
# address connected to that is not this machine.
_SCRIPT = """
import json, socket, sys
contacted = []
local = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
resolve, connect = socket.getaddrinfo, socket.socket.connect
def counted_resolve(host, *args, **kwargs):
    if host not in local:
        contacted.append(f"resolve {host}")
    return resolve(host, *args, **kwargs)
def counted_connect(self, address):
    if isinstance(address, tuple) and address[0] not in local:
        contacted.append(f"connect {address[0]}")
    return connect(self, address)
socket.getaddrinfo, socket.socket.connect = counted_resolve, counted_connect
import cudaload
cudaload.load_for_finetune(sys.argv[1], quantize=None, dtype="float32", seq_len=16)
from bitsandbytes.functional import has_avx512bf16
print(json.dumps({"contacted": contacted, "avx512bf16": bool(has_avx512bf16())}))
"""


def _run(path: str, offline: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([sys.executable, "-c", _SCRIPT, path], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_load_for_finetune_contacts_nothing_with_hf_hub_offline(tiny_models) -> None:
    assert _run(str(tiny_models["llama"]), offline=True)["contacted"] == []


def test_online_only_bitsandbytes_cpu_kernel_fetch_contacts_the_hub(tiny_models) -> None:
    # Online, the only traffic is bitsandbytes' import-time kernel fetch, on AVX512-BF16 CPUs alone.
    seen = _run(str(tiny_models["llama"]), offline=False)
    if seen["avx512bf16"]:
        assert seen["contacted"], "bitsandbytes no longer fetches its CPU kernel at import: update the README"
        assert all("huggingface" in entry or entry.startswith("connect") for entry in seen["contacted"])
    else:
        assert seen["contacted"] == []
