"""Data flows one way, and imports follow it: checked over every import statement of the package (at module
level or inside a function), transitively, and by importing in a fresh interpreter."""
from __future__ import annotations

import ast
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("conformance", "runners")


@lru_cache(maxsize=None)
def modules() -> dict:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


@lru_cache(maxsize=None)
def direct_imports(module: str) -> frozenset:
    """Every module of the project `module` imports anywhere in its text, with the packages on the way."""
    path = modules()[module]
    named = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)
    found = set()
    for name in named:
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules())
    found.discard(module)
    return frozenset(found)


def reachable(module: str) -> set:
    seen, todo = set(), [module]
    while todo:
        for imported in direct_imports(todo.pop()):
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return seen


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_import_walk_sees_imports_inside_functions():
    # The walk must see a lazy import: the gate's plugin imports the pipeline inside its hooks.
    assert "conformance.judge.pipeline" in reachable("conformance.gate.plugin")
    assert "runners.base" in reachable("conformance.judge.goldens")


def test_corpus_imports_neither_judge_nor_report():
    corpus = [m for m in modules() if _under(m, "conformance.corpus")]
    assert len(corpus) > 5
    offenders = {m: sorted(r for r in reachable(m) if _under(r, "conformance.judge") or _under(r, "conformance.report"))
                 for m in corpus}
    assert not {m: r for m, r in offenders.items() if r}


def test_runners_import_nothing_of_conformance():
    offenders = {m: sorted(r for r in direct_imports(m) if _under(r, "conformance"))
                 for m in modules() if _under(m, "runners")}
    assert not {m: r for m, r in offenders.items() if r}


def test_importing_the_report_loads_no_runner_module():
    code = ("import sys, conformance.report, conformance.report.render, conformance.report.html; "
            "print('\\n'.join(m for m in sys.modules if m == 'runners' or m.startswith('runners.')))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == []


def test_report_modules_import_no_engine_at_any_depth():
    # Module-level and lazy imports alike: a report rendered from a stored JSON needs no runner.
    for module in [m for m in modules() if _under(m, "conformance.report")]:
        assert not [r for r in reachable(module) if _under(r, "runners")], module


def test_one_atomic_write():
    """Files appear whole through conformance/files.py only: no other module of the package renames a temporary
    file over a target of its own."""
    offenders = []
    for module, path in modules().items():
        if not _under(module, "conformance") or module == "conformance.files":
            continue
        text = path.read_text(encoding="utf-8")
        if "mkstemp(" in text and "os.replace(" in text:
            offenders.append(module)
    assert offenders == []


# The floors of the package, bottom first (docs/ARCHITECTURE.md draws them): a module imports only from its own
# folder and from floors below it.
FLOORS = (
    ("runners",),
    ("conformance", "conformance.files"),
    ("conformance.corpus",),
    ("conformance.render",),
    ("conformance.judge",),
    ("conformance.report", "conformance.explain"),
    ("conformance.analysis",),
    ("conformance.checkrun",),
    ("conformance.gate", "conformance.service"),
    ("conformance.cli",),
)


def _floor(module: str) -> tuple:
    """(floor index, folder) of a module: its longest matching folder in FLOORS."""
    best = None
    for index, floor in enumerate(FLOORS):
        for folder in floor:
            if _under(module, folder) and (best is None or len(folder) > len(best[1])):
                best = (index, folder)
    return best


def test_imports_go_down_the_floors_only():
    upward = []
    for module in modules():
        floor, folder = _floor(module)
        for imported in direct_imports(module):
            other, other_folder = _floor(imported)
            if other_folder != folder and other >= floor:
                upward.append(f"{module} -> {imported}")
    assert upward == []
