"""The layers import only downwards, and no module imports itself back.

capability (probes and readers) -> facts (data) <- policy (pure) -> plans (the contract, with request,
the input side) <- planner (gathers facts, runs the policy); loaders (apply) import neither the planner, the
policy nor a probe: what applying needs to know of this process is in the plan (`Plan.apply_facts`), gathered by
the planner. The facade (`load()`: plan, then apply) and finetune probe nothing of their own either; cli and
bench at the edge. Read from the source, lazy imports included, so a
function-level import cannot hide an upward arrow; `if TYPE_CHECKING:` blocks are annotations, not imports,
and are skipped by the layer rule. The cycle check counts them: a type imported back is still two modules that
each need the other (mypy, a reader, the next refactor that turns the annotation into a call)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cudaload

PACKAGE = Path(cudaload.__file__).parent
ANYONE = {
    "errors",
    "upstream",
    "upstream_flash",
    "upstream_kernels",
    "upstream_imports",
    "version",
    "installed",
    "announce",
    "regular_file",
    "frozen",
}
"""Import nothing of cudaload but each other (exceptions, tables of upstream facts, transformers' first import under
a lock, the version string, the installed distributions' names and versions, the announcement of a long step, the
frozen dataclass decorator) and
may be imported by every module. What records register (a quantization method's package, detected and named by
install hints) is gathered above them, in facts/packages.py."""
BOTTOM = {"errors"}
"""Import nothing of cudaload at all, annotations included: the exception tree every layer raises from."""
FACADE = {
    "facts",
    "capability",
    "request",
    "plans",
    "planner",
    "loaders",
    "facade",
    "tokenizer",
    "finetune",
    "pipelines",
}

# Each top-level module or package of cudaload -> what its modules may import besides themselves and ANYONE.
ALLOWED: dict[str, set[str]] = {
    "facts": set(),
    "request": set(),  # what the caller asked: the input side of the contract
    "capability": {"facts"},
    "plans": {"facts", "request"},  # the contract: Plan, GenerationPlan, FinetunePlan, Decision
    "policy": {"facts", "plans", "request"},  # pure: never a probe, never the planner
    "planner": {"facts", "capability", "plans", "policy", "request"},
    "loaders": {"facts", "plans", "request"},  # apply only: never the planner, the policy or a probe
    "facade": {"facts", "plans", "planner", "loaders", "request"},  # load(): plan(), then apply_plan(); no probe
    "tokenizer": {"facts", "plans", "request"},
    # the launch files for a plan (torchrun, accelerate, DeepSpeed, SLURM) and the check launched ranks make
    "launch": {"facts", "plans", "planner"},
    "finetune": {"facts", "plans", "planner", "loaders", "request", "launch"},  # no probe: the plan's facts
    "pipelines": {"facade", "tokenizer", "plans"},
    "smollm2": {"capability", "gguf_checks"},  # the real demo model: found in an installed package, converted
    "gguf_checks": set(),  # what a GGUF conversion checks before sealing (the file, the report, finite weights)
    # capability: the cache folder the demo builds in; plans: its report laid out as a plan's (plans/layout.py)
    "demo": {"facade", "tokenizer", "smollm2", "capability", "plans"},
    "bench": FACADE | {"policy", "demo", "smollm2"},
    "cli": FACADE | {"policy", "demo", "bench", "smollm2", "launch"},
    "__main__": {"cli"},
    "__init__": FACADE | {"demo", "launch"},  # the lazy name table; its imports are TYPE_CHECKING only
}


def _unit(module: str) -> str:
    """The top-level module or package of a dotted name relative to cudaload ("policy.fit" -> "policy")."""
    return module.split(".")[0]


def imports_in(source: str, module: str, is_package: bool = False, type_checking: bool = False) -> set[str]:
    """cudaload modules (relative to cudaload, e.g. "policy.fit") that `source`, the text of `module`,
    imports anywhere: at the top, inside functions, `from cudaload import X` as "X"; inside
    `if TYPE_CHECKING:` blocks too when `type_checking`."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                if base == "cudaload" or base.startswith("cudaload."):
                    # `from cudaload import capability` imports a module; `from .plans import Plan` a name.
                    found.update(f"{base}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name == "cudaload" or a.name.startswith("cudaload."))
            visit(child)

    visit(ast.parse(source))
    # A bare `import cudaload` (or a public name of it) reaches the facade, which reaches everything.
    return {"__init__" if m == "cudaload" else m.removeprefix("cudaload.") for m in found}


def _module_name(path: Path) -> str:
    """ "cudaload.policy" for policy/__init__.py; the package's own __init__.py stays "cudaload.__init__"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if len(parts) > 1 and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("cudaload", *parts))


def _imports(path: Path, type_checking: bool = False) -> set[str]:
    module = _module_name(path).removesuffix(".__init__")  # the package's relative imports start at cudaload
    return imports_in(path.read_text(), module, path.name == "__init__.py", type_checking)


MODULES = sorted(PACKAGE.rglob("*.py"))
NAMES = {_module_name(p).removeprefix("cudaload."): p for p in MODULES}  # "__init__" is the facade


def _resolve(name: str) -> str:
    """The module an imported dotted name is, or lives in ("plans.Plan" -> "plans"); a public name of
    the package ("plan", from `from cudaload import plan`) is the facade's, "__init__"."""
    while name and name not in NAMES:
        name = name.rpartition(".")[0]
    return name or "__init__"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_module_imports_only_the_layers_below(path: Path) -> None:
    relative = path.relative_to(PACKAGE)
    unit = relative.parts[0].removesuffix(".py")
    allowed = ALLOWED.get(unit, set()) | ANYONE | {unit}
    upward = sorted(m for m in _imports(path) if _unit(_resolve(m)) not in allowed)
    assert not upward, f"{relative} ({unit}) imports {upward}; it may import only {sorted(allowed)}"


def test_every_module_is_under_a_rule() -> None:
    units = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in MODULES}
    assert units == set(ALLOWED) | ANYONE, "a new top-level module needs its line in ALLOWED"
    for name in ANYONE:
        others = {_unit(_resolve(m)) for m in _imports(PACKAGE / f"{name}.py")} - (ANYONE - {name})
        assert not others, f"{name} must import nothing of cudaload but the modules anyone may import"
    for name in BOTTOM:
        assert _imports(NAMES[name], type_checking=True) == set(), f"{name} must import nothing of cudaload"


