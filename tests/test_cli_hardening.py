"""Every CLI path ends in one `cudaload: error: ...` line (exit 2) or a clean exit, never a traceback:
bad flags, unwritable folders, broken checkpoints, impossible configs, a closed pipe, Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cudaload.cli import main


def _cli(*args: str, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`python -m cudaload ARGS` in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "cudaload", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )


def _assert_clean_error(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, done.stderr
    assert "cudaload: error: " in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def _with_config(tiny: Path, tmp_path: Path, **changes: Any) -> Path:
    """A copy of a tiny model's folder whose config.json has `changes` (NaN written as NaN, as
    Python's json writes it)."""
    folder = tmp_path / "changed"
    folder.mkdir()
    for item in tiny.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    config = json.loads((tiny / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


# --- flags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", ""], "--gpu '' names no GPU"),
        (["--gpu", " "], "names no GPU"),
        (["--gpu", "T4,,A100"], "has an empty name in its list"),
        (["--gpu", "T4,A100", "--count", "2"], "a list names every GPU, --count repeats a single one"),
        (["--quantize", "4bit"], "--quantize describes a fine-tuning plan: add --finetune"),
        (["--seq-len", "512", "--batch-size", "2"], "--seq-len and --batch-size describe a fine-tuning plan"),
        (["--finetune", "--quantize", "2bit"], "invalid choice: '2bit'"),
        (["--finetune", "--seq-len", "-1"], "argument --seq-len: -1 is not a whole number of at least 1"),
        (["--finetune", "--batch-size", "0"], "argument --batch-size: 0 is not a whole number of at least 1"),
        (["--finetune", "--seq-len", "many"], "argument --seq-len: 'many' is not a whole number"),
        (["--world-size", "0"], "argument --world-size: 0 is not a whole number of at least 1"),
        (["--generate", "--context", "0"], "argument --context: 0 is not a whole number of at least 1"),
    ],
)
def test_plan_flags_that_cannot_mean_anything_are_refused(
    tiny_models, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(tiny_models["llama"]), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "argument --repeats: 0 is not"),
        (["--prompt-tokens", "-8"], "argument --prompt-tokens: -8 is not"),
        (["--threads", "0"], "argument --threads: 0 is not"),
        (["--finetune", "--steps", "0"], "argument --steps: 0 is not"),
        (["--finetune", "--seq-len", "-1"], "argument --seq-len: -1 is not"),
    ],
)
def test_bench_counts_below_one_are_refused(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_flags_still_plan_when_they_make_sense(tiny_models, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tiny_models["llama"])
    argv = ["plan", path, "--finetune", "--quantize", "none", "--seq-len", "512", "--batch-size", "2", "--json"]
    assert main(argv) == 0
    extras = json.loads(capsys.readouterr().out)["extras"]
    assert extras["memory_estimate"]["assumes"]["seq_len"] == 512
    assert extras["memory_estimate"]["assumes"]["batch_size"] == 2
    assert main(["plan", path, "--gpu", "T4, A100", "--json"]) == 0
    machine = json.loads(capsys.readouterr().out)["machine"]
    assert "Tesla T4" in machine and "A100" in machine
    assert main(["plan", path, "--gpu", "A100", "--count", "2", "--json"]) == 0


# --- plan on impossible configs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"hidden_size": -64},
        {"vocab_size": -1},
        {"num_attention_heads": 0},
        {"hidden_size": "sixty-four"},
        {"num_hidden_layers": math.nan},
        {"intermediate_size": None},
    ],
    ids=repr,
)
def test_plan_on_an_impossible_config_is_one_error_line(
    tiny_models, tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any]
) -> None:
    folder = _with_config(tiny_models["llama"], tmp_path, **changes)
    assert main(["plan", str(folder)]) == 2
    err = capsys.readouterr().err
    # In this process main() returned, so nothing was raised; transformers may log a complaint
    # about the config first (the fresh-process test below checks stderr has no traceback).
    assert "\ncudaload: error: " in "\n" + err


