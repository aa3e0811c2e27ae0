"""The explain package's shape, read from its source with ast: explain() runs its named stages in their one
order (and nothing else runs them), and no attribute is set from outside on an object whose class does not
declare it (no bolted-on attributes: typed fields and return values carry what the stages hand on)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPLAIN = ROOT / "conformance" / "explain"
STAGES = ("plan_groups", "look_up", "reduce_groups", "own_differences", "cluster_causes", "_merge_by_mechanism", "confirm_causes",
          "rank_causes")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _calls(node: ast.AST) -> list:
    """The names of the plain functions `node` calls, in source order."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return [c.func.id for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def test_explain_runs_its_stages_in_their_order():
    tree = _tree(EXPLAIN / "causes.py")
    explain = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "explain")
    assert [name for name in _calls(explain) if name in STAGES] == list(STAGES)
    for path in EXPLAIN.glob("*.py"):
        for function in ast.walk(_tree(path)):
            if isinstance(function, ast.FunctionDef) and function.name not in STAGES + ("explain",):
                assert not set(_calls(function)) & set(STAGES), (path.name, function.name)


def test_the_plan_stage_does_not_classify_a_judged_cell_again():
    # A judged cell's symptom comes from the status the judge stage gave it (signature.symptom_for).
    tree = _tree(EXPLAIN / "causes.py")
    plan = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "plan_groups")
    calls = set(_calls(plan))
    assert "symptom_for" in calls and not calls & {"symptom_of", "classify", "compare", "result_for"}


def _declared() -> tuple:
    """(the names the project's classes declare: fields, class attributes, attributes set on self; the names
    of methods and properties). By name, not by type: a name one class declares passes for any object."""
    data, methods = set(), set()
    for path in list((ROOT / "conformance").rglob("*.py")) + list((ROOT / "runners").rglob("*.py")):
        for cls in ast.walk(_tree(path)):
            if not isinstance(cls, ast.ClassDef):
                continue
            for item in cls.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    data.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    data.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    methods.add(item.name)
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                        and isinstance(node.value, ast.Name) and node.value.id == "self":
                    data.add(node.attr)
    # template.py edits jinja2's parse trees: the fields jinja2's node classes declare.
    from jinja2 import nodes

    data.update(name for cls in vars(nodes).values() if isinstance(cls, type) and issubclass(cls, nodes.Node)
                for name in cls.fields + cls.attributes)
    return data, methods - data


def _bolted(path: Path, declared: set, methods: set) -> list:
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            if node.attr not in declared or node.attr in methods:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


def test_explain_sets_no_attribute_a_class_does_not_declare():
    declared, methods = _declared()
    assert [b for path in sorted(EXPLAIN.glob("*.py")) for b in _bolted(path, declared, methods)] == []


def test_the_walk_sees_a_bolted_on_attribute(tmp_path):
    # What explain once did: a private list set on a Cause, a method replaced on a Reduction.
    probe = tmp_path / "probe.py"
    probe.write_text("def plan(cause, reduction):\n"
                     "    cause._candidates = []\n"
                     "    reduction.run = lambda: None\n"
                     "    cause.title = ''\n")
    declared, methods = _declared()
    assert _bolted(probe, declared, methods) == ["probe.py:2 ._candidates", "probe.py:3 .run"]


def _engine_attributes_read(path: Path) -> set:
    """Attribute names `path` reads or writes on anything, plus names it passes to getattr/setattr as text."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "setattr", "hasattr") and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            names.add(node.args[1].value)
    return names


def test_the_suite_reaches_no_runner_internals_for_its_scratch_space():
    # A reducer's scratch folder and idle servers go through Runner.scratch_space, the faster candidate route
    # through Runner.reduction_runner: nothing in conformance/ knows llama.cpp's settings by name.
    internals = {"models_dir", "idle_servers", "_reducer", "reduce_in_process"}
    for path in (ROOT / "conformance").rglob("*.py"):
        assert not _engine_attributes_read(path) & internals, path.relative_to(ROOT)


def test_llamacpp_scratch_space_takes_its_models_and_idle_servers_and_gives_them_back(tmp_path):
    from runners.base import Runner
    from runners.llamacpp.runner import LlamaCppRunner

    engine = LlamaCppRunner.__new__(LlamaCppRunner)  # the settings only: no server, no build
    engine.models_dir, engine.idle_servers = tmp_path / "models", 0
    with engine.scratch_space(tmp_path / "scratch", idle=3):
        assert (engine.models_dir, engine.idle_servers) == (tmp_path / "scratch", 3)
    assert (engine.models_dir, engine.idle_servers) == (tmp_path / "models", 0)
    with Runner.scratch_space(engine, tmp_path / "other", idle=5):  # the interface's default keeps nothing
        assert engine.models_dir == tmp_path / "models"
