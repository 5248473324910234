"""`cudaload doctor` (this machine, and what loading gets here) and `cudaload probe` (the CPU dtype
measured again, and what changed)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import CudaloadError
from ..facts.machine import DtypeProbe, Machine
from ..facts.torchao_import import torchao_import_note
from ..plans import jsonable

__all__ = ["doctor_report", "fit", "remeasure_report"]


def _gib(n: int | None) -> str:
    from ..policy import format_bytes

    return "?" if n is None else format_bytes(n)


def _backends(machine: Machine) -> dict[str, Any]:
    """What a plan for a generic model would choose here: the policy decides, doctor prints."""
    from ..facts.model import reference_model
    from ..planner import plan

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
    from ..capability.hub_access import check_hub_reachable

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
        f"  dtype probe: F.linear {probe.in_features}x{probe.out_features} in CPU time, one thread for a model on "
        f"{probe.threads} threads, "
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


def _bitsandbytes_fetch(machine: Machine) -> list[str]:
    """bitsandbytes (0.48 to 0.50.2) fetches a Hub kernel when it is imported on an AVX512-BF16 CPU with `kernels`
    installed (upstream_imports.py): say what a script must do, on the CPUs where it matters."""
    sw = machine.software
    if "avx512_bf16" not in machine.cpu.flags or not (sw.has("bitsandbytes") and sw.has("kernels")):
        return []
    return [
        "  bitsandbytes asks the Hub for kernels-community/quantization-bitsandbytes when imported on this CPU "
        "(AVX512-BF16): in your scripts call cudaload.load_for_finetune() (or cudaload.load()) before importing "
        "peft, trl or transformers' Trainer, or set HF_HUB_OFFLINE=1"
    ]


def _platform_lines() -> list[str]:
    """Python, the OS and the C library first, as `transformers env` opens (what a bug report needs first)."""
    import platform

    libc, libc_version = platform.libc_ver()
    return [
        f"Python {platform.python_version()} ({platform.python_implementation()}), {platform.platform(terse=True)}, "
        f"{platform.machine()}, {f'{libc} {libc_version}' if libc else 'libc: unknown'}"
    ]


def _probe_verdict(probe: DtypeProbe) -> str:
    ratios = [
        f"{(timing('float32') or 0) / (timing('bfloat16') or 1):.2f}x at {phase}"
        for phase, timing in (("prefill", probe.prefill), ("decode", probe.decode))
    ]
    return f"{probe.measured_at}, {probe.confidence}: bf16 at {' and '.join(ratios)} fp32's speed ({probe.conditions})"


def remeasure_report(model: str | None, waiting: Callable[[str], None] | None = None) -> str:
    """`cudaload probe [MODEL]`, `doctor --remeasure`: measure the CPU dtype again, say what changed."""
    from ..capability import detect
    from ..capability.dtype_probe import kept_in_memory_only, remeasure, shape_bucket, torch_threads
    from ..capability.model_config import read_model_facts
    from ..capability.probe_record import probe_path
    from ..facts.model import reference_model
    from ..planner import plan

    machine = detect()
    if machine.usable().gpus:
        return "cudaload probe: a GPU decides the dtype here; the CPU dtype probe is not used"
    facts = reference_model() if model is None else read_model_facts(model)
    machine = replace(machine, threads=torch_threads(None, machine.cpu.cores, machine.cpu.physical_cores))
    bucket = shape_bucket(facts.hidden_size, facts.intermediate_size)
    before, after = remeasure(machine, bucket, waiting=waiting, model=facts.source)
    path = probe_path(machine, bucket)
    kept = f"  recorded in {path}"
    if kept_in_memory_only(path) and (after.confidence == "quiet" or before is None or before.confidence != "quiet"):
        kept = (
            f"  not recorded: {path} could not be written (the warning above says why); this measurement holds "
            "for this process only"
        )
    elif after.confidence != "quiet":
        kept = (
            "  not recorded: disturbed numbers do not replace the quiet record above"
            if before is not None and before.confidence == "quiet"
            else "  recorded as disturbed for 2 minutes: its numbers are not used"
        ) + "; run again when the machine is quiet"
    dtype = plan(facts).decision("dtype")
    return fit(
        [
            f"cudaload probe: F.linear {bucket[0]}x{bucket[1]} on {machine.cpu.model} in CPU time, one thread for a "
            f"model on {after.threads} threads (OMP_NUM_THREADS sets them; torchrun ranks use 1), for {facts.source}",
            f"  before: {_probe_verdict(before) if before else 'nothing recorded'}",
            f"  now:    {_probe_verdict(after)} (measured in {after.cost_s:.1f} s)",
            kept,
            f"  dtype now planned: {dtype.value}: {dtype.reason}",
        ]
    )


def doctor_report(machine: Machine, as_json: bool, check_hub: bool = False, width: int | None = None) -> str:
    from ..capability import measure_for
    from ..facts.model import reference_model
    from ..policy import usable_machine

    # What a plan may use here: GPUs this torch cannot drive are reported and planned around.
    usable, device_warnings = usable_machine(machine)
    machine = replace(
        measure_for(machine, reference_model(), on_cpu=not usable.gpus),
        warnings=(*machine.warnings, *device_warnings),
    )
    backends = _backends(replace(machine, gpus=usable.gpus))
    if check_hub:
        from ..announce import announce

        announce("cudaload.doctor", "doctor: asking the Hub whether each kernel can be fetched now (network)")
    reachable = _hub_reachability(machine) if check_hub else None
    if as_json:
        return json.dumps(
            jsonable({"machine": dataclasses.asdict(machine), "backends": backends, "hub_reachable": reachable}),
            indent=2,
        )
    sw = machine.software
    lines = ["cudaload doctor", "", *_platform_lines(), "", "GPUs (as this process sees them):"]
    if not machine.gpus:
        lines.append("  none" + (f"  ({'; '.join(machine.gpu_notes)})" if machine.gpu_notes else ""))
    for g in machine.gpus:
        lines.append(
            f"  {g.device}  {g.name}  {g.sm}  {_gib(g.free_memory)} free / {_gib(g.total_memory)}"
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
    torchao = torchao_import_note(sw)
    if torchao is not None:
        lines.append(f"  {torchao}")
    lines += ["", f"Hub: {'offline (HF_HUB_OFFLINE)' if machine.hub.offline else 'online mode'}"]
    lines += [f"  {k.repo} v{k.version}: {k.detail}" for k in machine.hub.kernels]
    lines += _bitsandbytes_fetch(machine)
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
    lines += [
        "",
        "Next: cudaload plan MODEL (a local folder or Hub id) shows what loading it gets here and why; "
        "cudaload demo --tiny loads a tiny model end to end.",
    ]
    return fit(lines, width)


def fit(lines: list[str], width: int | None = None) -> str:
    """`lines` wrapped for the terminal (`width` None: its width), each continuation 6 past its line's
    indentation, and the library's hints in the CLI's flags."""
    from ..plans.layout import cli_hints, terminal_width, wrap

    width = terminal_width(width)
    out: list[str] = []
    for line in lines:
        text = cli_hints(line)
        indent = text[: len(text) - len(text.lstrip(" "))]
        out += wrap(text.strip(), width, indent, hang=6) if len(text) > width else [text]
    return "\n".join(out)
