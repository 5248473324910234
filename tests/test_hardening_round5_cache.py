"""Hardening round 5, the caches (issue 39, items 6-10): a cache nobody else can poison, and
detection that never fails on one.

Each test failed before its fix. No timing of this machine is asserted: the probe boundary
(`measure_dtypes`) returns hand-made numbers."""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from cudaload import CudaloadWarning, DtypeProbe
from cudaload.capability import cache, detect, dtype_probe, lock_file
from cudaload.capability.dtype_probe import dtype_probe_for, remeasure
from cudaload.capability.probe_record import probe_path
from cudaload.errors import SettingError
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import Machine, ProbeRound


def _probe(bucket: tuple[int, int]) -> DtypeProbe:
    prefill = {"float32": 0.010, "bfloat16": 0.005, "float16": 0.010}
    decode = {"float32": 1e-3, "bfloat16": 5e-4, "float16": 1e-3}
    r = ProbeRound(
        tuple(prefill.items()), tuple(decode.items()), tuple((a, b, 1e-4) for a in DTYPES for b in DTYPES if a != b)
    )
    return DtypeProbe(
        *bucket, 128, r.prefill_s, r.decode_s, r.cast_s, 2, "2026-12-06T00:00:00Z",
        rounds=(r,) * 5, confidence="quiet", conditions="by hand",
    )  # fmt: skip


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The probe boundary: a hand-made quiet probe at once; the buckets asked for are counted."""
    calls: list[tuple[int, int]] = []

    def measure(k: int, n: int) -> DtypeProbe:
        calls.append((k, n))
        return _probe((k, n))

    monkeypatch.setattr(dtype_probe, "measure_dtypes", measure)
    monkeypatch.setattr(dtype_probe, "_warned", set())
    return calls


@pytest.fixture
def machine() -> Machine:
    return replace(detect(), threads=3)


def _lock(machine: Machine, env: dict[str, str]) -> Path:
    lock = probe_path(machine, (256, 256), env).with_suffix(".lock")
    lock.parent.mkdir(parents=True, mode=0o700)
    lock.parent.parent.chmod(0o700)
    return lock


# ---- item 7: the probe lock ---------------------------------------------------------------------


def test_a_symlink_at_the_lock_path_is_never_followed_and_its_target_is_kept(tmp_path, machine, measured) -> None:
    env = {"CUDALOAD_CACHE": str(tmp_path / "cache")}
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock = _lock(machine, env)
    lock.symlink_to(victim)
    with pytest.warns(
        CudaloadWarning,
        match=r"it is a symbolic link, which cudaload never follows, not a lock file cudaload made; delete it",
    ):
        probe, why = dtype_probe_for(machine, (256, 256), env)
    assert victim.read_text() == "precious"  # before: truncated and overwritten with a pid
    assert probe is not None and why == "" and measured == [(256, 256)]
    with pytest.raises(SettingError, match=r"cudaload probe did not measure: no lock file .*symbolic link.*rm "):
        remeasure(machine, (256, 256), env)
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    ("make", "found"),
    [
        (lambda lock, tmp: os.mkfifo(lock), "a FIFO"),
        (lambda lock, tmp: lock.mkdir(), "a folder"),
        (
            lambda lock, tmp: ((tmp / "other").write_text("x"), os.link(tmp / "other", lock)),
            "a file with another name or owner",
        ),
    ],
    ids=["fifo", "folder", "hard-link"],
)
def test_a_lock_path_that_is_not_a_lock_file_is_named_and_never_written(tmp_path, machine, measured, make, found):
    env = {"CUDALOAD_CACHE": str(tmp_path / "cache")}
    lock = _lock(machine, env)
    make(lock, tmp_path)
    with pytest.warns(CudaloadWarning, match=f"{lock}: it is {found}.*delete it"):
        probe, _ = dtype_probe_for(machine, (256, 256), env)  # before: a bare OSError (EINVAL) from a FIFO
    assert probe is not None  # planning goes on, measured without the lock
    with pytest.raises(SettingError, match=f"cudaload probe did not measure: no lock file {lock}: it is {found}"):
        remeasure(machine, (256, 256), env)
    if (tmp_path / "other").exists():
        assert (tmp_path / "other").read_text() == "x"


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_no_lock_is_taken_in_a_folder_others_can_write(tmp_path, machine, mode) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with lock_file.exclusive(folder / "x.lock") as refused:
        assert refused is not None and refused.kind == "untrusted" and "writable by" in refused
    assert not (folder / "x.lock").exists()  # before: created and written there


def test_cudaload_probe_says_it_waits_on_a_held_lock_and_then_does_not_measure(
    tmp_path, machine, measured, monkeypatch, capsys
) -> None:
    from cudaload.cli import main

    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(lock_file, "LOCK_TIMEOUT_S", 0.3)
    machine = detect()
    threaded = replace(machine, threads=dtype_probe.torch_threads(None, machine.cpu.cores, machine.cpu.physical_cores))
    from cudaload.facts.model import reference_model

    facts = reference_model()
    bucket = dtype_probe.shape_bucket(facts.hidden_size, facts.intermediate_size)
    lock = probe_path(threaded, bucket).with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        holder.write("4242")
        holder.flush()
        status = main(["probe"])
    err = capsys.readouterr().err
    assert f"cudaload: waiting for another process (pid 4242), which holds {lock}" in err  # before: silent
    assert status == 2 and "has held" in err and "run it again when that process is done" in err
    assert measured == []  # before: measured (and wrote) beside the holder after the timeout


# ---- item 8: a cache detection and planning cannot read ------------------------------------------


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cache folder warns once per process: start from none warned."""
    monkeypatch.setattr(cache, "_refused", set())
    monkeypatch.setattr(cache, "_warned", set())


