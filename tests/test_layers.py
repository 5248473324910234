"""The layers import only downwards: capability (probes) -> facts (data) <- policy (pure) -> plans
(the contract) <- loaders (apply); cli and bench at the edge. Read from the source, lazy imports
included, so a function-level import cannot hide an upward arrow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import cudaload

PACKAGE = Path(cudaload.__file__).parent

# Layer -> the layers its modules may import (besides their own). `errors` and `upstream` (tables
# of upstream facts) import nothing of cudaload and may be imported by anyone.
ALLOWED = {
    "facts": set(),
    "capability": {"facts"},
    "plans": {"generation"},  # GenerationPlan, the generation section of a Plan
    "generation": {"facts", "plans"},
    "policy": {"facts", "plans", "generation"},
    # reads a config: a probe of the model (upstream_imports: transformers' first import, under a lock)
    "model_facts": {"facts", "capability", "upstream_imports"},
}
ANYONE = {"errors", "upstream"}


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "cudaload"


def _imports(path: Path) -> set[str]:
    """cudaload modules `path` imports anywhere (top level, inside functions), TYPE_CHECKING excluded."""
    module = "cudaload." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                    found.update([target] if child.module else [f"{target}.{a.name}" for a in child.names])
                elif child.module and child.module.startswith("cudaload"):
                    found.add(child.module)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("cudaload"))
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m.removeprefix("cudaload.") for m in found if m != "cudaload" and not m.endswith("__version__")}


def _layered_modules() -> list[Path]:
    """Every module under a rule; the facade (load, plan, pipelines...), cli and bench are not."""
    layered = set(ALLOWED) | ANYONE
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0].removesuffix(".py") in layered)


@pytest.mark.parametrize("path", _layered_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_layer_imports_only_the_layers_below(path: Path) -> None:
    relative = path.relative_to(PACKAGE)
    layer = relative.parts[0].removesuffix(".py")
    allowed = ALLOWED.get(layer, set()) | ANYONE | {layer}
    upward = sorted(m for m in _imports(path) if m.split(".")[0] not in allowed)
    assert not upward, f"{relative} ({layer}) imports {upward}; {layer} may import only {sorted(allowed)}"


def test_the_checker_sees_function_level_imports() -> None:
    # The rule above would be empty if lazy imports were missed: the loaders' lazy import of the
    # planner (inside load()) must be found, and every layer must have modules under the rule.
    assert "planner" in _imports(PACKAGE / "loaders.py")
    assert "policy.generation" in _imports(PACKAGE / "loaders.py")
    checked = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in _layered_modules()}
    assert checked == set(ALLOWED) | ANYONE


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
    probes = [m for m in loaded if m.startswith(("cudaload.capability", "cudaload.model_facts", "cudaload.loaders"))]
    assert probes == [], probes
    assert heavy in ([], [""])
