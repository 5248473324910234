"""A Decision (value, reason, rejected options), the rows `explain()` prints from them, and the read-only,
JSON-ready values a frozen Plan holds."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, NoReturn

from ..frozen import frozen

__all__ = [
    "SUB_MODEL_ATTENTION",
    "VALUE_WIDTH",
    "Decision",
    "DecisionSource",
    "ReadOnlyDict",
    "Rejected",
    "decision_lines",
    "jsonable",
    "mutable",
    "read_only",
]


SUB_MODEL_ATTENTION = "attn_implementation_per_sub_model"
"""The setting of the policy's attention per sub-model ("key=option, key=option" by sub-config name),
which `from_pretrained_kwargs` turns into transformers' dict by sub-config."""


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


@frozen
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


@frozen
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


VALUE_WIDTH = 36
"""How wide the value column was when explain() had fixed columns (kept for code that read it): the
columns now follow the terminal (`cudaload.plans.layout.columns`) and a value is never cut."""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(jsonable(value))


def decision_lines(
    decisions: tuple[Decision, ...],
    indent: str = "  ",
    mark_yours: bool = False,
    width: int | None = None,
    cli: bool = False,
    simulated: Mapping[str, str] | None = None,
) -> list[str]:
    """`explain()`'s rows: one per decision (setting, value, reason), its rejected options below it
    marked "x"; `mark_yours` adds "(set by you)" to the caller's own choices. Laid out for `width`
    columns (None: the terminal's), reasons hanging under their column, values whole. `cli`: hints
    name the CLI's flags (--dtype float16), not Python's arguments (dtype='float16'); with `simulated` (versions
    to suggest) a package is given to the simulated machine with --with, not installed."""
    from .layout import cli_hints, columns, terminal_width

    def said(reason: str) -> str:
        return cli_hints(reason, simulated) if cli else reason

    rows: list[tuple[str, str, str]] = []
    for d in decisions:
        mark = " (set by you)" if mark_yours and d.source == "user" else ""
        rows.append((d.setting, _text(d.value), said(d.reason) + mark))
        rows += [("", f"x {_text(r.value)}", said(r.reason)) for r in d.rejected]
    return columns(rows, terminal_width(width), indent)
