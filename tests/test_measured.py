"""The CPU dtype is measured, not guessed: the probe, its cache, tuning records, and the policy
that turns them into a dtype. Policy tables pass measurements in; probe tests run on this CPU."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

import cudaload
from cudaload import CudaloadWarning, DtypeProbe, Machine, TuningRecord, Workload, WorkloadError
from cudaload.capability import detect, measure_for
from cudaload.capability.dtype_probe import cached_dtype_probe, shape_bucket
from cudaload.capability.dtype_timing import measure_dtypes
from cudaload.capability.tuning_records import read_tuning_records, write_tuning_record
from cudaload.facts.dtypes import DTYPES
from cudaload.facts.machine import TunedVariant
from cudaload.facts.model import any_model
from cudaload.policy import Request, decide_plan
from cudaload.request import TrainingRequest, workload_from

# A 0.6B-shaped model: 28 layers of hidden 1024, MLP 3072, vocab 151936, saved in bf16.
QWEN = replace(
    any_model(),
    source="qwen3-0.6b-shaped",
    model_class="Qwen3ForCausalLM",
    parameters=596_000_000,
    hidden_size=1024,
    num_layers=28,
    vocab_size=151_936,
    checkpoint_dtype="bfloat16",
    linear_names=("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"),
    linear_shapes=(
        ("down_proj", 3072, 1024, 28),
        ("gate_proj", 1024, 3072, 28),
        ("k_proj", 1024, 1024, 28),
        ("o_proj", 2048, 1024, 28),
        ("q_proj", 1024, 2048, 28),
        ("up_proj", 1024, 3072, 28),
        ("v_proj", 1024, 1024, 28),
    ),
)


def probe(prefill: dict[str, float], decode: dict[str, float], cast: float = 1e-3, **kw) -> DtypeProbe:
    """A probe with the given per-dtype seconds (1024x2048 weight, 128-token prefill)."""
    return DtypeProbe(
        in_features=1024,
        out_features=2048,
        prefill_tokens=128,
        prefill_s=tuple(prefill.items()),
        decode_s=tuple(decode.items()),
        cast_s=tuple((a, b, cast) for a in DTYPES for b in DTYPES if a != b),
        threads=8,
        measured_at="2026-12-03",
        **kw,
    )


# The two kinds of CPU seen on this project's machines (ratios from the design notes):
# an AVX2 EPYC (bf16 emulated: prefill ~5x slower, decode ~2x faster) and a Zen 4 / AMX CPU
# where bf16 is ~3x faster at both.
BF16_SLOW = probe(
    {"float32": 0.005, "bfloat16": 0.028, "float16": 0.024}, {"float32": 6e-4, "bfloat16": 3e-4, "float16": 2.7e-4}
)
BF16_FAST = probe(
    {"float32": 0.010, "bfloat16": 0.0035, "float16": 0.040}, {"float32": 6e-4, "bfloat16": 2e-4, "float16": 2.5e-4}
)


def cpu(dtype_probe: DtypeProbe | None = None, tuning=()) -> Machine:
    return Machine.simulated(None, dtype_probe=dtype_probe, tuning=tuning)


def plan_for(machine: Machine, model=QWEN, **request):
    return decide_plan(machine, model, Request(**request))


# ---- policy: measurements passed in -------------------------------------------------------


def test_a_cpu_where_bf16_is_slow_gets_float32_with_the_measured_reason() -> None:
    decision = plan_for(cpu(BF16_SLOW)).decision("dtype")
    assert decision.value == "float32"
    assert "bf16 matmul 5.6x slower than fp32 at prefill, 2.0x faster at decode" in decision.reason
    assert "probed on this CPU on 2026-12-03" in decision.reason
    rejected = {r.value: r.reason for r in decision.rejected}
    assert rejected["bfloat16"].startswith("est. ") and "slower than float32" in rejected["bfloat16"]


def test_a_cpu_where_bf16_is_fast_gets_bfloat16() -> None:
    decision = plan_for(cpu(BF16_FAST)).decision("dtype")
    assert decision.value == "bfloat16"
    assert "2.9x faster than fp32 at prefill" in decision.reason
    assert "slower than bfloat16" in {r.value: r.reason for r in decision.rejected}["float32"]


def test_the_workload_decides_when_prefill_and_decode_disagree() -> None:
    # bf16 slow at prefill, fast at decode: a long prompt wants fp32, a long generation bf16.
    assert plan_for(cpu(BF16_SLOW), workload=workload_from("prefill-heavy")).dtype == "float32"
    decode_heavy = plan_for(cpu(BF16_SLOW), workload=workload_from("decode-heavy"))
    assert decode_heavy.dtype == "bfloat16"
    assert "64-token prompt + 512 new tokens" in decode_heavy.decision("dtype").reason
    # Fine-tuning is forward + backward over whole sequences: prefill-shaped.
    training = plan_for(cpu(BF16_SLOW), training=TrainingRequest(quantize=None, seq_len=1024, batch_size=2))
    assert training.dtype == "float32" and "training steps over 2048 tokens" in training.decision("dtype").reason


def test_fp16_is_never_chosen_on_cpu_but_its_rejection_says_what_it_would_gain() -> None:
    fp16_fastest = probe(
        {"float32": 0.010, "bfloat16": 0.020, "float16": 0.002}, {"float32": 6e-4, "bfloat16": 3e-4, "float16": 1e-4}
    )
    # By hand, for QWEN (bf16 checkpoint) and the balanced workload (load + 512-token prompt + 128 new
    # tokens), in units of the probe's 1024 x 2048 weight: projections 28 x 7.5 = 210, lm_head
    # 151936 x 1024 = 74.1875, parameters 284.19.
    #   fp32: cast 1e-3 x 284.19 = 0.28 + prefill 0.010 x 512/128 x 210 + 6e-4 x 74.19 = 8.44
    #         + decode 127 x 6e-4 x (210 + 74.19) = 21.66 -> 30.38 s
    #   bf16: no cast + 0.020 x 4 x 210 + 3e-4 x 74.19 = 16.82 + 127 x 3e-4 x 284.19 = 10.83 -> 27.65 s
    #   fp16: 0.28 + 0.002 x 4 x 210 + 1e-4 x 74.19 = 1.69 + 127 x 1e-4 x 284.19 = 3.61 -> 5.58 s
    # bf16 is 30.38 / 27.65 = 1.10x fp32's speed: inside the 15% tie margin, so the checkpoint's bf16
    # stays; fp16, 5x faster still, is only offered.
    decision = plan_for(cpu(fp16_fastest)).decision("dtype")
    assert decision.value == "bfloat16"
    assert decision.reason.startswith(
        "tie: bf16 at 1.10x fp32's speed (one measurement; within the 15% tie margin), kept the checkpoint's bfloat16"
    )
    fp16 = {r.value: r.reason for r in decision.rejected}["float16"]
    assert fp16.startswith("est. 5.58 s, 5.0x faster than bfloat16") and "pass dtype='float16'" in fp16
    # A float32 checkpoint: fp32 loads without the cast (30.10 s), bf16 pays it (27.93 s): 1.08x, a
    # tie again, which now keeps float32.
    assert plan_for(cpu(fp16_fastest), replace(QWEN, checkpoint_dtype="float32")).dtype == "float32"
    assert plan_for(cpu(fp16_fastest), dtype="float16").dtype == "float16"  # yours when you ask


def test_a_bf16_checkpoint_cast_to_fp32_pays_for_the_conversion() -> None:
    # Identical matmul speed: only loading differs, and a bf16 checkpoint loads as bf16 for free.
    even = {"float32": 0.01, "bfloat16": 0.01, "float16": 0.01}
    tie = probe(even, {"float32": 1e-3, "bfloat16": 1e-3, "float16": 1e-3}, cast=5e-3)
    assert plan_for(cpu(tie)).dtype == "bfloat16"
    assert plan_for(cpu(tie), replace(QWEN, checkpoint_dtype="float32")).dtype == "float32"


def test_unmeasured_cpus_use_the_static_table_and_say_so() -> None:
    decision = plan_for(cpu(None)).decision("dtype")
    assert decision.value == "float32" and decision.reason.startswith("not measured here")


def test_an_explicit_dtype_is_kept_and_annotated_with_the_measurement() -> None:
    decision = plan_for(cpu(BF16_SLOW), dtype="bfloat16").decision("dtype")
    assert decision.value == "bfloat16" and decision.source == "user"
    assert "bf16 matmul 5.6x slower than fp32 at prefill, 2.0x faster at decode here" in decision.reason


def record(machine: Machine, rows: dict[tuple[str, str], tuple[float, float, float]], **kw) -> TuningRecord:
    return TuningRecord(
        model_key=kw.pop("model_key", QWEN.shape_key),
        prompt_tokens=256,
        new_tokens=64,
        variants=tuple(TunedVariant(d, a, *nums) for (d, a), nums in rows.items()),
        fingerprint=tuple(sorted(kw.pop("fingerprint", machine.fingerprint()).items())),
        measured_at="2026-12-03",
        path="/cache/tuning/x.json",
    )


# (load s, prefill s at 256 tokens, decode tok/s): bf16 wins end to end in this record.
BF16_WINS = {
    ("float32", "sdpa"): (0.30, 0.45, 21.0),
    ("bfloat16", "sdpa"): (0.03, 0.19, 32.0),
    ("float16", "sdpa"): (0.10, 1.40, 52.0),
}


def test_a_matching_tuning_record_beats_the_probe() -> None:
    machine = cpu(BF16_SLOW)  # the probe alone would say float32
    machine = replace(machine, tuning=(record(machine, BF16_WINS),))
    decision = plan_for(machine).decision("dtype")
    assert decision.value == "bfloat16"
    assert "cudaload bench --save" in decision.reason and "/cache/tuning/x.json" in decision.reason


def test_a_stale_tuning_record_is_ignored_and_the_reason_says_why() -> None:
    machine = cpu(BF16_SLOW)
    stale = record(machine, BF16_WINS, fingerprint={**machine.fingerprint(), "torch": "2.12.0"})
    decision = plan_for(replace(machine, tuning=(stale,))).decision("dtype")
    assert decision.value == "float32"  # the probe decides
    assert "stale: torch '2.12.0' there, '2.13.0' here" in decision.reason
    other = record(machine, BF16_WINS, model_key="another shape")
    assert "another model shape" in plan_for(replace(machine, tuning=(other,))).decision("dtype").reason


def test_on_a_gpu_a_record_picks_the_measured_winner_among_valid_options() -> None:
    a100 = Machine.simulated("A100", packages={"flash-attn": "2.8.3"})
    rows = {
        ("bfloat16", "flash_attention_2"): (0.5, 0.020, 90.0),
        ("bfloat16", "sdpa"): (0.5, 0.015, 95.0),
        ("float16", "sdpa"): (0.5, 0.016, 96.0),
        ("float32", "sdpa"): (0.1, 0.001, 500.0),  # never planned on a GPU: 2x memory
        ("bfloat16", "eager"): (0.1, 0.001, 900.0),  # the chain's last link, measured fastest here
    }
    tuned = plan_for(replace(a100, tuning=(record(a100, rows),)))
    assert (tuned.dtype, tuned.attn_implementation) == ("bfloat16", "eager")
    assert tuned.attention_chain == ("eager", "flash_attention_2", "sdpa")
    assert "measured" in tuned.decision("attn_implementation").reason
    # Your choice is never replaced by a measurement.
    mine = plan_for(replace(a100, tuning=(record(a100, rows),)), attn_implementation="sdpa")
    assert mine.attn_implementation == "sdpa"
    # Without a record the table decides.
    assert plan_for(a100).attention_chain == ("flash_attention_2", "sdpa", "eager")


@pytest.mark.parametrize("bad", ["fast", (0, 5), (-1, 2), (True, 3), (512,), 7])
def test_an_unknown_workload_is_refused_with_the_choices(bad) -> None:
    with pytest.raises(WorkloadError, match="balanced"):
        workload_from(bad)


def test_workloads_by_name_and_pair() -> None:
    assert workload_from(None) == Workload(512, 128)
    assert workload_from((100, 0)) == Workload(100, 0)
    assert workload_from("decode-heavy").new_tokens > workload_from("decode-heavy").prompt_tokens


# ---- the probe and its cache, on this CPU ---------------------------------------------------


def test_the_probe_times_every_dtype_on_this_cpu() -> None:
    measured = measure_dtypes(256, 512)
    for dtype in DTYPES:
        assert measured.prefill(dtype) > 0 and measured.decode(dtype) > 0
    assert all(seconds > 0 for _, _, seconds in measured.cast_s)
    assert measured.threads >= 1 and measured.cost_s > 0 and not measured.from_cache


def test_shape_buckets_are_coarse_and_bounded() -> None:
    assert shape_bucket(1024, 3072) == shape_bucket(896, 4864) == (1024, 2048)  # Qwen3-0.6B, Qwen2.5-0.5B
    assert shape_bucket(8192, 28672) == (1024, 2048)  # a 70B reuses the same probe
    assert shape_bucket(64, 128) == (256, 256)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "CUDALOAD_CACHE": str(tmp_path / "cache")}


def test_the_probe_is_cached_per_machine_fingerprint(tmp_path: Path) -> None:
    env = _env(tmp_path)
    machine = replace(detect(), threads=2)
    first = cached_dtype_probe(machine, (256, 256), env)
    again = cached_dtype_probe(machine, (256, 256), env)
    assert first is not None and again is not None
    assert not first.from_cache and again.from_cache and again.cost_s == 0
    assert again.prefill_s == first.prefill_s and again.fingerprint == first.fingerprint  # JSON floats round-trip
    # Another thread count (or CPU, torch, bucket) is another machine: measured again.
    other = cached_dtype_probe(replace(machine, threads=1), (256, 256), env)
    assert other is not None and not other.from_cache
    assert len(list((tmp_path / "cache" / "probes").glob("*.json"))) == 2


def test_a_corrupt_or_foreign_cache_file_is_measured_again_and_rewritten(tmp_path: Path) -> None:
    env = _env(tmp_path)
    machine = replace(detect(), threads=2)
    cached_dtype_probe(machine, (256, 256), env)
    (path,) = (tmp_path / "cache" / "probes").glob("*.json")
    for garbage in ("{not json", json.dumps([1, 2]), json.dumps({**json.loads(path.read_text() or "{}"), "schema": 0})):
        path.write_text(garbage)
        again = cached_dtype_probe(machine, (256, 256), env)
        assert again is not None and not again.from_cache
        assert json.loads(path.read_text())["kind"] == "cpu-dtype-probe"


def test_a_cache_path_that_is_a_file_measures_every_time_with_one_warning(tmp_path: Path) -> None:
    # A regular file where the cache folder should be: unwritable even for root (CI runs as root).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = {**os.environ, "CUDALOAD_CACHE": str(blocker)}
    machine = replace(detect(), threads=2)
    with pytest.warns(CudaloadWarning, match="CUDALOAD_PROBE=0"):
        first = cached_dtype_probe(machine, (256, 256), env)
    second = cached_dtype_probe(machine, (256, 256), env)
    assert first is not None and second is not None and not second.from_cache


def test_measure_for_skips_the_probe_when_asked(tmp_path: Path) -> None:
    env = _env(tmp_path)
    machine = detect()
    facts = QWEN
    assert measure_for(machine, facts, env={**env, "CUDALOAD_PROBE": "0"}).dtype_probe is None
    assert measure_for(machine, facts, probe=False, env=env).dtype_probe is None
    assert measure_for(machine, facts, dtype_chosen=True, env=env).dtype_probe is None


def test_ranks_measure_once_and_read_the_record_a_single_process_with_their_threads_reads(tmp_path: Path) -> None:
    # torchrun sets OMP_NUM_THREADS=1: a rank measures (the first to take the lock) with one thread, the
    # record a single process started with OMP_NUM_THREADS=1 reads too; the next rank reads it.
    import torch  # its thread count is the one measured with, and the one the fingerprint keys on

    env = {**_env(tmp_path), "OMP_NUM_THREADS": str(torch.get_num_threads())}
    machine = detect()
    facts = QWEN
    ranked = replace(machine, launch=cudaload.Launch(launcher="torchrun", world_size=2, local_world_size=2))
    first = measure_for(ranked, facts, env=env).dtype_probe
    assert first is not None and not first.from_cache
    second = measure_for(ranked, facts, env=env).dtype_probe
    assert second is not None and second.from_cache and second.prefill_s == first.prefill_s
    single = measure_for(machine, facts, env=env).dtype_probe
    assert single is not None and single.from_cache and single.prefill_s == first.prefill_s
    planned = plan_for(replace(ranked, dtype_probe=replace(second, threads=1), threads=1), facts).decision("dtype")
    assert "thread per rank (the record a single process with the same OMP_NUM_THREADS reads)" in planned.reason
    assert "probe off or a simulated machine" not in planned.reason


def test_tuning_records_round_trip_through_the_cache(tmp_path: Path) -> None:
    env = _env(tmp_path)
    machine = replace(detect(), threads=2)
    saved = record(machine, BF16_WINS)
    path = write_tuning_record(saved, env)
    assert path is not None and path.exists()
    (read,) = read_tuning_records(QWEN.shape_key, env)
    assert replace(read, path="") == replace(saved, path="") and read.path == str(path)
    assert read_tuning_records("another shape", env) == ()
    path.write_text("{")  # corrupt: skipped, not a crash
    assert read_tuning_records(QWEN.shape_key, env) == ()


# ---- plan() and load() on this machine ------------------------------------------------------


def test_plan_probes_once_then_reads_the_cache(tiny_models, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    first = cudaload.plan(str(tiny_models["qwen3"]))
    assert first.timings["probe"] > 0
    assert "probed on this CPU" in first.decision("dtype").reason
    second = cudaload.plan(str(tiny_models["qwen3"]))
    assert "probe" not in second.timings and "(cached)" in second.decision("dtype").reason
    assert second.dtype == first.dtype
    off = cudaload.plan(str(tiny_models["qwen3"]), probe=False)
    assert off.decision("dtype").reason.startswith("not measured here")


def test_load_records_the_probe_time(tiny_models, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDALOAD_CACHE", str(tmp_path / "cache"))
    model = cudaload.load(str(tiny_models["llama"]))
    applied = model.cudaload_plan
    assert applied.timings["probe"] > 0 and applied.dtype == applied.plan.dtype
    assert str(model.dtype).removeprefix("torch.") == applied.plan.dtype