def test_plan_on_an_impossible_config_in_a_fresh_process_has_no_traceback(tiny_models, tmp_path: Path) -> None:
    _assert_clean_error(_cli("plan", str(_with_config(tiny_models["llama"], tmp_path, hidden_size=-64))))


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(
    tiny_models, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An error cudaload did not expect (here from a stand-in for planning) is one line and a
    "please report"; --debug or CUDALOAD_DEBUG=1 lets it through with its traceback."""
    import cudaload.planner

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("something deep down\nand its second line")

    monkeypatch.setattr(cudaload.planner, "plan", broken)
    path = str(tiny_models["llama"])
    assert main(["plan", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cudaload: error: planning {path!r} failed: RuntimeError: something deep down and its")
    assert "please report it" in err and "--debug" in err
    with pytest.raises(RuntimeError, match="something deep down"):
        main(["plan", path, "--debug"])
    with pytest.raises(RuntimeError, match="something deep down"):
        main(["--debug", "plan", path])
    monkeypatch.setenv("CUDALOAD_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something deep down"):
        main(["plan", path])


# --- demo where it cannot write ---------------------------------------------------------------------


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a 0o555 folder anyway")
def test_demo_in_a_read_only_folder_says_so(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        done = _cli("demo", "--tiny", "--dir", str(locked / "model"))
    finally:
        locked.chmod(0o755)
    _assert_clean_error(done)
    assert "Pick a folder you can write" in done.stderr
    assert not (locked / "model").exists()


def test_demo_where_no_folder_can_be_made_says_so(tmp_path: Path) -> None:
    """Under a file: no folder can be made there, for root too. Nothing half-written is left."""
    (tmp_path / "a-file").write_text("")
    done = _cli("demo", "--tiny", "--dir", str(tmp_path / "a-file" / "model"))
    _assert_clean_error(done)
    assert "Could not save the tiny model" in done.stderr and "NotADirectoryError" in done.stderr


# --- bench on a broken checkpoint -------------------------------------------------------------------


@pytest.mark.parametrize("broken", ["config is not JSON", "config has a string size", "weights are garbage"])
def test_bench_on_a_broken_model_is_one_error_line(tiny_models, tmp_path: Path, broken: str) -> None:
    if broken == "config has a string size":
        folder = _with_config(tiny_models["llama"], tmp_path, hidden_size="64")
    else:
        folder = _with_config(tiny_models["llama"], tmp_path)
        name = "config.json" if broken == "config is not JSON" else "model.safetensors"
        (folder / name).write_text("{not json, not safetensors")
    done = _cli("bench", str(folder), "--quick", "--no-generation", "--repeats", "1", "--threads", "1")
    _assert_clean_error(done)
    if broken == "weights are garbage":  # the table still lists each variant's failure
        assert "no variant of" in done.stderr and "failed: load: " in done.stdout


# --- output into a closed pipe ----------------------------------------------------------------------


def test_plan_into_a_closed_pipe_exits_quietly(tiny_models) -> None:
    """The reader is gone before anything is written: no BrokenPipeError, exit 141 (as SIGPIPE)."""
    with subprocess.Popen(
        [sys.executable, "-m", "cudaload", "plan", str(tiny_models["llama"]), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        err = process.stderr.read()
        assert process.wait(timeout=300) == 141
    assert "BrokenPipeError" not in err and "Traceback" not in err and "Exception ignored" not in err


def test_plan_piped_to_head_prints_its_first_line(tiny_models) -> None:
    command = f"'{sys.executable}' -m cudaload plan '{tiny_models['llama']}' | head -1"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith("cudaload plan for ") and done.stdout.count("\n") == 1
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr


# --- plan --json round-trips into plan() ------------------------------------------------------------


def test_plan_json_kwargs_give_the_same_plan(tmp_path: Path) -> None:
    """A 70B-shaped config spread over four A100s: max_memory is keyed by GPU index, which JSON
    writes as "0".."3"; fed back into plan(), the kwargs are the same (int keys again)."""
    from transformers import LlamaConfig

    import cudaload

    big = tmp_path / "llama-70b-shape"
    shape = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64)
    LlamaConfig(**shape, num_key_value_heads=8, vocab_size=128256).save_pretrained(big)
    done = _cli("plan", str(big), "--gpu", "A100", "--count", "4", "--json")
    assert done.returncode == 0, done.stderr
    kwargs = json.loads(done.stdout)["kwargs"]
    assert set(kwargs["max_memory"]) == {"0", "1", "2", "3"}  # what JSON can hold
    machine = cudaload.Machine.simulated("A100", count=4)
    direct = cudaload.plan(str(big), machine=machine)
    replanned = cudaload.plan(str(big), machine=machine, **kwargs)
    assert dict(replanned.kwargs) == dict(direct.kwargs)
    assert list(replanned.kwargs["max_memory"]) == [0, 1, 2, 3]


# --- Ctrl-C in bench --------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_table_shows_the_measured_loads_not_failed_none(tiny_models, tmp_path: Path, monkeypatch) -> None:
    """Interrupted in the first prefill: every variant has its load times and nothing else. The
    table shows those, says the rest was interrupted, and calls nothing 'failed'."""
    from cudaload.bench import format_report, harness, run_bench

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "_run", interrupted)
    result = run_bench(str(tiny_models["llama"]), quick=True, repeats=1, prompt_tokens=8, new_tokens=4)
    report = format_report(result)
    assert "failed" not in report
    rows = [line for line in report.splitlines() if "interrupted: only what it measured" in line]
    assert len(rows) == len(result["variants"])
    # The plan's first row holds its medians (the note is beside them, or in the speed-up table when a
    # row would not fit the terminal: issue 38).
    plan_row = next(line for line in report.splitlines() if line.startswith("* "))
    load_s = next(r for r in result["variants"] if r["is_plan"])["load_s"]
    assert f"{load_s:7.3f}" in plan_row
    assert "INTERRUPTED (Ctrl-C)" in report
    # The loads were measured: the fastest of them is named (before: "fastest: load None").
    fastest = next(line for line in report.splitlines() if line.startswith("fastest: "))
    assert "None" not in fastest and fastest.startswith("fastest: load ")


@pytest.mark.slow
def test_ctrl_c_in_a_running_bench_prints_what_was_measured(tmp_path: Path) -> None:
    """SIGINT once the loads are measured and the first prefill/decode round has begun: exit 130,
    the table with each variant's load time, marked interrupted."""
    from cudaload.demo import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    env = {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "cudaload", "bench", str(model), "--quick", "--no-generation"]
    argv += ["--repeats", "5", "--new-tokens", "64", "--threads", "1"]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A child of a shell that ignores SIGINT would inherit that; Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "prefill/decode round 1/" in line:
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=300)
    assert process.returncode == 130, "".join(seen) + err
    assert "Traceback" not in err and "failed: None" not in out
    assert "INTERRUPTED (Ctrl-C)" in out
    # The plan's rows: its medians, then (beside them, or in the speed-up table where a row would not fit
    # the terminal: issue 38) the note that it has only what it measured.
    plan_rows = [line for line in out.splitlines() if line.startswith("* ") and "(plan)" in line]
    assert any("interrupted: only what it measured" in row for row in plan_rows)
    assert float(plan_rows[0].split("(plan)")[1].split()[0]) > 0  # its measured load seconds


