"""The report behind the pytest gate: each runner's cells classified once per session (from the outcomes
GateSession already rendered), judged against its expectations, and written at session end with
`--chatgold-report DIR`."""
from __future__ import annotations

from pathlib import Path


class RunnerVerdicts:
    """One runner's results for the gate's selection: (template, case) -> (CellResult, verdict, Expectation)."""

    def __init__(self, runner_info: dict, results: list, expectations):
        from conformance.judge.expectations import verdict

        self.runner_info = runner_info
        self.results = results
        self.expectations = expectations
        self.cells = {}
        for result in results:
            expectation = expectations.get(result.template_id, result.case_id)
            self.cells[(result.template_id, result.case_id)] = (result, verdict(result, expectation), expectation)


def classify_runner(runner, cells: list, outcomes: list, goldens) -> RunnerVerdicts:
    """Judge a runner's outcomes (one per cell, in order). Attribution is left for later, done for all runners
    at once (attribute_session), because it costs more than everything else here."""
    from conformance.judge.status import check_cells
    from conformance.judge.expectations import load_expectations

    results = check_cells(runner.name, cells, outcomes=outcomes, attribute=False, goldens=goldens)
    return RunnerVerdicts(runner.describe(), results, load_expectations(runner.name))


def runner_verdicts(session, spec: str) -> RunnerVerdicts:
    return session.verdicts(spec)


def attribute_session(session, results) -> None:
    """Attribute the diverged results not attributed yet (one traced render per cell for all runners)."""
    from conformance.judge.attribution import attribute_results
    from conformance.judge.status import DIVERGED

    requests = session.requests()
    attribute_results((r, requests[(r.template_id, r.case_id)], session.goldens(r.template_id, r.case_id))
                      for r in results if r.status == DIVERGED and "attribution" not in r.extra)


def write_gate_report(session, directory) -> list:
    """All report outputs for the runners the session checked (called from pytest_sessionfinish)."""
    from conformance.report import build_report, runner_section, write_outputs

    checked = {}
    for spec in session.checked_specs():
        try:
            checked[spec] = session.verdicts(spec)
        except Exception as exc:  # its tests already failed with this; the report covers the others
            print(f"chatgold: {spec} left out of the report: {type(exc).__name__}: {exc}")
    if not checked:
        return []
    attribute_session(session, [r for v in checked.values() for r in v.results])
    templates = {t.id: t for t in session.templates}
    cases = {c.id: c for c in session.cases}
    sections = {}
    for spec, v in checked.items():
        sections[v.runner_info.get("name", spec)] = runner_section(v.runner_info, v.results, v.expectations,
                                                                   templates, cases)
    opt = session.config.getoption
    selection = {"templates": opt("--chatgold-template"), "cases": opt("--chatgold-case"),
                 "features": opt("--chatgold-feature"), "shard": opt("--chatgold-shard"),
                 "template_count": len(session.templates), "case_count": len(session.cases)}
    report = build_report(sections, selection, session.agreement())
    directory = Path(directory)
    return write_outputs(report, directory / "report.json", directory / "junit.xml", directory / "summary.md",
                         directory / "badges", directory / "report.html")
