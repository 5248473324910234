"""The Plan: the single contract between the policy (which decides) and the loaders (which apply).

A Plan holds the exact `from_pretrained` keyword arguments (JSON-ready: dtypes as strings,
quantization as the BitsAndBytesConfig keyword arguments), the attention fallback chain,
and one Decision per setting: its value, why, and what was rejected and why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NoReturn

from .facts.dtypes import BYTES
from .facts.kv_cache import GenerationFacts

__all__ = [
    "Decision",
    "DecisionSource",
    "FinetunePlan",
    "GenerationPlan",
    "Plan",
    "ReadOnlyDict",
    "Rejected",
    "decision_lines",
    "jsonable",
    "mutable",
    "read_only",
]


class ReadOnlyDict(dict[str, Any]):
    """A dict that refuses changes: a frozen Plan's `kwargs` (nested mappings too). It is still a dict to
    JSON, `==`, `**` unpacking and `dict(...)` (which gives a mutable copy to change).

    Without it `plan.kwargs["dtype"] = "float16"` changed a frozen Plan, and `load(plan)` applied part of
    the change while the decisions and explain() kept the old value.
    """

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            "Plan.kwargs is read-only: a Plan is frozen and load() applies it as planned. Plan again with the "
            "setting you want (cudaload.plan(model, dtype=...)), or pass dict(plan.kwargs) with your change to "
            "from_pretrained yourself."
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and deepcopy rebuild it whole, never item by item
        return (type(self), (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(jsonable(self), sort_keys=True))


def read_only(value: Any) -> Any:
    """`value` with every plain mapping in it (a dict, e.g. max_memory or a quantization config) made a
    ReadOnlyDict; other objects (yours, passed through) are kept as they are."""
    if isinstance(value, Mapping) and not isinstance(value, ReadOnlyDict):
        return ReadOnlyDict({k: read_only(v) for k, v in value.items()})
    return value


def mutable(value: Any) -> Any:
    """A ReadOnlyDict (nested ones too) as plain dicts, for code that changes what it is given
    (accelerate's `get_max_memory` converts a max_memory dict's sizes in place)."""
    if isinstance(value, ReadOnlyDict):
        return {k: mutable(v) for k, v in value.items()}
    return value


DecisionSource = Literal["auto", "user"]
"""Who made a Decision: cudaload ("auto") or the caller ("user")."""


@dataclass(frozen=True)
class Rejected:
    """An option a Decision did not take, and why (shown indented with an "x" by `explain()`).

    Attributes:
        value: The option (e.g. "float16", "flash_attention_2", "auto").
        reason: Why it was not taken on this machine for this model.

    Examples:
        >>> import cudaload
        >>> cudaload.Rejected("float16", "narrower range").reason
        'narrower range'
    """

    value: Any
    reason: str


@dataclass(frozen=True)
class Decision:
    """One setting of a plan: its value, why, and what was rejected and why.

    Attributes:
        setting: The setting's name: a from_pretrained keyword ("dtype", "attn_implementation",
            "device_map", "max_memory", "use_kernels", or one you passed through), a fine-tuning
            setting ("quantize", "lora", ...), or for `GenerationPlan` one prefixed
            "generation." (e.g. "generation.cache_implementation").
        value: The chosen value (JSON-ready: a dtype is a string such as "bfloat16").
        reason: Why, in one line.
        rejected: The options not taken, each with its reason (empty for your own choices).
        source: "auto" when cudaload decided, "user" when the caller set it.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> plan = cudaload.plan(path, machine=cudaload.Machine.simulated("A100"), dtype="float16")
        >>> plan.decision("dtype")
        Decision(setting='dtype', value='float16', reason='your choice', rejected=(), source='user')
        >>> decision = cudaload.plan(path, machine=cudaload.Machine.simulated("T4")).decision("dtype")
        >>> decision.value, decision.source, [r.value for r in decision.rejected]
        ('float16', 'auto', ['bfloat16', 'float32'])
    """

    setting: str
    value: Any
    reason: str
    rejected: tuple[Rejected, ...] = ()
    source: DecisionSource = "auto"
    """"auto" when cudaload decided, "user" when the caller set it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "value": jsonable(self.value),
            "reason": self.reason,
            "source": self.source,
            "rejected": [{"value": jsonable(r.value), "reason": r.reason} for r in self.rejected],
        }


def jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(jsonable(v) for v in value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


VALUE_WIDTH = 36  # fits "kernels-community/vllm-flash-attn3"


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(jsonable(value))
    return text if len(text) <= width else text[: width - 1] + "…"


def decision_lines(decisions: tuple[Decision, ...], indent: str = "  ", mark_yours: bool = False) -> list[str]:
    """`explain()`'s rows: one per decision (setting, value, reason), its rejected options below it
    marked "x"; `mark_yours` adds "(set by you)" to the caller's own choices."""
    width = max((len(d.setting) for d in decisions), default=10)
    lines = []
    for d in decisions:
        mark = " (set by you)" if mark_yours and d.source == "user" else ""
        lines.append(f"{indent}{d.setting:<{width}}  {_short(d.value, VALUE_WIDTH):<{VALUE_WIDTH}}  {d.reason}{mark}")
        for r in d.rejected:
            rejected = _short(r.value, VALUE_WIDTH - 2)
            lines.append(f"{indent}{'':<{width}}  x {rejected:<{VALUE_WIDTH - 2}}  {r.reason}")
    return lines


@dataclass(frozen=True)
class FinetunePlan:
    """The fine-tuning section of a Plan (`plan.finetune`): what `load_for_finetune()` applies.

    Attributes:
        lora: `peft.LoraConfig` keyword arguments (the "lora" decision's value).
        training_arguments: `TrainingArguments` keyword arguments (`training_arguments()` returns
            them, with yours on top).
        memory_estimate: The training-memory estimate per quantization option ("16bit", "4bit",
            "8bit"; each a dict of bytes with a "total"), and under "assumes" the sequence length,
            batch size and checkpointing it assumes.
        gradient_checkpointing: Activation checkpointing is on.
        checkpointing_kwargs: The keyword arguments checkpointing is enabled with on the model
            (the planned `..._checkpointing_kwargs` training argument).
        use_cache: The model's `config.use_cache` while training (the "use_cache" decision).
        trainable_parameters: The adapters' parameter count, known once `load_for_finetune()`
            has added them; None in a plan that loaded nothing.

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

    lora: Mapping[str, Any]
    training_arguments: Mapping[str, Any]
    memory_estimate: Mapping[str, Any]
    gradient_checkpointing: bool
    checkpointing_kwargs: Mapping[str, Any] = field(default_factory=dict)
    use_cache: bool = False
    trainable_parameters: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The section as the fine-tuning keys of `Plan.to_dict()["extras"]` (stable since 0.1)."""
        out: dict[str, Any] = {
            "lora": jsonable(self.lora),
            "training_arguments": jsonable(self.training_arguments),
            "memory_estimate": jsonable(self.memory_estimate),
            "gradient_checkpointing": self.gradient_checkpointing,
        }
        if self.trainable_parameters is not None:
            out["trainable_parameters"] = self.trainable_parameters
        return out


@dataclass(frozen=True)
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

    def explain_lines(self) -> list[str]:
        """The generation block of `Plan.explain()`."""
        lines = [f"  generation (context {self.context} tokens):"]
        lines += decision_lines(self.decisions, indent="    ", mark_yours=True)
        lines += [f"    WARNING: {w}" for w in self.warnings]
        return lines

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass(frozen=True)
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
        hub_code: The caller consented to Hub code when planning (hub_kernels=True or
            use_kernels=True); not part of the plan's value.
        assumed_packages: For a simulated machine, the packages planned with and where they come
            from (`Software.assumed`: "as installed here", or the defaults, and what you changed);
            None for this machine.

    Examples:
        >>> import tempfile, cudaload
        >>> from cudaload.demo import build_tiny_model
        >>> path = build_tiny_model(tempfile.mkdtemp())
        >>> plan = cudaload.plan(path, machine=cudaload.Machine.simulated("A100"))
        >>> plan.kwargs
        {'dtype': 'bfloat16', 'attn_implementation': 'sdpa', 'device_map': 'cuda:0'}
        >>> plan.attention_chain, plan.machine
        (('sdpa', 'eager'), '1x NVIDIA A100-SXM4-80GB (sm_80)')
        >>> print(plan.explain().splitlines()[1].split()[:3])  # a simulated machine: its packages
        ['simulated', "machine's", 'packages,']
        >>> print(plan.explain().splitlines()[2].split())  # doctest: +ELLIPSIS
        ['dtype', 'bfloat16', 'NVIDIA', 'A100-SXM4-80GB', '(sm_80)', 'runs', 'bf16', 'natively:', ...]
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
    hub_code: bool = field(default=False, compare=False, repr=False)
    """The caller consented to Hub code (hub_kernels=True or use_kernels=True) when planning; a plan
    rebuilt without it (e.g. from its JSON) carries no consent beyond its kwargs."""

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

    def explain(self) -> str:
        """A short table: one line per setting with its reason, rejected options indented below."""
        lines = [f"cudaload plan for {self.model} on {self.machine}"]
        if self.assumed_packages is not None:
            lines.append(f"  simulated machine's packages, {self.assumed_packages}")
        lines += decision_lines(self.decisions)
        estimate = self.finetune.memory_estimate if self.finetune is not None else None
        if estimate:
            assumes = estimate["assumes"]
            lines.append(
                f"  training memory estimate (seq_len {assumes['seq_len']}, batch {assumes['batch_size']}, "
                f"checkpointing {'on' if assumes['gradient_checkpointing'] else 'off'}):"
            )
            for option, parts in estimate.items():
                if option != "assumes":
                    detail = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts.items() if k != "total")
                    lines.append(f"    {option:<5} LoRA  {parts['total'] / 2**30:7.2f} GiB  ({detail})")
        if len(self.attention_chain) > 1:
            lines.append(f"  attention fallback chain: {' -> '.join(self.attention_chain)}")
        if self.generation is not None:
            lines += self.generation.explain_lines()
        for warning in self.warnings:
            lines.append(f"  WARNING: {warning}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()