def _fake_children(monkeypatch: pytest.MonkeyPatch, results: dict[str | None, Any]) -> None:
    """Stand-ins for the finetune bench's variant processes (the one process boundary): each
    returns its result by `quantize`, or raises what it is given (Ctrl-C while it runs)."""
    from cudaload.bench import finetune_bench

    class FakeChild:
        def __init__(self, spec: dict[str, Any], env: dict[str, str], timeout: float, tmp: Path) -> None:
            self.outcome = results[spec["quantize"]]

        def wait_ready(self) -> None:
            return None

        def run(self) -> dict[str, Any]:
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return dict(self.outcome)

        def close(self) -> None:
            return None

    monkeypatch.setattr(finetune_bench, "_Child", FakeChild)


MEASURED_LORA = {
    "plan": {"dtype": "float32", "quantization": None, "optimizer": "adamw_torch"},
    "device": "cpu",
    "optimizer": "torch AdamW",
    "autocast": None,
    "load_s": 0.5,
    "step_times_s": [0.25, 0.2],
    "loss": {"warmup": 8.0, "steps": [7.9, 7.5]},
    "trainable_parameters": 32768,
    "memory": {
        "method": "VmHWM reset by clear_refs",
        "baseline_bytes": 1 << 28,
        "before_load_bytes": 1 << 27,
        "step": {"bytes": 6 << 20, "estimate_bytes": 4 << 20},
        "total": {"bytes": 60 << 20, "estimate_bytes": 40 << 20},
    },
    "torch_threads": 2,
}


def test_ctrl_c_in_the_finetune_bench_prints_the_measured_variant(
    tiny_models, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_children(monkeypatch, {None: MEASURED_LORA, "4bit": KeyboardInterrupt()})
    assert main(["bench", str(tiny_models["llama"]), "--finetune", "--steps", "2"]) == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lora = next(line for line in captured.out.splitlines() if line.startswith("  LoRA "))
    assert lora.split()[2] == "0.225"  # the median of its two steps
    assert "QLoRA 4-bit  ?/none/?                     interrupted (Ctrl-C) before it was measured" in captured.out
    assert "INTERRUPTED (Ctrl-C): the rows above are what was measured before it" in captured.out


def test_a_finetune_bench_where_no_variant_runs_is_an_error(
    tiny_models, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = {"error": "LoadFailedError: the weights are truncated"}
    _fake_children(monkeypatch, {None: broken, "4bit": broken})
    assert main(["bench", str(tiny_models["llama"]), "--finetune", "--steps", "2"]) == 2
    captured = capsys.readouterr()
    assert "failed: LoadFailedError: the weights are truncated" in captured.out  # the table first
    assert captured.err.splitlines()[-1].startswith(
        f"cudaload: error: no variant of {tiny_models['llama']} could run in the fine-tuning benchmark "
        "(LoadFailedError: the weights are truncated)"
    )