def test_the_checker_sees_every_form_of_import() -> None:
    # The rules above would pass vacuously if an import form were missed.
    assert imports_in("from cudaload import capability", "cudaload.policy.fit") == {"capability"}
    assert imports_in("import cudaload", "cudaload.policy.fit") == {"__init__"}
    assert _unit(_resolve("plan")) == "__init__"  # `from cudaload import plan`: the facade
    assert imports_in("def f():\n    from .. import capability\n", "cudaload.policy.fit") == {"capability"}
    assert imports_in("import cudaload.capability.gpus", "cudaload.policy.fit") == {"capability.gpus"}
    assert imports_in("from ..capability.cache import x", "cudaload.policy.fit") == {"capability.cache.x"}
    assert imports_in("from .plans import Plan", "cudaload.loaders") == {"plans.Plan"}
    assert imports_in("from .kv_layout import f", "cudaload.capability", is_package=True) == {"capability.kv_layout.f"}
    skipped = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..capability import detect\n"
    assert imports_in(skipped, "cudaload.policy.fit") == set()
    assert "planner.plan" in _imports(PACKAGE / "facade.py")  # a lazy import, in load()
    assert _imports(PACKAGE / "__init__.py") == {"version.__version__"}  # the rest is TYPE_CHECKING only


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of `graph` (module -> the modules it imports) closes, each as the
    path from the module it returns to back to that module."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            walk(start, [start])
    return cycles


def import_graph(type_checking: bool) -> dict[str, set[str]]:
    """Each cudaload module (e.g. "policy.quantization", a package as "policy") -> the modules it imports."""
    return {
        name: {target for m in _imports(path, type_checking) if (target := _resolve(m)) != name}
        for name, path in NAMES.items()
    }


def test_no_module_imports_itself_back() -> None:
    # Module by module, so a cycle between two modules of one package counts; TYPE_CHECKING imports too (the
    # facade's lazy name table, all TYPE_CHECKING, imports nothing that imports it back).
    assert import_cycles(import_graph(type_checking=True)) == []
    graph = import_graph(type_checking=False)
    loaders = {_unit(m) for name, targets in graph.items() if _unit(name) == "loaders" for m in targets}
    assert "plans" in loaders and not loaders & {"policy", "planner"}
    assert {"planner", "loaders"} <= graph["facade"]