@pytest.mark.parametrize("probe", ["0", "1"])
def test_a_cache_name_over_255_bytes_warns_and_planning_goes_on(
    tiny_models, tmp_path, monkeypatch, fresh_warnings, measured, probe
) -> None:
    import cudaload

    too_long = tmp_path / ("c" * 300)
    monkeypatch.setenv("CUDALOAD_CACHE", str(too_long))
    monkeypatch.setenv("CUDALOAD_PROBE", probe)
    with pytest.warns(CudaloadWarning) as seen:
        planned = cudaload.plan(str(tiny_models["llama"]))  # before: OSError [Errno 36] from the tuning folder
    assert any("cannot read the cache folder" in str(w.message) for w in seen)
    assert all("File name too long" in str(w.message) for w in seen)
    assert planned.decision("dtype").value in ("float32", "bfloat16")
    assert measured == ([] if probe == "0" else [measured[0]])


def test_an_unreadable_hub_cache_is_taken_as_not_cached_and_detection_goes_on(
    tmp_path, monkeypatch, fresh_warnings, capsys
) -> None:
    from cudaload.cli import main

    unreadable = tmp_path / ("h" * 300)  # as another user's 0700 folder: stat fails (root reads any folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(unreadable))
    detect.cache_clear()
    try:
        with pytest.warns(CudaloadWarning, match=f"cannot read the cache folder {unreadable}"):
            machine = detect()  # before: OSError from the kernel cache's folder
        assert main(["doctor"]) == 0 and "cudaload doctor" in capsys.readouterr().out
    finally:
        detect.cache_clear()  # the next test detects this machine without the setting
    assert machine.hub.kernels and all(
        not k.cached and "cannot be read (File name too long)" in k.detail for k in machine.hub.kernels
    )


def test_a_cache_on_dev_null_is_not_called_untrusted(tmp_path, machine, measured, fresh_warnings) -> None:
    env = {"CUDALOAD_CACHE": "/dev/null"}
    with pytest.warns(CudaloadWarning, match="could not write its measurement cache in /dev/null/probes") as seen:
        dtype_probe_for(machine, (256, 256), env)
    assert not any("chmod" in str(w.message) for w in seen)  # before: "Run `chmod go-w /dev/null`"


