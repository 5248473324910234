"""What the caller asked for. `None` everywhere means "decide for me"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from .errors import SettingError, WorkloadError
from .frozen import frozen

__all__ = [
    "PADDING_SIDES",
    "PARALLELISM_CHOICES",
    "STRATEGIES",
    "TRAIN_MODES",
    "WORKLOADS",
    "GenerationRequest",
    "Request",
    "TrainingRequest",
    "Workload",
    "check_count",
    "check_flag",
    "check_padding_side",
    "model_class_name",
    "workload_from",
]


@frozen
class Workload:
    """The job a measured dtype choice is optimised for: one load, then a prompt of
    `prompt_tokens` and `new_tokens` generated one at a time.

    Pass one as `plan(..., workload=...)` (or a name: "balanced" is Workload(512, 128),
    "prefill-heavy" Workload(2048, 16), "decode-heavy" Workload(64, 512); or a
    (prompt_tokens, new_tokens) pair). Its prompt + new tokens is also the default generation
    context, and whether decoding is long enough for a static cache depends on it.

    Attributes:
        prompt_tokens: Tokens in the prompt (one prefill forward); default 512.
        new_tokens: Tokens generated one at a time after it; default 128.
        include_load: Count loading (a checkpoint cast to another dtype pays a conversion);
            default True.
        training: Fine-tuning steps: forward and backward over `prompt_tokens` (prefill-shaped), no
            generation; default False. Fine-tuning plans build this one themselves.

    Examples:
        >>> import cudaload
        >>> cudaload.Workload(2048, 16).describe()
        'load + a 2048-token prompt + 16 new tokens'
        >>> cudaload.Workload(prompt_tokens=1024, new_tokens=0, include_load=False, training=True).describe()
        'training steps over 1024 tokens (forward and backward, prefill-shaped)'
    """

    prompt_tokens: int = 512
    new_tokens: int = 128
    include_load: bool = True
    """Count loading (a checkpoint cast to another dtype pays a conversion)."""
    training: bool = False
    """Fine-tuning steps: forward and backward over `prompt_tokens` (prefill-shaped), no generation."""

    def describe(self) -> str:
        if self.training:
            return f"training steps over {self.prompt_tokens} tokens (forward and backward, prefill-shaped)"
        parts = ["load"] if self.include_load else []
        parts.append(f"a {self.prompt_tokens}-token prompt")
        if self.new_tokens:
            parts.append(f"{self.new_tokens} new tokens")
        return " + ".join(parts)


WORKLOADS = {
    "balanced": Workload(512, 128),
    "prefill-heavy": Workload(2048, 16),
    "decode-heavy": Workload(64, 512),
}
"""Named workloads for `plan(..., workload=...)`; "balanced" is the default."""


def workload_from(value: object) -> Workload:
    """A Workload from a name in WORKLOADS, a (prompt_tokens, new_tokens) pair, or a Workload."""
    if value is None:
        return WORKLOADS["balanced"]
    if isinstance(value, Workload):
        return value
    if isinstance(value, str) and value in WORKLOADS:
        return WORKLOADS[value]
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        and value[0] > 0
    ):
        return Workload(int(value[0]), int(value[1]))
    raise WorkloadError(
        f"workload={value!r} is not a workload cudaload knows. Pass one of {sorted(WORKLOADS)}, a "
        "(prompt_tokens, new_tokens) pair of non-negative integers (prompt_tokens > 0), or leave it unset."
    )


PADDING_SIDES = ("left", "right")
"""A tokenizer's `padding_side` values."""


def check_flag(name: str, value: Any, allow_none: bool) -> None:
    """Only a real bool (or None, "decide for me") counts: 1, "yes" or "False" must not."""
    if isinstance(value, bool) or (allow_none and value is None):
        return
    raise SettingError(
        f"{name}={value!r} ({type(value).__name__}): pass True or False"
        + (", or leave it unset to let cudaload decide." if allow_none else ".")
    )


