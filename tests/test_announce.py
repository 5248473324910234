"""Every long step says what it does before it starts (issue 37): the CPU dtype probe announces
itself on stderr and through the `cudaload` logger; a disturbed probe is a WARNING that names the
dtype kept and the command that measures again; a line is said once, not twice."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

import cudaload
from cudaload.announce import announce
from cudaload.capability import dtype_probe
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import DtypeProbe, ProbeRound


def _probe(k: int, n: int, confidence: str, conditions: str) -> DtypeProbe:
    r = ProbeRound(
        (("float32", 1e-2), ("bfloat16", 5e-3), ("float16", 1e-2)),
        (("float32", 1e-3), ("bfloat16", 5e-4), ("float16", 1e-3)),
        tuple((a, b, 1e-4) for a in DTYPES for b in DTYPES if a != b),
    )
    return DtypeProbe(
        k, n, 128, r.prefill_s, r.decode_s, r.cast_s, 2, "2026-12-06T03:00:00Z",
        rounds=(r,) * 5, confidence=confidence, conditions=conditions,
    )  # fmt: skip


@pytest.fixture
def bf16_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small bf16 Qwen3 config (plan() reads the config only) and an empty cache of its own."""
    from transformers import Qwen3Config

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDALOAD_QUIET", raising=False)
    path = tmp_path / "qwen3-small"
    Qwen3Config(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=512, dtype="bfloat16",
    ).save_pretrained(path)  # fmt: skip
    return path


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cudaload.probe" and r.levelno == level]


def test_the_probe_says_what_it_measures_before_it_starts_and_only_when_it_measures(
    bf16_config: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    caplog.set_level(logging.INFO, logger="cudaload")
    order: list[str] = []

    def measure(k: int, n: int) -> DtypeProbe:
        order.append("measured after " + str(len(_messages(caplog, logging.INFO))) + " announcement")
        return _probe(k, n, "quiet", "by hand")

    monkeypatch.setattr(dtype_probe, "measure_dtypes", measure)
    cudaload.plan(str(bf16_config))
    (said,) = _messages(caplog, logging.INFO)
    assert order == ["measured after 1 announcement"]  # said before, not after
    assert said.startswith(f"measuring this CPU's dtypes for {bf16_config}, ~") and " s of CPU " in said
    assert "CUDALOAD_PROBE=0 skips it" in said
    assert f"cudaload: {said}\n" in capsys.readouterr().err
    cudaload.plan(str(bf16_config))  # read from the record: nothing to announce
    assert len(_messages(caplog, logging.INFO)) == 1 and len(order) == 1
    assert "measuring" not in capsys.readouterr().err


def test_a_disturbed_probe_warns_naming_the_dtype_kept_and_the_command(
    bf16_config: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    caplog.set_level(logging.INFO, logger="cudaload")
    why = "its rounds disagree on bf16 against fp32; timed in CPU time on one thread"
    monkeypatch.setattr(dtype_probe, "measure_dtypes", lambda k, n: _probe(k, n, "disturbed", why))
    planned = cudaload.plan(str(bf16_config))
    (warning,) = _messages(caplog, logging.WARNING)
    assert planned.dtype == "bfloat16"
    assert f"the CPU dtype probe for {bf16_config} was disturbed ({why}): kept bfloat16" in warning
    assert warning.endswith(f"`cudaload probe {bf16_config}` measures again")
    assert warning in capsys.readouterr().err
    cudaload.plan(str(bf16_config), dtype="float32")  # your dtype: the probe decides nothing, no warning
    assert len(_messages(caplog, logging.WARNING)) == 1


def test_a_line_goes_to_stderr_once_when_logging_already_shows_it_there(
    capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.delenv("CUDALOAD_QUIET", raising=False)
    logger = logging.getLogger("cudaload")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        announce("cudaload.probe", "converting the checkpoint")
    finally:
        logger.removeHandler(handler)
    assert capsys.readouterr().err.count("converting the checkpoint") == 1  # the handler's line only
    announce("cudaload.probe", "converting again")
    assert capsys.readouterr().err == "cudaload: converting again\n"  # no handler: said on stderr
    monkeypatch.setenv("CUDALOAD_QUIET", "1")
    announce("cudaload.probe", "quietly")
    assert capsys.readouterr().err == ""
