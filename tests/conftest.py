"""Shared fixtures: offline, no network, tiny real models built and saved locally."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cudaload.facts.packages

# Nothing may reach the Hub: the machines running these tests have no network, and a test
# that silently depended on one would be lying. Set before transformers is imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# The CLI wraps its lines to COLUMNS when set (cudaload.announce.fitted): pytest-xdist's workers run with COLUMNS=80,
# a plain pytest run without it. A test of wrapping sets the width it checks.
os.environ.pop("COLUMNS", None)
# Measurements (CPU dtype probe, tuning records) go to a cache of this run, never the user's; pytest-xdist's workers
# share one (what ranks on one machine do: the probe and the real model's conversion, under cudaload's own locks,
# once a run rather than once a worker).
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if _RUN:
    _cache = Path(tempfile.gettempdir()) / f"cudaload-test-cache-{_RUN}"
    _cache.mkdir(mode=0o700, exist_ok=True)
    os.environ["CUDALOAD_CACHE"] = str(_cache)
else:
    os.environ["CUDALOAD_CACHE"] = tempfile.mkdtemp(prefix="cudaload-test-cache-")

_real_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: Any) -> Any:
    host = address[0] if isinstance(address, tuple) else address
    if (
        isinstance(host, str) and (host.startswith("127.") or host in ("localhost", "::1"))
    ) or self.family == socket.AF_UNIX:
        return _real_connect(self, address)
    raise RuntimeError(f"test tried to open a network connection to {address!r}")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)
    yield


_PACKAGES_HERE = cudaload.facts.packages.packages_here


@pytest.fixture(autouse=True)
def _simulated_machines_from_the_defaults(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A simulated machine starts from the packages installed here (`cudaload.facts.packages.packages_here`),
    which differ between the tested and the newest dependency sets: in tests it starts from the defaults
    (torch 2.13.0, transformers 5.22.2, accelerate 1.16.0), and each test names the packages it plans
    with. tests/test_simulated_packages.py checks the real default with the `packages_installed_here`
    fixture."""
    monkeypatch.setattr(cudaload.facts.packages, "packages_here", lambda paths=None: {})
    yield


@pytest.fixture
def packages_installed_here(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Undo the fixture above: simulated machines take this machine's packages, as outside the tests."""
    monkeypatch.setattr(cudaload.facts.packages, "packages_here", _PACKAGES_HERE)
    return _PACKAGES_HERE()


@pytest.fixture(autouse=True)
def _quiet_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CPU dtype probe judges whether other processes disturbed it (`confidence_of`) and then
    refuses its numbers; a test's outcome must not hang on what else the CI box runs, so in this
    process every measurement counts as quiet (the words still say what it saw). Tests of the
    judgement call it directly (`dtype_timing.confidence_of.__wrapped__`) or patch it themselves."""
    from cudaload.capability import dtype_timing

    real = getattr(dtype_timing.confidence_of, "__wrapped__", dtype_timing.confidence_of)

    def quiet(rounds: Any, rerun: Any, conditions: Any) -> tuple[str, str]:
        return "quiet", real(rounds, rerun, conditions)[1]

    quiet.__wrapped__ = real  # type: ignore[attr-defined]
    monkeypatch.setattr(dtype_timing, "confidence_of", quiet)
    yield


@pytest.fixture(autouse=True)
def _every_load_runs_its_test_forward(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A load whose test forward passed before (same checkpoint, kwargs, versions, machine) does not run it
    again (loaders/check_record.py), and this run shares one cache: a test's outcome must not hang on which
    test loaded the same model first, so here every load runs it (CUDALOAD_VERIFY=full).
    tests/test_check_record.py removes it to test the skip."""
    monkeypatch.setenv("CUDALOAD_VERIFY", "full")
    yield


@pytest.fixture(autouse=True)
def _every_plan_is_decided(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A plan decided before from the same inputs is read back instead of decided (planner/plan_store.py), and
    this run shares one cache: a test that changes the policy (a monkeypatched rule) must get the policy's plan,
    not one an earlier test stored, so here every plan is decided. tests/test_plan_store.py turns the store on."""
    from cudaload.planner import planning

    monkeypatch.setattr(planning, "plan_key", lambda *args, **kwargs: None)
    yield


def _save(tmp: Path, name: str, config: Any, dtype: str) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    path = tmp / name
    model.save_pretrained(path)
    from cudaload.demo import save_tiny_tokenizer

    save_tiny_tokenizer(path, config.get_text_config().vocab_size)
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three architectures, saved with `from_config(...).save_pretrained(tmp)`."""
    from transformers import GPT2Config, LlamaConfig, Qwen3Config

    tmp = tmp_path_factory.mktemp("models")
    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return {
        "qwen3": _save(tmp, "qwen3", Qwen3Config(head_dim=16, **common), "bfloat16"),
        "llama": _save(tmp, "llama", LlamaConfig(**common), "float32"),
        "gpt2": _save(
            tmp,
            "gpt2",
            GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0),
            "float16",
        ),
    }


@pytest.fixture(scope="session")
def unmeasured_dtype() -> str:
    """The dtype plan() gives with the CPU probe off (CUDALOAD_PROBE=0), worked out from this machine's
    facts: on CPU the static table, bf16 only with AMX-BF16 tiles (the `amx_bf16` flag of /proc/cpuinfo,
    docs/cpu-dtype.md), else fp32; on a GPU, bf16 from sm80 on, fp16 before."""
    import torch

    if torch.cuda.is_available():
        return "bfloat16" if torch.cuda.get_device_capability() >= (8, 0) else "float16"
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo: the CPU's flags are unknown here")
    return "bfloat16" if "amx_bf16" in cpuinfo.read_text().split() else "float32"


@pytest.fixture
def llama70b(tmp_path: Path) -> Path:
    """The Llama-3-70B config alone (nothing to load: plan and launch read configs only)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        dtype="bfloat16",
    )
    config.save_pretrained(tmp_path / "llama70b")
    return tmp_path / "llama70b"
