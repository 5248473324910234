"""The "cudaload" logger: silent unless the application configures logging; then one INFO line per
load (dtype, attention, placement, time) and a WARNING for every attention fallback."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from cudaload import Machine, load, load_for_finetune, pipeline

pytestmark = pytest.mark.slow


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("cudaload") and r.levelno == level]


def test_a_load_logs_one_info_line_with_what_it_applied(tiny_models, caplog) -> None:
    caplog.set_level(logging.INFO, logger="cudaload")
    model = load(str(tiny_models["qwen3"]), dtype="float32")
    (line,) = _records(caplog, logging.INFO)
    applied = model.cudaload_plan
    message = line.getMessage()
    assert line.name == "cudaload.loaders"
    assert str(tiny_models["qwen3"]) in message and "Qwen3ForCausalLM" in message
    assert f"dtype={applied.dtype}" in message and f"attn_implementation={applied.attn_implementation}" in message
    assert " on cpu: " in message  # where it went
    assert "load " in message and "verify " in message and message.endswith("s)")  # how long each step took
    assert not _records(caplog, logging.WARNING)


def test_every_attention_fallback_is_a_warning(tiny_models, caplog) -> None:
    caplog.set_level(logging.INFO, logger="cudaload")
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})  # plans FA2; this CPU cannot run it
    model = load(str(tiny_models["llama"]), machine=a100, device_map="cpu", dtype="bfloat16")
    (warning,) = _records(caplog, logging.WARNING)
    assert "attn_implementation=flash_attention_2 failed at" in warning.getMessage()
    assert warning.getMessage().endswith("falling back to sdpa")
    (info,) = _records(caplog, logging.INFO)
    assert "fell back from flash_attention_2" in info.getMessage()
    assert model.cudaload_plan.attn_implementation == "sdpa"


def test_load_for_finetune_and_pipeline_log_their_load_too(tiny_models, caplog) -> None:
    caplog.set_level(logging.INFO, logger="cudaload")
    load_for_finetune(str(tiny_models["qwen3"]), quantize=None, dtype="float32")
    pipeline("text-generation", str(tiny_models["qwen3"]), dtype="float32")
    assert len(_records(caplog, logging.INFO)) == 2


def test_the_logger_is_silent_until_the_application_configures_logging() -> None:
    # Without a handler anywhere, Python prints WARNING records to stderr ("last resort"): a library
    # must not. The NullHandler on "cudaload" keeps it quiet; basicConfig shows it.
    script = (
        "import logging, cudaload; logging.getLogger('cudaload.loaders').warning('fell back'); "
        "logging.basicConfig(level=logging.INFO); logging.getLogger('cudaload.loaders').info('shown')"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "fell back" not in run.stderr
    assert "INFO:cudaload.loaders:shown" in run.stderr
