"""Upstream is cited by symbol and version ("transformers 5.22-5.25 modeling_utils.py:
PreTrainedModel.get_compiled_call"), never by line alone: lines drift between releases (4 of 16 sampled line
citations pointed at other code in 5.25). Each symbol cited for the installed version must exist there, so a
release that renames or removes it fails this test instead of leaving a comment that lies."""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

from packaging.version import Version

SRC = Path(__file__).parents[1] / "src" / "cudaload"
PACKAGES = ("transformers", "peft", "bitsandbytes", "accelerate", "kernels", "torchao", "torch", "deepspeed")
_VERSION = r"\d+\.\d+(?:\.\d+)?"
CITATION = re.compile(
    rf"(?:\b(?P<package>{'|'.join(PACKAGES)}) )?(?P<low>{_VERSION})(?:-(?P<high>{_VERSION}))? "
    r"(?P<path>[A-Za-z_][\w/]*\.py): `?(?P<symbol>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)"
)


def _citations() -> list[tuple[str, str, str, str, str]]:
    """(where, package, version range, path, symbol) for every citation in src/, comment lines joined."""
    found = []
    for file in sorted(SRC.rglob("*.py")):
        text = re.sub(r"\n\s*(?:#\s*)?", " ", file.read_text())
        for match in CITATION.finditer(text):
            package = match["package"] or "transformers"
            found.append(
                (file.name, package, match["low"], match["high"] or match["low"], match["path"], match["symbol"])
            )
    return found


@cache
def _package_root(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def _installed(package: str) -> Version | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return Version(version(package).split("+")[0])
    except PackageNotFoundError:
        return None


def _covers(low: str, high: str, installed: Version) -> bool:
    """Whether a cited range ("5.22-5.25", "5.25", "0.50.2") covers the installed release (by its precision)."""
    parts = len(high.split("."))
    top = Version(".".join(str(n) for n in (*installed.release[:parts],)))
    return Version(low) <= installed and top <= Version(high)


def _defines(tree: ast.AST, dotted: str) -> bool:
    """Whether `tree` defines `dotted`: a class, function or assignment anywhere, then its members."""
    first, *rest = dotted.split(".")
    scopes: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == first:
            scopes.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == first for t in targets):
                scopes.append(node)
    for name in rest:
        scopes = [child for scope in scopes for child in ast.walk(scope) if _names(child) == name]
    return bool(scopes)


def _names(node: ast.AST) -> str | None:
    """The name a class, function or single-name assignment (a class attribute: `TrainingArguments.default_optim`)
    defines; None for any other node."""
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name
    target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
    target = node.target if isinstance(node, ast.AnnAssign) else target
    return target.id if isinstance(target, ast.Name) else None


def test_every_cited_symbol_exists_in_the_installed_release() -> None:
    citations = _citations()
    assert len(citations) >= 10  # the pattern still finds the citations
    checked, missing = 0, []
    for where, package, low, high, path, symbol in citations:
        root, installed = _package_root(package), _installed(package)
        if root is None or installed is None or not _covers(low, high, installed):
            continue  # a release that is not installed here: the other dependency set checks it
        files = [f for f in root.rglob(Path(path).name) if f.as_posix().endswith(path)]
        if not any(_defines(ast.parse(f.read_text()), symbol) for f in files):
            missing.append(f"{where}: {package} {low}-{high} {path}: {symbol}")
        checked += 1
    assert checked >= 5
    assert missing == []


def test_a_symbol_that_is_not_there_is_caught() -> None:
    tree = ast.parse("class A:\n    d: int = 2\n    def b(self): ...\nC = 1\n")
    assert _defines(tree, "A.b") and _defines(tree, "C") and _defines(tree, "A.d")
    assert not _defines(tree, "A.c") and not _defines(tree, "B") and not _defines(tree, "C.d")
    assert _covers("5.22", "5.25", Version("5.25.0")) and not _covers("5.22", "5.24", Version("5.25.0"))


# "quantizer_mxfp4.py:85-88", "modeling_qwen3.py: 60", "(line 61", "lines 63-121": a line number, not a symbol.
LINE_CITATION = re.compile(r"\b\w+\.py: ?\d+|\blines? \d+")


def test_no_upstream_is_cited_by_line_number() -> None:
    found = [
        f"{file.relative_to(SRC)}:{number}: {line.strip()}"
        for file in sorted(SRC.rglob("*.py"))
        for number, line in enumerate(file.read_text().splitlines(), 1)
        if LINE_CITATION.search(line)
    ]
    assert found == []
    assert LINE_CITATION.search("(quantizer_mxfp4.py:85-88)") and LINE_CITATION.search("5.22.2 lines 80-102")
    assert not LINE_CITATION.search("5.22-5.25 quantizer_mxfp4.py: Mxfp4HfQuantizer.validate_environment")
