"""`Plan`: the from_pretrained keyword arguments, the attention fallback chain and one Decision per setting."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any

from ..frozen import frozen
from .check_proof import CheckProof
from .decision import Decision, ReadOnlyDict, decision_lines, jsonable, read_only
from .sections import ApplyFacts, FinetunePlan, GenerationPlan, TokenizerPlan

__all__ = ["Plan"]


@frozen
class Plan:
    """What `plan()` decided: the exact from_pretrained keyword arguments and the reason for each.

    A Plan loads nothing; pass it to `load()` (or read `load()`'s `model.cudaload_plan.plan`).
    It is frozen and JSON-ready (`to_dict()`, `to_json()`); `explain()` (also `str(plan)`) prints
    one line per setting with its reason and the rejected options below it.

    Attributes:
        model: The model as given (local path or Hub id; for a PretrainedConfig its name).
        machine: One line describing the machine planned for (`Machine.describe()`).
        kwargs: The `from_pretrained` keyword arguments, JSON-ready (dtype as a string,
            quantization as BitsAndBytesConfig arguments); `cudaload.from_pretrained_kwargs(plan)`
            gives the objects transformers takes.
        attention_chain: Attention implementations to try in order; the first is the choice,
            the rest are what `load()` falls back to.
        decisions: One `Decision` per setting.
        warnings: Settings that work but cost you (load() issues each as a CudaloadWarning).
        explicit: Settings the caller set: they never fall back.
        model_class: The model's class as transformers resolves it (e.g. "Qwen3ForCausalLM").
        auto_class: The transformers Auto class it loads through (e.g. "AutoModelForCausalLM");
            `load(plan)` uses it.
        parameters: The model's parameter count (tied weights once); None when unknown.
        weight_bytes: The weights' size in memory as planned (dtype and quantization applied).
        finetune: The fine-tuning section (`FinetunePlan`); None for inference plans.
        timings: Seconds spent planning on measurements: "probe" when the CPU dtype probe ran
            (not cached).
        generation: Generation settings (`GenerationPlan`); None for plans that do not generate
            (fine-tuning, encoders, `generate=False`).
        generation_fallbacks: The generation section decided for each later link of the
            attention chain, as (attention, GenerationPlan) pairs: `load()` takes the one of the
            attention it really applied (`generation_for`); not part of the plan's value
            (equality, hash, `to_dict()`).
        tokenizer: How the model's tokenizer is set up (`TokenizerPlan`); not part of the plan's value.
        hub_code: The caller consented to Hub code when planning (hub_kernels=True or
            use_kernels=True); not part of the plan's value.
        check_proof: Where the record of a passed test forward for this plan lives and whether one is
            there (`CheckProof`; `check_proven` says it in words); None for a plan the record does not
            apply to (a simulated machine, a Hub id, fine-tuning). Not part of the plan's value.
        assumed_packages: For a simulated machine, the packages planned with and where they come
            from (`Software.assumed`: "as installed here", or the defaults, and what you changed);
            None for this machine.
        apply_facts: What applying the plan needs to know of the process that made it (`ApplyFacts`:
            this machine, its cached Hub kernels, the installed transformers' API); not part of the
            plan's value.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> plan = cudaload.plan(path, machine=cudaload.Machine.simulated("A100"))
        >>> plan.kwargs
        {'dtype': 'bfloat16', 'attn_implementation': 'sdpa', 'device_map': 'cuda:0', 'use_kernels': False}
        >>> plan.attention_chain, plan.machine
        (('sdpa', 'eager'), '1x NVIDIA A100-SXM4-80GB (sm_80)')
        >>> text = plan.explain(width=100)  # default: the terminal's width
        >>> "simulated machine's packages," in text  # a simulated machine: its packages
        True
        >>> next(line for line in text.splitlines() if line.startswith("  dtype")).split()[:8]
        ['dtype', 'bfloat16', 'NVIDIA', 'A100-SXM4-80GB', '(sm_80)', 'runs', 'bf16', 'natively:']
        >>> text.splitlines()[-1].endswith('use_kernels=False)')  # last, the call the plan stands for
        True
    """

    model: str
    machine: str
    """One line describing the machine planned for."""
    kwargs: Mapping[str, Any]
    """The `from_pretrained` keyword arguments, JSON-ready."""
    attention_chain: tuple[str, ...]
    """Attention implementations to try in order; the first is the choice."""
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...] = ()
    explicit: frozenset[str] = frozenset()
    """Settings the caller set: they never fall back."""
    model_class: str = "AutoModelForCausalLM"
    auto_class: str = "AutoModelForCausalLM"
    parameters: int | None = None
    weight_bytes: int | None = None
    finetune: FinetunePlan | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent planning on measurements: "probe" when the CPU dtype probe ran (not cached)."""
    generation: GenerationPlan | None = None
    """Generation settings (KV cache, batch x context that fits, cache implementation, compile,
    padding side), each a Decision; None for plans that do not generate (fine-tuning, encoders)."""
    assumed_packages: str | None = None
    """For a simulated machine, its packages and where they come from; None for a detected machine."""
    generation_fallbacks: tuple[tuple[str, GenerationPlan], ...] = field(default=(), compare=False, repr=False)
    """The generation section the policy decided for each later link of `attention_chain` (not part of
    the plan's value, not in `to_dict()`): `load()` selects the one of the attention it applied. A plan
    rebuilt without them (e.g. from its JSON) keeps `generation` whatever it falls back to."""
    tokenizer: TokenizerPlan | None = field(default=None, compare=False, repr=False)
    """How the model's tokenizer is set up (padding sides, pad token), applied by `tokenizer_for()`; not part
    of the plan's value, not in `to_dict()`. None for a plan rebuilt without it (e.g. from its JSON)."""
    check_proof: CheckProof | None = field(default=None, compare=False, repr=False)
    """Where the record of a passed test forward lives and whether one is there (`load()` then skips the
    forward); None when no record applies (a simulated machine, a Hub id, fine-tuning). Not in `to_dict()`."""
    hub_code: bool = field(default=False, compare=False, repr=False)
    """The caller consented to Hub code (hub_kernels=True or use_kernels=True) when planning; a plan
    rebuilt without it (e.g. from its JSON) carries no consent beyond its kwargs."""
    apply_facts: ApplyFacts | None = field(default=None, compare=False, repr=False)
    """What applying the plan needs to know of the process that made it, filled by the planner; not part of
    the plan's value, not in `to_dict()`. None for a plan built by hand or rebuilt from its JSON."""

    def __post_init__(self) -> None:
        # Frozen means frozen: kwargs is what load() applies, so it must not change behind the decisions.
        if not isinstance(self.kwargs, ReadOnlyDict):
            object.__setattr__(self, "kwargs", read_only(self.kwargs))

    def __hash__(self) -> int:  # kwargs is a dict: hash the plan's JSON value, which equality agrees with
        return hash(self.to_json())

    def decision(self, setting: str) -> Decision:
        """The Decision for `setting` (e.g. "dtype"); KeyError when the plan has none."""
        for d in self.decisions:
            if d.setting == setting:
                return d
        raise KeyError(setting)

    @property
    def check_proven(self) -> str | None:
        """ "proven on this machine at <time> for <versions>" when, as planned, `load()` would skip the test
        forward (a record of it passing under the same config, weights, kwargs, versions and machine); else
        None. `load()` judges it again when applying (plans/check_proof.py `judge`)."""
        return self.check_proof.proven if self.check_proof is not None else None

    @property
    def attn_implementation(self) -> str:
        return str(self.kwargs["attn_implementation"])

    @property
    def dtype(self) -> str:
        return str(self.kwargs["dtype"])

    @property
    def extras(self) -> dict[str, Any]:
        """The plan's facts that are not from_pretrained kwargs, as one JSON-ready dict (the
        "extras" of `to_dict()`): "parameters", "model_class", "weight_bytes", and for a
        fine-tuning plan the `FinetunePlan` keys ("lora", "training_arguments",
        "memory_estimate", "gradient_checkpointing", after loading "trainable_parameters").
        Read the typed attributes in code; this is the stable JSON view."""
        out: dict[str, Any] = {"parameters": self.parameters, "model_class": self.model_class}
        if self.finetune is not None:
            out |= self.finetune.to_dict()
        if self.weight_bytes is not None:
            out["weight_bytes"] = self.weight_bytes
        return out

    def generation_for(self, attention: str) -> GenerationPlan | None:
        """The generation section for `attention`: `generation` for the first link of the chain, the
        policy's own entry for a later link (`generation_fallbacks`), else `generation` unchanged."""
        if attention == self.kwargs.get("attn_implementation"):
            return self.generation
        return dict(self.generation_fallbacks).get(attention, self.generation)

    def with_attention(self, implementation: str) -> Plan:
        """This plan with another attention implementation (used when falling back)."""
        return replace(self, kwargs={**self.kwargs, "attn_implementation": implementation})

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "machine": self.machine,
            "kwargs": jsonable(self.kwargs),
            "attention_chain": list(self.attention_chain),
            "decisions": [d.to_dict() for d in self.decisions],
            "warnings": list(self.warnings),
            "extras": jsonable(self.extras),
            "timings": dict(self.timings),
            "generation": self.generation.to_dict() if self.generation is not None else None,
            "assumed_packages": self.assumed_packages,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def explain(self, width: int | None = None, *, cli: bool = False) -> str:
        """A short table: one line per setting with its reason, rejected options indented below, and last
        the `from_pretrained(...)` call the plan stands for.

        Args:
            width: Columns to fit (None: the terminal's, COLUMNS, else 100). Reasons wrap under their
                column; values and words are never cut (a longer word, e.g. a path, sticks out).
            cli: Hints name the CLI's flags (`--hub-kernels`) instead of Python's (`hub_kernels=True`).
        """
        from .layout import call_lines, cli_hints, terminal_width, wrap

        width = terminal_width(width)

        from ..facts.simulated import TESTED_VERSIONS

        # On a simulated machine the CLI's way to have a package is --with PKG==VERSION, not pip install.
        simulated = TESTED_VERSIONS if self.assumed_packages is not None else None

        def said(text: str) -> str:
            return cli_hints(text, simulated) if cli else text

        # Every continuation line hangs 6 or more in, below any row's start: a reader (and the docs' check)
        # tells a wrapped line from the next row by its indentation.
        lines = wrap(f"cudaload plan for {self.model} on {self.machine}", width, hang=6)
        if self.assumed_packages is not None:
            lines += wrap(f"simulated machine's packages, {self.assumed_packages}", width, "  ", hang=6)
        lines += decision_lines(self.decisions, width=width, cli=cli, simulated=simulated)
        estimate = self.finetune.memory_estimate if self.finetune is not None else None
        if estimate:
            assumes = estimate["assumes"]
            lines.append(
                f"  training memory estimate (seq_len {assumes['seq_len']}, batch {assumes['batch_size']}, "
                f"checkpointing {'on' if assumes['gradient_checkpointing'] else 'off'}):"
            )
            pad = max(5, *(len(option) for option in estimate if option != "assumes"))  # "torchao-int8" is 12
            full = self.finetune is not None and self.finetune.train == "full"
            for option, parts in estimate.items():
                if option != "assumes":
                    detail = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts.items() if k != "total")
                    label = f"{'full':<{pad + 5}}" if full else f"{option:<{pad}} LoRA"  # full: unquantized only
                    row = f"{label}  {parts['total'] / 2**30:7.2f} GiB  ({detail})"
                    lines += wrap(row, width, "    ", 17 + pad)
        if len(self.attention_chain) > 1:
            lines += wrap(f"attention fallback chain: {' -> '.join(self.attention_chain)}", width, "  ", hang=6)
        if self.generation is not None:
            lines += self.generation.explain_lines(width, cli=cli)
        for warning in self.warnings:
            lines += wrap(f"WARNING: {said(warning)}", width, "  ", hang=9)
        device_map = self.kwargs.get("device_map")
        per_rank = isinstance(device_map, dict) and list(device_map) == [""] and isinstance(device_map[""], int)
        # A rank's own GPU: what rank 0 passes is shown, and each rank passes its own LOCAL_RANK (issue 46).
        said_rank = ', on rank 0: each rank passes device_map={"": LOCAL_RANK}' if per_rank else ""
        then = "" if self.finetune is None else "then LoRA on top" if self.finetune.lora is not None else "then trained"
        notes = "; ".join(n for n in (then, said_rank.removeprefix(", ")) if n)
        lines += wrap(f"loads as{f' ({notes})' if notes else ''}:", width, "  ", hang=6)
        lines += call_lines(f"{self.auto_class}.from_pretrained", self.model, self.kwargs, width, "    ")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()
