"""The sections of a Plan: `FinetunePlan` (what load_for_finetune() applies) and `GenerationPlan` (the
generation settings), each JSON-ready; `TokenizerPlan` and `ApplyFacts` (what applying the plan needs to know
of the process that made it), which are not part of the plan's value."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from ..facts.dtypes import BYTES
from ..facts.kv_cache import GenerationFacts
from ..frozen import frozen
from .decision import Decision, decision_lines, jsonable

__all__ = ["ApplyFacts", "FinetunePlan", "GenerationPlan", "TokenizerPlan"]


@frozen
class FinetunePlan:
    """The fine-tuning section of a Plan (`plan.finetune`): what `load_for_finetune()` applies.

    Attributes:
        lora: `peft.LoraConfig` keyword arguments (the "lora" decision's value); None for full training.
        training_arguments: `TrainingArguments` keyword arguments (`training_arguments()` returns
            them, with yours on top).
        memory_estimate: The training-memory estimate per quantization option ("16bit" and each
            method's choice: "4bit", "8bit", "torchao-int8"; each a dict of bytes with a "total"), and
            under "assumes" the sequence length, batch size and checkpointing it assumes. Full training has
            "16bit" only (unquantized, whatever the dtype), with "gradients" and "optimizer" instead of "lora".
        gradient_checkpointing: Activation checkpointing is on.
        checkpointing_kwargs: The keyword arguments checkpointing is enabled with on the model
            (the planned `..._checkpointing_kwargs` training argument).
        use_cache: The model's `config.use_cache` while training (the "use_cache" decision).
        trainable_parameters: The trained parameters' count (the adapters', or every weight's in full
            training), known once `load_for_finetune()` has loaded the model; None in a plan that loaded nothing.
        parallelism: For a job of several ranks (`nodes=`, or planned inside a launch): the layout, each
            rank's budget and every strategy's per-rank bytes, bytes sent per step and time estimates
            (the "parallelism" decision's numbers); None for one process.
        train: "lora" (adapters on a frozen base) or "full" (every weight trained): the "train" decision.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> a100 = cudaload.Machine.simulated("A100")
        >>> section = cudaload.plan(path, machine=a100, finetune=True).finetune
        >>> section.lora["r"], section.gradient_checkpointing, section.checkpointing_kwargs, section.use_cache
        (16, True, {'use_reentrant': False}, False)
        >>> section.training_arguments["bf16"], section.trainable_parameters
        (True, None)
        >>> cudaload.plan(path, machine=a100).finetune is None  # an inference plan has no section
        True
    """

    lora: Mapping[str, Any] | None
    training_arguments: Mapping[str, Any]
    memory_estimate: Mapping[str, Any]
    gradient_checkpointing: bool
    checkpointing_kwargs: Mapping[str, Any] = field(default_factory=dict)
    use_cache: bool = False
    trainable_parameters: int | None = None
    parallelism: Mapping[str, Any] | None = None
    train: str = "lora"

    def to_dict(self) -> dict[str, Any]:
        """The section as the fine-tuning keys of `Plan.to_dict()["extras"]` (stable since 0.1; "train" since
        full training: "lora" is then None)."""
        out: dict[str, Any] = {
            "train": self.train,
            "lora": jsonable(self.lora),
            "training_arguments": jsonable(self.training_arguments),
            "memory_estimate": jsonable(self.memory_estimate),
            "gradient_checkpointing": self.gradient_checkpointing,
        }
        if self.trainable_parameters is not None:
            out["trainable_parameters"] = self.trainable_parameters
        if self.parallelism is not None:
            out["parallelism"] = jsonable(self.parallelism)
        return out


@frozen
class GenerationPlan:
    """The generation settings of a Plan (`plan.generation`), each a Decision with its reason.

    - `generate_kwargs`: what to pass to `model.generate(...)` to get the planned cache (empty when
      transformers' own default is the plan).
    - `padding_side`: the tokenizer padding side for batched inputs ("left" for decoder-only).
    - `kv_bytes_per_token`, `max_batch`, `max_context`: the KV-cache arithmetic behind the decisions.

    Built by `plan(..., generate=True)` (and by `load()` for a causal or seq2seq LM; the policy
    decides one for each link of the attention chain, and after a fallback `load()` keeps the one
    of the attention really applied); `explain()`
    shows its decisions.

    Attributes:
        decisions: One `Decision` per generation setting: "generation.kv_cache",
            "generation.max_batch", "generation.cache_implementation", "generation.compile",
            "generation.continuous_batching", "generation.padding_side".
        generate_kwargs: What to pass to `model.generate(...)` to get the planned cache (e.g.
            `{"cache_implementation": "static"}`); empty when transformers' own default is the plan.
        padding_side: The tokenizer padding side for batched inputs: "left" for decoder-only
            models, "right" for encoder-decoder ones, or yours (`tokenizer_for()` follows it).
        cache_implementation: The planned cache: "dynamic", "static", "offloaded",
            "offloaded_static", "quantized" (yours, or the checkpoint's generation_config), or
            None when the model builds its own cache.
        compile: generate() will torch.compile the forward (upstream's `_valid_auto_compile_criteria`).
        context: The context (prompt + new tokens) `max_batch` is computed for.
        kv_bytes_per_token: Bytes one token of one sequence adds to the KV cache, all caching
            layers (within windows).
        max_batch: Sequences of `context` tokens whose KV cache fits in the budget; None when
            memory is unknown.
        max_context: The longest single sequence whose KV cache fits (capped at the model's max
            positions); None when memory is unknown.
        budget_bytes: Bytes the KV cache may use: a share of the GPU memory (or, on a CPU, the
            RAM) left beside the weights; None when unknown.
        dtype: The dtype the KV cache is sized in (the model's).
        facts: The model's generation facts (KV layout, max positions) the decisions used.
        warnings: Generation settings that work but cost you (also shown by the plan's explain()).

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> h100 = cudaload.Machine.simulated("H100")
        >>> generation = cudaload.plan(path, machine=h100, generate=True, workload="decode-heavy").generation
        >>> generation.cache_implementation, generation.compile, generation.generate_kwargs
        ('static', True, {'cache_implementation': 'static'})
        >>> generation.kv_bytes_per_token, generation.max_context  # 2 layers x K+V x 2 kv heads x 16 x 2 bytes
        (256, 256)
        >>> generation.decision("generation.padding_side").value
        'left'
    """

    decisions: tuple[Decision, ...]
    generate_kwargs: Mapping[str, Any]
    padding_side: str
    cache_implementation: str | None
    compile: bool
    """generate() will torch.compile the forward (upstream's `_valid_auto_compile_criteria`)."""
    context: int
    """The context (prompt + new tokens) `max_batch` is computed for."""
    kv_bytes_per_token: int
    """Bytes one token of one sequence adds to the KV cache, all caching layers (within windows)."""
    max_batch: int | None
    """Sequences of `context` tokens whose KV cache fits in the budget; None when memory is unknown."""
    max_context: int | None
    """The longest single sequence whose KV cache fits (capped at the model's max positions)."""
    budget_bytes: int | None
    dtype: str
    facts: GenerationFacts
    warnings: tuple[str, ...] = ()

    def decision(self, setting: str) -> Decision:
        for d in self.decisions:
            if d.setting == setting:
                return d
        raise KeyError(setting)

    def kv_cache_bytes(self, batch: int, context: int) -> int:
        """KV-cache bytes for `batch` sequences of `context` tokens in the plan's dtype."""
        return self.facts.kv_bytes(batch, context, BYTES.get(self.dtype, 4))

    def to_dict(self) -> dict[str, Any]:
        return {
            "generate_kwargs": jsonable(self.generate_kwargs),
            "padding_side": self.padding_side,
            "cache_implementation": self.cache_implementation,
            "compile": self.compile,
            "context": self.context,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_batch": self.max_batch,
            "max_context": self.max_context,
            "budget_bytes": self.budget_bytes,
            "dtype": self.dtype,
            "layers": [
                {
                    "layer_type": g.layer_type,
                    "count": g.count,
                    "elements_per_token": g.elements_per_token,
                    "window": g.window,
                }
                for g in self.facts.layers
            ],
            "decisions": [d.to_dict() for d in self.decisions],
            "warnings": list(self.warnings),
        }

    def explain_lines(self, width: int | None = None, cli: bool = False) -> list[str]:
        """The generation block of `Plan.explain()`, laid out for `width` columns (None: the terminal's)."""
        from .layout import cli_hints, terminal_width, wrap

        width = terminal_width(width)
        lines = [f"  generation (context {self.context} tokens):"]
        lines += decision_lines(self.decisions, indent="    ", mark_yours=True, width=width, cli=cli)
        for w in self.warnings:
            lines += wrap(f"WARNING: {cli_hints(w) if cli else w}", width, "    ", hang=9)
        return lines

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@frozen
class TokenizerPlan:
    """How the model's tokenizer is set up (`Plan.tokenizer`), each a Decision: `tokenizer_for()` applies it.

    Attributes:
        padding_side: The padding side for inference: "left" for a generating model (the generation
            section's decision when the plan has one), None for another model (the tokenizer's own).
        training_padding_side: The padding side for training ("right").
        pad_token: What pads when the tokenizer has no pad token ("eos").

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> tokenizer = cudaload.plan(build_tiny_model(tempfile.mkdtemp())).tokenizer
        >>> tokenizer.side(training=False), tokenizer.side(training=True), tokenizer.pad_token.value
        ('left', 'right', 'eos')
    """

    padding_side: Decision
    training_padding_side: Decision
    pad_token: Decision

    def side(self, training: bool) -> str | None:
        """The padding side to set: for training or inference; None keeps the tokenizer's own."""
        value = (self.training_padding_side if training else self.padding_side).value
        return None if value is None else str(value)


@frozen
class ApplyFacts:
    """What applying a Plan needs to know of the process that made it, gathered by the planner so that
    `apply_plan()` and `load_for_finetune()` probe nothing (`Plan.apply_facts`; not part of the plan's value,
    not in `to_dict()`). A Plan built by hand or rebuilt from its JSON has none: it is applied with these
    defaults, which assume nothing about the machine.

    Attributes:
        machine_here: The machine the planning process runs on (`Machine.describe()` as its torch can use
            it) when the plan was made for that machine (`plan()` without `machine=`); None for a machine you
            passed, whose plan a load failure then says may be another machine's.
        cached_kernels: The Hub attention kernel repositories in that machine's cache, for the check that
            loading fetches no Hub code the plan did not allow; empty for a machine you passed (a simulated
            machine's cache is not this one's).
        tensor_parallel_argument: How the installed transformers takes the plan's `tp_plan`:
            "distributed_config" (`DistributedConfig(tp_plan=...)`; a bare `tp_plan=` warns there) or
            "tp_plan" (older 5.x); None when the plan has no `tp_plan` (then it is passed as it is).
        checkpointing_method: The installed transformers' name for checkpointing on a model,
            "activation_checkpointing" (5.23 on) or "gradient_checkpointing"; None when the plan does not
            checkpoint (a fine-tuning plan without one checkpoints under the old name).
    """

    machine_here: str | None = None
    cached_kernels: frozenset[str] = frozenset()
    tensor_parallel_argument: str | None = None
    checkpointing_method: str | None = None
