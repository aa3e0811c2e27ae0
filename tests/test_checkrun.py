"""Exactly one module sequences the stages of a check (conformance/checkrun.py); every entry point builds a
CheckRun and hands it options. Checked over the package's source with ast, lazy imports included."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEQUENCER = "conformance.checkrun"
# Each stage's functions, by the module that defines them. A stage's own package may use them (its internals:
# explain/baseline.py calls explain/causes.py's explain); anything else goes through the CheckRun.
STAGES = {
    "render": {("conformance.render.stage", "render")},
    "judge": {("conformance.judge.pipeline", "judge_outcomes"), ("conformance.judge.classify", "result_for")},
    "tokens": {("conformance.judge.pipeline", "add_token_parity"), ("conformance.judge.tokens", "token_parity")},
    "explain": {("conformance.explain.baseline", "explain_with_baseline"), ("conformance.explain.causes", "explain"),
                ("conformance.explain", "explain")},
    "verdict": {("conformance.judge.pipeline", "apply_expectations")},
    "attribute": {("conformance.judge.attribution", "attribute_diverged")},
    "report": {("conformance.report", "build_report")},
}
# conformance.service.state: the service's POST /v1/check and /v1/check/batch (posted outcomes, judged through a
# CheckRun whose render stage's source is what was posted).
ENTRY_POINTS = ("conformance.cli.check", "conformance.cli.explain", "conformance.cli.history",
                "conformance.cli.service", "conformance.gate.plugin", "conformance.service.state")


def _modules() -> dict:
    found = {}
    for path in (ROOT / "conformance").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _stage_uses(module: str, path: Path) -> set:
    """The stages whose functions `module` imports (by name) or calls as an attribute of their module."""
    stage_of = {pair: stage for stage, pairs in STAGES.items() for pair in pairs}
    names = {name for _, name in stage_of}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            used.update(stage_of[(source, a.name)] for a in node.names if (source, a.name) in stage_of)
        elif isinstance(node, ast.Attribute) and node.attr in names - {"render", "explain"}:
            used.update(stage for (_, name), stage in stage_of.items() if name == node.attr)
    return used


def _own(module: str, stage: str) -> bool:
    """Whether `module` is inside the package that defines one of the stage's functions."""
    return any(module.startswith(source.rpartition(".")[0] + ".") or module == source
               for source, _ in STAGES[stage])


def test_only_the_check_run_calls_stages():
    offenders = {}
    for module, path in _modules().items():
        if module == SEQUENCER:
            continue
        foreign = {stage for stage in _stage_uses(module, path) if not _own(module, stage)}
        if foreign:
            offenders[module] = sorted(foreign)
    assert offenders == {}


def test_the_check_run_holds_every_stage_and_the_entry_points_build_one():
    modules = _modules()
    assert _stage_uses(SEQUENCER, modules[SEQUENCER]) == set(STAGES)
    for module in ENTRY_POINTS:
        text = modules[module].read_text(encoding="utf-8")
        assert "CheckRun(" in text or "check_run(" in text, module


def test_the_walk_sees_a_stage_call(tmp_path):
    # The check above must be able to fail: a module that chains judge and verdict itself is caught.
    probe = tmp_path / "probe.py"
    probe.write_text("def check(runner, cells):\n"
                     "    from conformance.judge.pipeline import apply_expectations, judge_outcomes\n"
                     "    from conformance import report\n"
                     "    return judge_outcomes, apply_expectations, report.build_report\n")
    assert _stage_uses("conformance.cli.probe", probe) == {"judge", "verdict", "report"}


def test_the_walk_sees_a_cell_judged_by_hand(tmp_path):
    # The service once judged posted outcomes cell by cell with result_for instead of through a CheckRun.
    probe = tmp_path / "state.py"
    probe.write_text("def check_one(golden, outcome):\n"
                     "    from conformance.judge.classify import result_for\n"
                     "    return result_for('service', 't', 'c', golden, outcome)\n")
    assert _stage_uses("conformance.service.state", probe) == {"judge"}
    assert not _own("conformance.service.state", "judge")


def test_posted_outcomes_are_judged_through_a_check_run():
    # The service's source: each request answered with the outcome posted for it, so one cell posted twice in a
    # batch keeps both outcomes, judged against the real golden like a local runner's.
    from conformance.checkrun import CheckRun
    from conformance.corpus.cases import load_cases
    from conformance.corpus.manifest import load_corpus
    from conformance.judge.expectations import Expectations
    from conformance.judge.goldens import GoldenStore
    from conformance.judge.pipeline import Cell
    from conformance.judge.status import Status
    from conformance.render.stage import Posted
    from runners.base import Rendered

    entry = load_corpus().by_id["axolotl-llama3"]
    case = next(c for c in load_cases() if c.id == "chat-ends-with-assistant")
    golden = GoldenStore()(entry.id, case.id)
    assert golden is not None and golden.kind == "rendered"
    requests = [case.request("", entry.bos_token, entry.eos_token, entry.id) for _ in range(2)]
    source = Posted([(requests[0], Rendered(golden.text)), (requests[1], Rendered(golden.text + "!"))])
    run = CheckRun([Cell(entry, case, r) for r in requests], tokens=False)
    judged = run.check(source, Posted.name, expectations=Expectations(Posted.name)).results
    assert [r.status for r in judged] == [Status.MATCH, Status.DIVERGED]
    assert judged[1].divergence.offset == len(golden.data) and judged[1].verdict is not None
