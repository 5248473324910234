"""`frozen`: a frozen dataclass whose methods are written once here instead of compiled for each class.

A frozen `dataclasses.dataclass` writes six methods (`__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__`,
`__delattr__`) as source text for each class and compiles them with `exec` (CPython 3.11 `dataclasses._create_fn`):
0.52 of the 0.56 ms it takes to define a 7-field class on Python 3.11, and alike on 3.10-3.13
(`benchmarks/record_cost.py`, 2-core Zen 4). A script's first `load()` defines 47 of them, so the compiling was
~25 ms of what cudaload added to a ~63 ms `from_pretrained` (issue 50 item 2).

`frozen` lets the standard library read the fields (it still builds `__dataclass_fields__` and
`__dataclass_params__`, so `dataclasses.fields`, `replace`, `asdict` and `is_dataclass` work as before, and the
params say init, repr, eq and frozen, as the class behaves) and gives the class methods that read the field names
from closures: the same behaviour (arguments, defaults, `default_factory`, `compare=False` and `repr=False` fields,
`__post_init__`, `FrozenInstanceError`, subclasses either way), a few microseconds slower to call, which a plan's
few hundred instances do not notice. Type checkers see a frozen dataclass (`typing.dataclass_transform`, PEP 681).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
elif sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # Python 3.10: the decorator only marks the class for type checkers

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator


__all__ = ["frozen"]

_T = TypeVar("_T")
_MISSING: Any = dataclasses.MISSING


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[_T]) -> type[_T]:
    """A frozen dataclass, with the generated methods shared (see the module docstring)."""
    # Fields only: with init, repr, eq and frozen off (and no __hash__ to set), dataclasses compiles nothing. Under
    # a frozen base it must say frozen (dataclasses refuses a non-frozen child), and compiles __setattr__ and
    # __delattr__, replaced below: no record of cudaload has a record as its base.
    base_frozen = any(getattr(getattr(b, "__dataclass_params__", None), "frozen", False) for b in cls.__mro__[1:])
    # Without a docstring dataclasses writes one from the signature, which here has no fields yet ("A()"): it is
    # written below from the real one, as dataclass(frozen=True) writes it.
    documented = bool(cls.__dict__.get("__doc__"))
    if not documented:
        cls.__doc__ = cls.__name__
    cls = dataclasses.dataclass(init=False, repr=False, eq=False, frozen=base_frozen)(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    _refuse_unsupported(cls, fields)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init = params.repr = params.eq = params.frozen = True  # what the class is now: a child checks it
    names = frozenset(f.name for f in fields)
    methods: dict[str, Any] = {
        "__init__": _init(cls, [f for f in fields if f.init]),
        "__repr__": _repr(tuple(f.name for f in fields if f.repr)),
        "__eq__": _eq(tuple(f.name for f in fields if f.compare)),
        "__hash__": _hash(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))),
        "__setattr__": _refuse(cls, names, object.__setattr__, "assign to"),
        "__delattr__": _refuse(cls, names, object.__delattr__, "delete"),
        "__signature__": _Signature(cls),
    }
    for name, method in methods.items():
        if _written(cls, name) and not (base_frozen and name in ("__setattr__", "__delattr__")):
            continue  # as dataclasses does: what the class writes itself stays
        if callable(method):
            method.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, method)
    if not documented:
        cls.__doc__ = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    return cls


def _refuse_unsupported(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """What the shared methods do not implement: keyword-only fields and `InitVar` pseudo-fields (no record of
    cudaload has one); a class that needs them takes `dataclasses.dataclass(frozen=True)`."""
    kw_only = [f.name for f in fields if getattr(f, "kw_only", False) is True]
    init_vars = [
        name
        for name, f in cls.__dataclass_fields__.items()  # type: ignore[attr-defined]
        if "InitVar" in str(f.type)
    ]
    if kw_only or init_vars:
        raise TypeError(
            f"@frozen {cls.__qualname__}: keyword-only fields {kw_only} and InitVar fields {init_vars} are not "
            "supported; use dataclasses.dataclass(frozen=True) for this class"
        )


def _written(cls: type, name: str) -> bool:
    """Whether the class body defines `name`; a body that defines `__eq__` gets `__hash__ = None` from Python
    itself, which dataclasses does not count as written (CPython `dataclasses._process_class`)."""
    if name not in cls.__dict__:
        return False
    return not (name == "__hash__" and cls.__dict__[name] is None and "__eq__" in cls.__dict__)


def _init(cls: type, fields: list[dataclasses.Field[Any]]) -> Callable[..., None]:
    order = tuple(f.name for f in fields)
    accepted = frozenset(order)
    defaults = {f.name: f.default for f in fields if f.default is not _MISSING}
    factories: dict[str, Callable[[], Any]] = {
        f.name: f.default_factory  # type: ignore[misc]
        for f in fields
        if f.default_factory is not _MISSING
    }
    post_init = getattr(cls, "__post_init__", None) is not None
    set_field = object.__setattr__
    where = f"{cls.__qualname__}.__init__()"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(order):
            raise TypeError(f"{where} takes {len(order) + 1} positional arguments but {len(args) + 1} were given")
        for name in kwargs:
            if name not in accepted:
                raise TypeError(f"{where} got an unexpected keyword argument {name!r}")
        for name, value in zip(order, args, strict=False):
            if name in kwargs:
                raise TypeError(f"{where} got multiple values for argument {name!r}")
            set_field(self, name, value)
        for name in order[len(args) :]:
            if name in kwargs:
                value = kwargs[name]
            elif name in defaults:
                value = defaults[name]
            elif name in factories:
                value = factories[name]()
            else:
                raise TypeError(f"{where} missing 1 required argument: {name!r}")
            set_field(self, name, value)
        if post_init:
            self.__post_init__()

    return __init__


class _Signature:
    """The class's `__signature__` (what `inspect.signature` and `help()` show: the fields, as for a dataclass),
    built from the fields when first asked: most processes never ask, and building it cost a third of `frozen`."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.built: inspect.Signature | None = None

    def __get__(self, instance: object, owner: type) -> inspect.Signature:
        if owner is not self.cls:  # a subclass that is not a record itself: its own fields, not cached here
            return _signature(owner)
        if self.built is None:
            self.built = _signature(owner)
        return self.built


def _signature(cls: type) -> inspect.Signature:
    parameters = [
        inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_default(f), annotation=f.type)
        for f in dataclasses.fields(cls)
        if f.init
    ]
    return inspect.Signature(parameters, return_annotation=None)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not _MISSING:
        return f.default
    return inspect.Parameter.empty if f.default_factory is _MISSING else _FACTORY


class _Factory:
    """How a default made by a `default_factory` shows in a signature, as dataclasses shows it."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _repr(shown: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"

    return __repr__


def _values(self: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(getattr(self, n) for n in names)


def _eq(compared: tuple[str, ...]) -> Callable[[Any, object], Any]:
    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _values(self, compared) == _values(other, compared)  # a tuple's ==, as dataclasses compares

    return __eq__


def _hash(hashed: tuple[str, ...]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(_values(self, hashed))

    return __hash__


def _refuse(cls: type, names: frozenset[str], base: Callable[..., None], verb: str) -> Callable[..., None]:
    def refuse(self: Any, name: str, *value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot {verb} field {name!r}")
        base(self, name, *value)

    return refuse