def test_the_cycle_check_sees_a_type_imported_back_inside_a_package() -> None:
    # The cycle issue 41 item 5 removed: quantization took CheckpointPlan from checkpoint_quantization for a type
    # only, while checkpoint_quantization took quant_method_status from quantization.
    typed = "if TYPE_CHECKING:\n    from .checkpoint_quantization import CheckpointPlan\n"
    called = "from .quantization import quant_method_status\n"
    quantization, checkpoint = "policy.quantization", "policy.checkpoint_quantization"
    graph = {
        quantization: {_resolve(m) for m in imports_in(typed, f"cudaload.{quantization}", type_checking=True)},
        checkpoint: {_resolve(m) for m in imports_in(called, f"cudaload.{checkpoint}")},
    }
    assert import_cycles(graph) == [[checkpoint, quantization, checkpoint]]
    assert imports_in(typed, "cudaload.policy.quantization") == set()  # the layer rule alone would not see it
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_importing_the_policy_loads_no_probe_and_no_torch() -> None:
    code = (
        "import sys, cudaload.policy, cudaload.facts.catalog\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('cudaload'))\n"
        "print(' '.join(loaded))\n"
        "print(' '.join(m for m in ('torch', 'transformers', 'pynvml') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded, heavy = out.splitlines()[0].split(), out.splitlines()[1:]
    assert "cudaload.policy" in loaded and "cudaload.facts.machine" in loaded
    probes = [m for m in loaded if m.startswith(("cudaload.capability", "cudaload.loaders", "cudaload.planner"))]
    assert probes == [], probes
    assert heavy in ([], [""])


def test_the_how_it_works_page_gives_every_module_one_line() -> None:
    page = (PACKAGE.parents[1] / "docs" / "how-it-works.md").read_text()
    rows = re.findall(r"^\| `([\w/]+\.py)` \| (.+) \|$", page, re.MULTILINE)
    listed = [path for path, _ in rows]
    assert sorted(listed) == sorted(str(p.relative_to(PACKAGE)) for p in MODULES)
    assert all(job.strip() and "|" not in job for _, job in rows)


def private_names_imported(source: str, module: str, is_package: bool = False) -> list[str]:
    """The `_private` names that `source`, the text of `module`, imports from another cudaload module, as
    "module.name". A module's private names are its own: another module that needs one needs a public name.
    A public name imported under a private alias (`from ..installed import dist_version as _dist_version`)
    is not one of them."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base == "cudaload" or base.startswith("cudaload."):
            found += [f"{base}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_the_private_name_checker_sees_each_form() -> None:
    assert private_names_imported("from .verify import _Failure", "cudaload.loaders.apply") == [
        "cudaload.loaders.verify._Failure"
    ]
    assert private_names_imported("def f():\n    from ..capability import _x\n", "cudaload.policy.fit") == [
        "cudaload.capability._x"
    ]
    assert private_names_imported("from cudaload.plans import _y", "cudaload.cli.output") == ["cudaload.plans._y"]
    assert private_names_imported("from ..installed import dist_version as _dist_version", "cudaload.policy.fit") == []
    assert private_names_imported("from typing import _SpecialForm", "cudaload.policy.fit") == []  # not cudaload's
    assert private_names_imported("from .version import __version__", "cudaload", is_package=True) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_private_name_of_another(path: Path) -> None:
    module = _module_name(path).removesuffix(".__init__")
    private = private_names_imported(path.read_text(), module, path.name == "__init__.py")
    assert not private, f"{path.relative_to(PACKAGE)} imports {private}: make each a public name of its module"


EDGE = ("cli", "bench")
"""The edge takes the policy through its public names (policy/__init__.py `__all__`), not its modules."""


@pytest.mark.parametrize(
    "path", [p for p in MODULES if p.relative_to(PACKAGE).parts[0] in EDGE], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_the_edge_imports_only_the_policy_s_public_names(path: Path) -> None:
    import cudaload.policy

    policy = {m for m in _imports(path) if _unit(m) == "policy"}
    internal = sorted(m for m in policy if m.count(".") != 1 or m.split(".")[1] not in cudaload.policy.__all__)
    assert not internal, f"{path.relative_to(PACKAGE)} imports {internal}: add a public name to policy/__init__.py"