def check_count(name: str, value: Any) -> None:
    """A size the memory estimate multiplies by (seq_len, batch_size): a positive int or None, never a
    bool (True is 1 to Python), a float or a negative number (which gave negative memory that "fits")."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return
    raise SettingError(
        f"{name}={value!r} ({type(value).__name__}): pass a whole number of at least 1, or leave it unset "
        "for cudaload's default."
    )


def check_padding_side(value: object) -> None:
    """Refuse a padding side a tokenizer does not have (plan()'s, tokenizer_for()'s and pipeline()'s)."""
    if value not in PADDING_SIDES:
        raise SettingError(f"padding_side={value!r}: pass 'left' or 'right', or leave it unset to let cudaload choose.")


@frozen
class GenerationRequest:
    """What the caller asked of generation (`plan(..., generate=...)`)."""

    required: bool
    """generate=True: the plan must have a generation section (an error for a model without a KV-cache
    layout). False (generate=None): one when the model generates and its config gives the layout."""
    context: int | None = None
    cache_implementation: str | None = None
    padding_side: str | None = None

    def __post_init__(self) -> None:
        # Checked once, where the request is made: the policy decides from a valid one.
        if self.padding_side is not None:
            check_padding_side(self.padding_side)


STRATEGIES = (
    "ddp",
    "fsdp",
    "fsdp-hybrid",
    "deepspeed-zero1",
    "deepspeed-zero2",
    "deepspeed-zero3",
    "deepspeed-zero3-offload",
    "tp+fsdp",
)
"""Every strategy cudaload sizes and plans (policy/rank_sizing.py), in the order a plan prefers them when each
fits. The ZeRO stages go lowest first: ZeRO-1 and ZeRO-2 move the same bytes (gradients reduce-scattered, weights
all-gathered: the ZeRO paper's 2P, as DDP), ZeRO-3 half as much again, so asking for DeepSpeed gets the lowest
stage that fits."""
PARALLELISM_CHOICES = ("auto", "deepspeed", *STRATEGIES)
"""What `parallelism=` (`--parallelism`) accepts: "auto" (the plan chooses), "deepspeed" (the lowest ZeRO stage that
fits) or one strategy."""

TRAIN_MODES = ("lora", "full")
"""What `train=` (`--train`) accepts: "lora" (the default: LoRA adapters on a frozen base, QLoRA when planned)
or "full" (every weight trained, no adapters, no quantization)."""


@frozen
class TrainingRequest:
    """What a fine-tuning plan was asked (`plan(..., finetune=True)`). Only a fine-tuning Request has
    one, so an inference plan cannot be given settings it would ignore."""

    quantize: str | None = "auto"
    """None (no quantization), the choice of a method in facts/quant_methods.py ("4bit", "8bit") or "auto"
    (4-bit only when 16-bit LoRA does not fit)."""
    lora: Mapping[str, Any] | None = None
    """LoraConfig keyword overrides."""
    gradient_checkpointing: bool = True
    seq_len: int = 2048
    """Sequence length and batch the training-memory estimate assumes."""
    batch_size: int = 1
    own_quantization: str | None = None
    """With quantize=None: what your own `quantization_config` does to the base weights (the choice of its
    method in facts/quant_methods.py, "4bit" or "8bit" for bitsandbytes; "other" for another method, None
    without one), so the estimate and optimizer follow it."""
    nodes: int | None = None
    """Machines the job will run on (`--nodes`); None: plan no parallelism unless launched on several ranks."""
    ranks_per_node: int | None = None
    """Processes per node; None: one per GPU (on a CPU machine, 1)."""
    interconnect: str | None = None
    """The link between nodes (facts/interconnect.py INTERCONNECTS); None: the documented default."""
    parallelism: str = "auto"
    """"auto", "deepspeed" or one strategy of policy/rank_sizing.py STRATEGIES."""
    node_memory: int | None = None
    """Each node's RAM in bytes (`--node-memory`), which ZeRO-3 offload's CPU state must fit; None: this
    machine's (a simulated machine's as simulated)."""
    train: str = "lora"
    """One of TRAIN_MODES: "lora" (adapters on a frozen base) or "full" (every weight trained)."""


@frozen
class Request:
    """What the caller asked of a plan, validated: from_pretrained settings (None: decide for me), the
    fine-tuning and generation sections when asked for, and what is passed through untouched."""

    attn_implementation: str | None = None
    dtype: str | None = None
    device_map: Any = None
    max_memory: Mapping[Any, Any] | None = None
    use_kernels: bool | None = None
    hub_kernels: bool | None = None
    """Consent to download Hub attention kernels (code) that are not cached; None/False: cached only."""
    training: TrainingRequest | None = None
    """The fine-tuning settings of a fine-tuning plan; None: an inference plan (it has no such settings)."""
    workload: Workload = field(default_factory=Workload)
    """What a measured dtype choice optimises (fine-tuning uses seq_len x batch_size of prefill)."""
    passthrough: Mapping[str, Any] = field(default_factory=dict)
    """Other from_pretrained kwargs the caller gave: passed on untouched."""
    generation: GenerationRequest | None = None
    """Plan generation settings as asked; None: no generation section (generate=False, fine-tuning)."""


def model_class_name(value: Any) -> str | None:
    """`model_class=` as the name of a transformers class: a name is kept, a transformers class (an
    Auto class or a model class such as `BertModel`) gives its name; None stays None (the class is
    then read from the config, `default_auto_class`).

    Raises:
        SettingError: anything else, or a class transformers does not export under its name.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    name = getattr(value, "__name__", None)
    if isinstance(value, type) and name and hasattr(value, "from_pretrained"):
        import transformers

        if getattr(transformers, name, None) is value:
            return str(name)
        raise SettingError(
            f"model_class={value!r}: cudaload loads through classes transformers exports, and this one is not "
            f"transformers.{name}. Pass a transformers Auto class (e.g. AutoModelForSequenceClassification) or "
            "model class (e.g. BertModel), or its name."
        )
    raise SettingError(
        f"model_class={value!r:.60} ({type(value).__name__}): pass a transformers Auto class or model class, or "
        "its name (e.g. 'AutoModelForSequenceClassification', 'BertModel'); leave it unset to load the "
        "checkpoint's own architecture (config.json's 'architectures')."
    )
