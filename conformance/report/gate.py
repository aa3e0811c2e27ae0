"""The report behind the pytest gate: each runner's cells classified once per session (from the outcomes
GateSession already rendered), judged against its expectations, and written at session end with
`--chatgold-report DIR`."""
from __future__ import annotations

from pathlib import Path


class RunnerVerdicts:
    """One runner's results for the gate's selection: (template, case) -> (CellResult, verdict, Expectation)."""

    def __init__(self, section: dict, results: list, expectations):
        from ..expectations import verdict

        self.section = section
        self.cells = {}
        for result in results:
            expectation = expectations.get(result.template_id, result.case_id)
            self.cells[(result.template_id, result.case_id)] = (result, verdict(result, expectation), expectation)


def runner_verdicts(session, spec: str) -> RunnerVerdicts:
    cache = session.__dict__.setdefault("_chatgold_verdicts", {})
    if spec not in cache:
        from ..check import check_cells
        from ..expectations import load_expectations
        from ..matrix import iter_cells
        from . import runner_section

        outcomes = session.outcomes(spec)
        runner = session.runner(spec)
        cells = list(iter_cells(session.templates, session.cases))
        results = check_cells(runner.name, cells, outcomes=[outcomes[(c.template.id, c.case.id)] for c in cells])
        expectations = load_expectations(runner.name)
        section = runner_section(runner.describe(), results, expectations,
                                 {t.id: t for t in session.templates}, {c.id: c for c in session.cases})
        cache[spec] = RunnerVerdicts(section, results, expectations)
    return cache[spec]


AGREEMENT_KEY = "_chatgold_capability_agreement"


def gate_capability_agreement(session):
    """llama.cpp's capability agreement over the gate's templates, computed once with the session's own
    llamacpp runner (so its servers are reused); None when no checked runner is llama.cpp."""
    from . import capability_agreement, supports_capability_agreement

    if AGREEMENT_KEY not in session.__dict__:
        session.__dict__[AGREEMENT_KEY] = None
        for spec in session.__dict__.get("_chatgold_verdicts", {}):
            runner = session.runner(spec)
            if supports_capability_agreement(runner):
                session.__dict__[AGREEMENT_KEY] = capability_agreement(session.templates, runner)
                break
    return session.__dict__[AGREEMENT_KEY]


def write_gate_report(session, directory) -> list:
    """All report outputs for the runners the session checked (called from pytest_sessionfinish)."""
    from . import build_report, write_outputs

    cache = session.__dict__.get("_chatgold_verdicts", {})
    if not cache:
        return []
    opt = session.config.getoption
    sections = {v.section["runner"].get("name", spec): v.section for spec, v in cache.items()}
    selection = {"templates": opt("--chatgold-template"), "cases": opt("--chatgold-case"),
                 "features": opt("--chatgold-feature"), "shard": opt("--chatgold-shard"),
                 "template_count": len(session.templates), "case_count": len(session.cases)}
    agreement = gate_capability_agreement(session)
    session.close()  # a no-op after the session fixture's teardown; closes a runner reopened just above
    report = build_report(sections, selection, agreement)
    directory = Path(directory)
    return write_outputs(report, directory / "report.json", directory / "junit.xml", directory / "summary.md",
                         directory / "badges", directory / "report.html")