def test_a_cache_under_an_unknown_users_home_names_the_setting(machine, measured) -> None:
    env = {"CUDALOAD_CACHE": "~nosuchuser-39/x"}
    with pytest.raises(SettingError, match=r"CUDALOAD_CACHE='~nosuchuser-39/x': there is no user 'nosuchuser-39'"):
        dtype_probe_for(machine, (256, 256), env)  # before: a bare RuntimeError "Could not determine home directory."


# ---- item 9: bench --random-weights keys its folder on the config ------------------------------------


def test_random_weights_folders_are_keyed_on_the_config_not_the_sanitised_name(tiny_models, tmp_path) -> None:
    import shutil

    from cudaload.bench.models import resolve_model

    named = {}
    for name, source in (("a.b", "llama"), ("a-b", "gpt2")):  # both sanitise to "random-a-b"
        named[name] = tmp_path / "models" / name
        shutil.copytree(tiny_models[source], named[name])
    work = tmp_path / "work"
    first = resolve_model(str(named["a.b"]), work, quick=False, random_weights=True)
    second = resolve_model(str(named["a-b"]), work, quick=False, random_weights=True)
    assert first.architecture == "LlamaForCausalLM"
    assert second.architecture == "GPT2LMHeadModel"  # before: LlamaForCausalLM, the first one's folder
    assert first.path != second.path and first.path.parent == second.path.parent == work
    again = resolve_model(str(named["a.b"]), work, quick=False, random_weights=True)
    assert again.path == first.path  # the same config reuses its folder


# ---- item 10: the weak cases ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a positive integer"),
        ({"RANK": "0", "WORLD_SIZE": "\u0662"}, "WORLD_SIZE='\u0662' is not a positive integer"),  # Arabic-Indic 2
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE=4 is more than WORLD_SIZE=2"),
        ({"RANK": "0", "WORLD_SIZE": "2", "DEEPSPEED_ZERO_STAGE": "4"}, "DEEPSPEED_ZERO_STAGE=4 is not a ZeRO stage"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_DEEPSPEED": "true"},
            "both FSDP and DeepSpeed are enabled",
        ),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "2"}, "SLURM_PROCID=5 is not below SLURM_NTASKS=2"),  # before: RANK=5
    ],
)
def test_launch_variables_that_cannot_be_a_launch_are_problems(env, problem) -> None:
    from cudaload.capability.launch import read_launch

    launch = read_launch(env)
    assert any(problem in p for p in launch.problems), launch.problems  # before: accepted, or a wrong name


def test_a_lowercase_gpu_uuid_is_said_to_hide_every_gpu() -> None:
    from cudaload.capability.visible import RawDevice, visible_gpus

    raw = [RawDevice(0, "NVIDIA H100", "GPU-1234abcd", (9, 0), 80 * 2**30)]
    assert len(visible_gpus(raw, "GPU-1234", None)[0]) == 1
    gpus, notes = visible_gpus(raw, "gpu-1234", None)
    assert gpus == () and any("'gpu-1234' is neither a GPU number nor a GPU-/MIG- UUID" in n for n in notes)
    gpus, _ = visible_gpus([*raw, replace(raw[0], nvml_index=1, uuid="GPU-2")], "\u0661", None)  # Arabic-Indic 1
    assert gpus == ()  # CUDA's strtoul reads ASCII digits only; before: GPU 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("custom:sm999:80GiB", "compute capability 99.9, which no CUDA GPU has"),
        ("custom:sm00:80GiB", "compute capability 0.0, which no CUDA GPU has"),
        ("custom:sm90:80GiB:0sm", "gives 0 SMs"),
    ],
)
def test_a_gpu_description_no_gpu_can_have_is_refused(spec, message) -> None:
    from cudaload.errors import UnknownGpuError

    with pytest.raises(UnknownGpuError, match=re.escape(message)):  # before: accepted
        Machine.simulated(spec)
    assert Machine.simulated("custom:sm120:32GiB:170sm").gpus[0].capability == (12, 0)


