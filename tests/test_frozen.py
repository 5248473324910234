"""`cudaload.frozen.frozen` behaves as `dataclasses.dataclass(frozen=True)`: each check builds the same class
body with both decorators and compares what they do (issue 50 item 2: the same records, without compiling
six methods a class)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import pickle
import pkgutil
from typing import Any

import pytest

import cudaload
from cudaload.frozen import frozen

BOTH = pytest.mark.parametrize("decorate", [dataclasses.dataclass(frozen=True), frozen], ids=["stdlib", "frozen"])


def _point(decorate: Any) -> Any:
    class Point:
        """A point."""

        x: int
        y: float = 0.0
        tags: tuple[str, ...] = ()
        notes: dict[str, int] = dataclasses.field(default_factory=dict)
        cached: str = dataclasses.field(default="", compare=False, repr=False)

    return decorate(Point)


def _outcome(call: Any) -> Any:
    """What a call returns, or its exception's type and message."""
    try:
        return ("ok", call())
    except Exception as exc:
        return (type(exc).__name__, str(exc).replace("__create_fn__.<locals>.", ""))


def _stdlib_and_ours() -> tuple[Any, Any]:
    return _point(dataclasses.dataclass(frozen=True)), _point(frozen)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((1,), {}),
        ((1, 2.5, ("a",)), {"notes": {"n": 1}}),
        ((), {"x": 3, "cached": "c"}),
        ((), {}),  # missing x
        ((1, 2.0, (), {}, "c", "extra"), {}),  # too many
        ((1,), {"x": 2}),  # twice
        ((1,), {"z": 2}),  # unknown
    ],
)
def test_construction_and_repr_match_the_stdlib(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    stdlib, ours = _stdlib_and_ours()
    theirs, mine = _outcome(lambda: stdlib(*args, **kwargs)), _outcome(lambda: ours(*args, **kwargs))
    assert mine[0] == theirs[0]
    if theirs[0] == "ok":
        assert repr(mine[1]) == repr(theirs[1])
        assert dataclasses.asdict(mine[1]) == dataclasses.asdict(theirs[1])
    else:  # the same kind of refusal, naming the same argument
        assert [w for w in theirs[1].split() if "'" in w] == [w for w in mine[1].split() if "'" in w]


def test_a_default_factory_makes_a_new_value_each_time() -> None:
    _, ours = _stdlib_and_ours()
    a, b = ours(1), ours(1)
    assert a.notes == {} and a.notes is not b.notes


@BOTH
def test_equality_and_hash_leave_out_compare_false_fields(decorate: Any) -> None:
    point = _point(decorate)
    assert point(1, cached="a") == point(1, cached="b")
    assert point(1) != point(2)
    assert point(1).__eq__(object()) is NotImplemented
    nan = point(1, math.nan)
    assert nan == nan  # a tuple's ==: identity first, as the stdlib compares
    assert point(1, float("nan")) != point(1, float("nan"))  # two NaN objects
    with pytest.raises(TypeError, match="unhashable"):
        hash(point(1))  # its dict field

    class Pair:
        """Hashable."""

        a: int
        b: str = dataclasses.field(default="", compare=False)

    pair = decorate(Pair)
    assert hash(pair(1, "x")) == hash(pair(1, "y")) != hash(pair(2, "x"))
    assert len({pair(1, "x"), pair(1, "y"), pair(2)}) == 2


@BOTH
def test_fields_refuse_changes(decorate: Any) -> None:
    p = _point(decorate)(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="'x'"):
        p.x = 2
    with pytest.raises(dataclasses.FrozenInstanceError, match="'y'"):
        del p.y
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.other = 1  # not a field either: a frozen class takes no new attributes


@BOTH
def test_replace_fields_pickle_copy_and_post_init(decorate: Any) -> None:
    seen: list[int] = []

    class Checked:
        """Checks its value."""

        value: int
        label: str = "v"

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError(f"value {self.value} < 0")
            seen.append(self.value)

    checked = decorate(Checked)
    c = checked(1)
    assert dataclasses.is_dataclass(c) and [f.name for f in dataclasses.fields(c)] == ["value", "label"]
    assert dataclasses.replace(c, value=2) == checked(2)
    with pytest.raises(ValueError, match="-1 < 0"):
        dataclasses.replace(c, value=-1)
    assert seen == [1, 2, 2]
    assert copy.deepcopy(c) == c and copy.copy(c) == c


@dataclasses.dataclass(frozen=True)
class StdlibLabel:
    """Pickled by reference to its module."""

    text: str
    size: int = 1


@frozen
class FrozenLabel:
    """Pickled by reference to its module."""

    text: str
    size: int = 1


@pytest.mark.parametrize("label", [StdlibLabel, FrozenLabel])
def test_pickles(label: Any) -> None:
    value = label("a", 2)
    assert pickle.loads(pickle.dumps(value)) == value


def test_a_subclass_and_the_signature() -> None:
    stdlib, ours = _stdlib_and_ours()
    assert str(inspect.signature(ours)) == str(inspect.signature(stdlib))

    @frozen
    class Labelled(ours):  # type: ignore[misc, valid-type]
        label: str = "l"

    labelled = Labelled(1, label="m")
    assert (labelled.x, labelled.label) == (1, "m") and labelled != ours(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        labelled.label = "n"


def test_a_class_without_a_docstring_gets_the_stdlibs_and_one_with_keeps_its_own() -> None:
    def undocumented(decorate: Any) -> Any:
        class Sized:
            size: int
            unit: str = "B"
            parts: tuple[int, ...] = dataclasses.field(default_factory=tuple)

        return decorate(Sized)

    ours, stdlib = undocumented(frozen), undocumented(dataclasses.dataclass(frozen=True))
    assert (
        ours.__doc__ == stdlib.__doc__ == "Sized(size: 'int', unit: 'str' = 'B', parts: 'tuple[int, ...]' = <factory>)"
    )
    assert _point(frozen).__doc__ == "A point."


def test_what_the_class_writes_itself_stays() -> None:
    @frozen
    class Named:
        """Has its own repr and equality."""

        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Named) and other.name.lower() == self.name.lower()

    assert repr(Named("a")) == "<a>" and Named("a") == Named("A")
    hash(Named("a"))  # as the stdlib: a class writing __eq__ alone still gets the fields' hash


def _dataclasses_of_cudaload() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(cudaload.__path__, "cudaload."):
        if info.name.endswith("__main__"):  # runs the CLI
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == info.name and dataclasses.is_dataclass(value):
                found.append(value)
    return found


def test_every_frozen_record_of_cudaload_is_made_by_frozen() -> None:
    """One mechanism: a `@dataclass(frozen=True)` in cudaload compiles its methods again (a fresh load() pays)."""
    compiled = []
    for value in _dataclasses_of_cudaload():
        params = value.__dataclass_params__  # type: ignore[attr-defined]
        shared = getattr(value.__init__, "__module__", "") == "cudaload.frozen"
        if params.frozen and not shared:
            compiled.append(f"{value.__module__}.{value.__qualname__}")
    assert compiled == []


def test_every_record_of_cudaload_says_what_it_is() -> None:
    """A docstring of its own: one written from the signature says no more than the fields, and costs building
    the signature when the class is defined (benchmarks/record_cost.py: ~0.05 ms a class)."""
    undocumented = [
        f"{value.__module__}.{value.__qualname__}"
        for value in _dataclasses_of_cudaload()
        if (value.__doc__ or "").startswith(f"{value.__name__}(")
    ]
    assert undocumented == []


def test_subclasses_either_way_and_their_signatures() -> None:
    stdlib, ours = _stdlib_and_ours()

    class Plain(ours):  # type: ignore[misc, valid-type]
        pass

    @dataclasses.dataclass(frozen=True)
    class Extended(ours):  # type: ignore[misc, valid-type]
        extra: int = 0

    @frozen
    class OnStdlib(stdlib):  # type: ignore[misc, valid-type]
        extra: int = 0

    assert str(inspect.signature(Plain)) == str(inspect.signature(ours))
    assert "extra" in str(inspect.signature(Extended)) and "extra" not in str(inspect.signature(ours))
    assert Extended(1, extra=2).extra == 2 and OnStdlib(1, extra=3) == OnStdlib(1, extra=3)
    for value in (Extended(1), OnStdlib(1)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.extra = 5
    with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):
        dataclasses.dataclass(type("Mutable", (ours,), {"__annotations__": {"z": "int"}, "z": 0}))


def test_keyword_only_and_init_var_fields_are_refused_with_the_way_out() -> None:
    with pytest.raises(TypeError, match=r"keyword-only fields \['b'\].*dataclasses.dataclass\(frozen=True\)"):

        @frozen
        class KeywordOnly:
            a: int
            b: int = dataclasses.field(default=0, kw_only=True)

    with pytest.raises(TypeError, match=r"InitVar fields \['seed'\]"):

        @frozen
        class WithInitVar:
            a: int
            seed: dataclasses.InitVar[int] = 0
