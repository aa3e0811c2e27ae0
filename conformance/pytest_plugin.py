"""The conformance gate as a pytest plugin (registered through the `pytest11` entry point `chatgold`).

The gate's tests live in conformance/gate/ (`pytest --pyargs conformance.gate`). Each runner renders the
whole selected matrix once per session through `render_many` (so engines batch and parallelise); test items
are then parametrized per template, or per cell with `--chatgold-granularity cell`, and only look results up.
The reference's items compare with the goldens through syrupy (GoldenExtension), so
`pytest --snapshot-update` regenerates them.
"""
from __future__ import annotations

import pytest

from runners import REFERENCE_RUNNER


def pytest_addoption(parser):
    group = parser.getgroup("chatgold", "chatgold conformance gate")
    group.addoption("--chatgold-runner", action="append", default=[], metavar="RUNNER",
                    help="engine runner to check against the goldens (repeatable; name or command:'<argv>')")
    group.addoption("--chatgold-template", action="append", default=[], metavar="GLOB", help="template ids to include")
    group.addoption("--chatgold-case", action="append", default=[], metavar="GLOB", help="case ids to include")
    group.addoption("--chatgold-feature", action="append", default=[], metavar="TAG", help="only cases with this feature")
    group.addoption("--chatgold-shard", default=None, metavar="I/N", help="run shard I of N (whole templates per shard)")
    group.addoption("--chatgold-granularity", choices=("template", "cell"), default="template",
                    help="one test item per template (default, fast) or per template x case")
    group.addoption("--chatgold-workers", type=int, default=2, help="engine processes per runner (default 2)")
    group.addoption("--chatgold-report", default=None, metavar="DIR",
                    help="write the divergence report (JSON, JUnit, Markdown, badges, HTML) into DIR at session end")


def select(config):
    """(corpus, all cases, selected templates, selected cases, whether the selection is the whole matrix)."""
    cached = getattr(config, "_chatgold_selection", None)
    if cached is not None:
        return cached
    from .cases import load_cases, select_cases
    from .corpus import load_corpus
    from .matrix import shard_of

    opt = config.getoption
    corpus = load_corpus()
    all_cases = load_cases()
    templates = corpus.select(opt("--chatgold-template") or None)
    cases = select_cases(all_cases, opt("--chatgold-case") or None, opt("--chatgold-feature") or None)
    shard = opt("--chatgold-shard")
    if shard:
        try:
            index, count = (int(x) for x in shard.split("/"))
        except ValueError:
            raise pytest.UsageError(f"--chatgold-shard {shard}: expected I/N, e.g. 2/8") from None
        if not 1 <= index <= count:
            raise pytest.UsageError(f"--chatgold-shard {shard}: I must be between 1 and N")
        templates = [t for t in templates if shard_of(t.id, count) == index - 1]
    full = not (opt("--chatgold-template") or opt("--chatgold-case") or opt("--chatgold-feature") or shard)
    config._chatgold_selection = (corpus, all_cases, templates, cases, full)
    return config._chatgold_selection


class GateSession:
    """What the gate selected, and each runner's outcomes, computed once."""

    def __init__(self, config):
        self.config = config
        self.corpus, self.all_cases, self.templates, self.cases, self.full = select(config)
        self.workers = config.getoption("--chatgold-workers")
        self._outcomes: dict = {}
        self._runners: dict = {}

    @property
    def engine_specs(self) -> list[str]:
        return [spec for spec in self.config.getoption("--chatgold-runner") if spec != REFERENCE_RUNNER]

    def runner(self, spec: str):
        if spec not in self._runners:
            from runners import get_runner

            self._runners[spec] = get_runner(spec, workers=self.workers)
        return self._runners[spec]

    def outcomes(self, spec: str) -> dict:
        """(template id, case id) -> Outcome, for the whole selection, rendered on first use."""
        if spec not in self._outcomes:
            from .matrix import iter_cells

            cells = list(iter_cells(self.templates, self.cases))
            outcomes = self.runner(spec).render_many([c.request for c in cells])
            self._outcomes[spec] = {(c.template.id, c.case.id): o for c, o in zip(cells, outcomes)}
        return self._outcomes[spec]

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()


def pytest_configure(config):
    config.addinivalue_line("markers", "chatgold_gate: a conformance gate test (conformance/gate)")


@pytest.fixture(scope="session")
def chatgold_session(request):
    session = GateSession(request.config)
    request.config._chatgold_session = session  # for pytest_sessionfinish (the report)
    yield session
    if request.config.getoption("--chatgold-report"):
        from .report.gate import gate_capability_agreement

        gate_capability_agreement(session)  # while the llamacpp runner is still open
    session.close()


def pytest_sessionfinish(session):
    gate = getattr(session.config, "_chatgold_session", None)
    directory = session.config.getoption("--chatgold-report", None)
    if gate is not None and directory:
        from .report.gate import write_gate_report

        for path in write_gate_report(gate, directory):
            print(f"chatgold: wrote {path}")


def pytest_generate_tests(metafunc):
    names = metafunc.fixturenames
    if not {"chatgold_template", "chatgold_runner", "chatgold_case"} & set(names):
        return
    opt = metafunc.config.getoption
    _corpus, _all_cases, templates, cases, _full = select(metafunc.config)
    if "chatgold_runner" in names:
        specs = [s for s in opt("--chatgold-runner") if s != REFERENCE_RUNNER]
        metafunc.parametrize("chatgold_runner", specs, ids=[_safe_id(s) for s in specs], scope="session")
    if "chatgold_template" in names:
        ids = [t.id for t in templates]
        metafunc.parametrize("chatgold_template", ids, ids=ids)
    if "chatgold_case" in names:
        if opt("--chatgold-granularity") == "cell":
            ids = [c.id for c in cases]
            metafunc.parametrize("chatgold_case", ids, ids=ids)
        else:
            metafunc.parametrize("chatgold_case", [None], ids=["all-cases"])


def _safe_id(spec: str) -> str:
    return spec if spec.isidentifier() or spec.replace("-", "").isalnum() else spec.replace(" ", "_")[:40]