@pytest.mark.parametrize(("gpu", "sm"), [("custom:sm61:8GiB", "sm_61"), ("custom:sm52:12GiB", "sm_52")])
def test_a_gpu_before_volta_is_not_said_to_have_tensor_cores(gpu, sm) -> None:
    from cudaload.facts.model import any_model
    from cudaload.policy import Request, decide_plan

    dtype = decide_plan(Machine.simulated(gpu), any_model(), Request()).decision("dtype")
    assert dtype.value == "float16" and f"({sm}) predates bf16 (sm80) and tensor cores (sm70)" in dtype.reason
    assert "runs on its tensor cores" not in dtype.reason  # before: said so


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ({"cpu_flags": "amx_bf16"}, "cpu_flags='amx_bf16': pass a list of names"),  # before: {'a', 'm', 'x', ...}
        ({"cached_kernels": "kernels-community/flash-attn2"}, "cached_kernels='kernels-community/flash-attn2'"),
        ({"offline": "no"}, "offline='no': pass True or False"),  # before: a truthy string, offline
        ({"cpu_memory_gib": 0}, "cpu_memory_gib=0: pass the machine's RAM"),
        ({"cpu_memory_gib": -5}, "cpu_memory_gib=-5"),
        ({"packages": {"transformers": "banana"}}, "'banana' is not a version"),
    ],
)
def test_simulated_machine_arguments_of_the_wrong_kind_are_refused(argument, message) -> None:
    with pytest.raises(SettingError, match=re.escape(message)):
        Machine.simulated(**argument)


def test_a_json_command_that_fails_prints_a_json_error_object(capsys) -> None:
    import json

    from cudaload.cli import main

    assert main(["plan", "no/such-model-39", "--gpu", "custom:sm999:80GiB", "--json"]) == 2
    out, err = capsys.readouterr()
    error = json.loads(out)["error"]  # before: stdout empty, so `| jq` read nothing
    assert error["type"] == "UnknownGpuError" and "which no CUDA GPU has" in error["message"]
    assert "cudaload: error: " in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--out", "/dev/full"], "--out /dev/full: that is not a regular file"),
        (["--out", "{tmp}"], "that is a folder"),
        (["--chart", "{tmp}/missing/chart.png"], "the folder '{tmp}/missing' is missing or not writable"),
        (["--save"], "--save with --quick: a smoke test"),
    ],
)
def test_bench_refuses_what_could_only_fail_after_the_run_before_it(tmp_path, capsys, flags, message) -> None:
    from cudaload.cli import main

    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    assert main(["bench", "--quick", *flags]) == 2
    err = capsys.readouterr().err
    assert message.replace("{tmp}", str(tmp_path)) in err
    assert "[bench]" not in err  # before: the whole run, then the failure (or, for --save, a stored smoke test)


def test_a_world_size_beyond_the_simulated_gpus_is_refused(tiny_models, capsys) -> None:
    from cudaload.cli import main

    with pytest.raises(SystemExit) as done:
        main(["plan", str(tiny_models["llama"]), "--gpu", "A100", "--count", "2", "--world-size", "4"])
    assert (
        done.value.code == 2 and "--world-size 4 with 2 simulated GPU(s)" in capsys.readouterr().err
    )  # before: silent


@pytest.mark.parametrize("name", ["kernels-community/../../evil", "a/b/c", "../x", "org/re po"])
def test_an_attention_name_that_is_no_hub_repo_is_refused(tiny_models, capsys, name) -> None:
    from cudaload.cli import main

    assert main(["plan", str(tiny_models["llama"]), "--gpu", "A100", "--attn", name]) == 2  # before: accepted
    assert "is not an attention implementation transformers knows" in capsys.readouterr().err
