"""The conformance gate as a pytest plugin (registered through the `pytest11` entry point `chatgold`).

The gate's tests live in conformance/gate/ (`pytest --pyargs conformance.gate`). Each runner renders the
whole selected matrix once per session through `render_many` (so engines batch and parallelise); test items
are then parametrized per template, or per cell with `--chatgold-granularity cell`, and only look results up.
The reference's items compare with the goldens through syrupy (GoldenExtension), so
`pytest --snapshot-update` regenerates them.
"""
from __future__ import annotations

import gc
import threading
from typing import Optional

import pytest

from conformance.background import Job
from conformance.collector import hold_collections, release_collections
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
    group.addoption("--chatgold-parallel", type=int, default=3, metavar="N",
                    help="runners rendering at the same time (default 3)")
    group.addoption("--chatgold-report", default=None, metavar="DIR",
                    help="write the divergence report (JSON, JUnit, Markdown, badges, HTML) into DIR at session end")
    group.addoption("--chatgold-no-explain", action="store_true",
                    help="do not look for the root causes of cells an engine's baseline does not know "
                         "(chatgold explain; cached, and only those cells)")
    group.addoption("--chatgold-no-cache", action="store_true", default=False,
                    help="render every cell again: the result store is not read (the fresh outcomes replace what "
                         "it held)")
    group.addoption("--chatgold-verify-reference", action="store_true", default=False,
                    help="re-render every golden (and capability probe) through the reference even when the "
                         "result store holds it for the same transformers, jinja2, template and case")
    group.addoption("--chatgold-reconfirm-causes", action="store_true", default=False,
                    help="render every known cause's reproducer again on both sides (by default a cause is "
                         "re-confirmed when a cell it covers changed outcome or a runner's identity changed; "
                         "otherwise its reproducer's outcomes come from the result store)")
    group.addoption("--chatgold-timings", default=None, metavar="FILE",
                    help="write the session's per-stage wall and CPU seconds (JSON) to FILE, for benchmarks")


def select(config):
    """The gate's Selection (judge.pipeline), made once per session."""
    cached = getattr(config, "_chatgold_selection", None)
    if cached is not None:
        return cached
    from conformance.judge.pipeline import Selection

    opt = config.getoption
    try:
        config._chatgold_selection = Selection.load(opt("--chatgold-template"), opt("--chatgold-case"),
                                                    opt("--chatgold-feature"), opt("--chatgold-shard"))
    except ValueError as exc:
        raise pytest.UsageError(f"--chatgold-shard: {exc}") from None
    return config._chatgold_selection


CAPABILITIES_JOB = "capabilities"
PROPERTIES_JOB = "properties"
AGREEMENT_JOB = "capability-agreement"
ANALYSIS_JOBS = (CAPABILITIES_JOB, PROPERTIES_JOB)  # reference analyses, not engines


def _job_cost(spec: Optional[str]) -> float:
    if spec is None:
        return 0.0
    from runners import cost_hint

    if spec == PROPERTIES_JOB:
        return 4.0  # about four reference renders per matrix cell: start it early
    return 1.0 if spec == CAPABILITIES_JOB else cost_hint(spec)


class GateSession:
    """What the gate selected, and each runner's outcomes, computed once.

    Every runner the collected tests need renders the whole selection on its own thread, `--chatgold-parallel`
    of them at a time, so one engine's processes work while another's wait or the suite compares; engines
    are judged (classified against goldens and expectations) on the same thread as soon as they finish."""

    def __init__(self, config):
        from conformance.judge.goldens import GoldenStore
        from conformance.render.store import ResultStore

        self.config = config
        # Outcomes already rendered under the same runner identity, template and case (render/store.py).
        self.store = ResultStore()
        self.no_cache = config.getoption("--chatgold-no-cache")
        # Regenerating goldens (--snapshot-update) always renders through the reference.
        self.verify_reference = (config.getoption("--chatgold-verify-reference")
                                 or bool(getattr(config.option, "update_snapshots", False)))
        self.selection = select(config)
        self.corpus, self.all_cases = self.selection.corpus, self.selection.all_cases
        self.templates, self.cases, self.full = self.selection.templates, self.selection.cases, self.selection.full
        self.workers = config.getoption("--chatgold-workers")
        self.goldens = GoldenStore()
        self._slots = threading.BoundedSemaphore(max(1, config.getoption("--chatgold-parallel")))
        self._lock = threading.Lock()
        self._cells: Optional[list] = None
        self._check = None
        self._jobs: dict = {}
        self._runners: dict = {}  # (spec, role) -> runner
        self._agreement_spec: Optional[str] = None
        self._explain_lock = threading.Lock()
        from conformance.timings import StageTimes

        self.times = StageTimes() if config.getoption("--chatgold-timings") else None

    @property
    def cells(self) -> list:
        with self._lock:
            if self._cells is None:
                self._cells = self.selection.cells()
            return self._cells

    @property
    def check(self):
        """The session's CheckRun (conformance/checkrun.py): the gate configures it, each job runs it."""
        cells = self.cells
        with self._lock:
            if self._check is None:
                from conformance.checkrun import CheckRun, ExplainOptions

                opt = self.config.getoption
                explain = None if opt("--chatgold-no-explain") else ExplainOptions(
                    reconfirm=bool(opt("--chatgold-reconfirm-causes")))
                self._check = CheckRun(
                    cells, goldens=self.goldens, store=self.store, refresh=self.no_cache,
                    tokens=bool(opt("--chatgold-report")),  # token parity is shown by the report, not gated
                    explain=explain, attribute=True, families={t.id: t.family for t in self.templates},
                    reference=lambda: self.runner(REFERENCE_RUNNER, role="explain"),
                    render_slot=self._slots, explain_lock=self._explain_lock, times=self.times)
            return self._check

    def requests(self) -> dict:
        """(template id, case id) -> RenderRequest for the selection."""
        return self.check.requests

    def runner(self, spec: str, role: Optional[str] = None, workers: Optional[int] = None):
        """The session's runner for a spec. A side job names its own `role`: a second instance, so the job
        renders while the spec's matrix job uses the first."""
        with self._lock:
            if (spec, role) not in self._runners:
                from runners import get_runner

                self._runners[(spec, role)] = get_runner(spec, workers=workers or self.workers)
            return self._runners[(spec, role)]

    def start(self, specs) -> None:
        """Begin rendering for these runner specs (and CAPABILITIES_JOB): the slowest per cell first, so the
        longest job does not start last. With a report to write, llama.cpp's capability agreement becomes a
        job too, rather than a serial tail after the last test (about a minute for the whole corpus)."""
        specs = sorted(specs, key=lambda spec: -_job_cost(spec))
        for spec in specs:
            self._job(spec)
        if self.config.getoption("--chatgold-report"):
            engines = [spec for spec in specs if spec not in (REFERENCE_RUNNER, *ANALYSIS_JOBS)]
            self._agreement_spec = next((spec for spec in engines
                                         if self.runner(spec).reports_capabilities()), None)
            if self._agreement_spec is not None:
                self._job(AGREEMENT_JOB)

    def _job(self, spec: str) -> Job:
        with self._lock:
            job = self._jobs.get(spec)
        if job is not None:
            return job
        cells = self.cells
        # Runners are built here, on the caller's thread (signal handlers, imports).
        if spec == CAPABILITIES_JOB:
            # One process: the probes are few, and another transformers start costs seconds of CPU.
            runner = self.cached(REFERENCE_RUNNER, self.runner(REFERENCE_RUNNER, role=CAPABILITIES_JOB, workers=1))
            work = lambda: self._run_capabilities(runner)  # noqa: E731
        elif spec == PROPERTIES_JOB:
            # Every variant through the result store (the base renders are the reference's matrix cells), but
            # the determinism check's repeat really renders again: a stored answer would repeat the first.
            raw = self.runner(REFERENCE_RUNNER, role=PROPERTIES_JOB)
            runner = self.cached(REFERENCE_RUNNER, raw)
            work = lambda: self._run_properties(runner, raw)  # noqa: E731
        elif spec == AGREEMENT_JOB:
            runner = self.cached(self._agreement_spec, self.runner(self._agreement_spec, role=AGREEMENT_JOB))
            work = lambda: self._run_agreement(runner)  # noqa: E731
        else:
            runner = self.runner(spec)
            work = lambda: self._run_matrix(spec, runner, cells)  # noqa: E731
        with self._lock:
            job = self._jobs.get(spec)
            if job is None:
                job = self._jobs[spec] = Job(spec, work).start()
        return job

    def _timed(self, stage: str, who: str = ""):
        from conformance.timings import timed

        return timed(self.times, stage, who)

    def refresh(self, spec: str) -> bool:
        """Whether this runner renders every cell again instead of reading the result store."""
        return self.no_cache or (self.verify_reference and spec == REFERENCE_RUNNER)

    def cached(self, spec: str, runner):
        """The runner behind the result store (capability probes and agreement take a runner)."""
        from conformance.render.store import CachedRunner

        return CachedRunner(runner, self.store, self.refresh(spec))

    def _run_matrix(self, spec: str, runner, cells: list):
        if spec == REFERENCE_RUNNER:
            outcomes = self.check.outcomes(runner, refresh=self.refresh(spec))
            found = {c.key: o for c, o in zip(cells, outcomes)}, None
        else:
            # Judged (and explained) on this thread as soon as the engine is done; attribution waits for the
            # report.
            results = self.check.check(runner, spec)
            found = {key: r.outcome for key, r in results.by_cell.items()}, results
        return found

    def _run_capabilities(self, runner):
        from conformance.analysis.capabilities import compute_capabilities

        with self._slots, self._timed("capabilities"):
            results, failures = compute_capabilities(self.templates, runner)
        return results, dict(failures)

    def _run_properties(self, runner, repeat=None):
        from conformance.analysis.properties import compute_properties

        with self._slots, self._timed("properties"):  # every case, whatever the selection: a record reads them all
            store = None if self.refresh(REFERENCE_RUNNER) else self.store
            results, failures = compute_properties(self.templates, runner, cases=self.all_cases, repeat=repeat,
                                                   store=store)
        return results, dict(failures)

    def properties(self) -> tuple:
        """(template id -> property record, template id -> reference failure), derived through the reference."""
        return self._job(PROPERTIES_JOB).result()

    def _run_agreement(self, runner):
        from conformance.analysis.agreement import agreement_section

        with self._slots, self._timed("agreement"):
            return agreement_section(self.templates, runner)

    def agreement(self) -> Optional[dict]:
        """llama.cpp's capability agreement over the selection, for the report; None when not computed."""
        with self._lock:
            job = self._jobs.get(AGREEMENT_JOB)
        return job.result() if job is not None else None

    def outcomes(self, spec: str) -> dict:
        """(template id, case id) -> Outcome, for the whole selection."""
        return self._job(spec).result()[0]

    def results(self, spec: str):
        """An engine's judged results (judge.pipeline.RunnerResults) for the whole selection."""
        return self._job(spec).result()[1]

    def capabilities(self) -> tuple:
        """(template id -> capability record, template id -> probe failure), derived through the reference."""
        return self._job(CAPABILITIES_JOB).result()

    def checked_specs(self) -> list[str]:
        """The engines whose matrix this session rendered (started), in start order."""
        with self._lock:
            return [spec for spec in self._jobs if spec not in (REFERENCE_RUNNER, *ANALYSIS_JOBS, AGREEMENT_JOB)]

    def attribute(self, results) -> None:
        """Where each diverged result's first differing golden byte came from (for failure messages)."""
        self.check.attribute_results(results)

    def write_report(self, directory) -> list:
        """Every report output for the engines the session checked (called from pytest_sessionfinish)."""
        from pathlib import Path

        from conformance.checkrun import Outputs

        runs = []
        for spec in self.checked_specs():
            try:
                runs.append(self.results(spec))
            except Exception as exc:  # its tests already failed with this; the report covers the others
                print(f"chatgold: {spec} left out of the report: {type(exc).__name__}: {exc}")
        if not runs:
            return []
        # The properties derived this session when their job ran, else the stored records.
        with self._lock:
            ran = PROPERTIES_JOB in self._jobs
        directory = Path(directory)
        outputs = Outputs(directory / "report.json", directory / "junit.xml", directory / "summary.md",
                          directory / "badges", directory / "report.html")
        properties = self.properties()[0] if ran else None
        with self._timed("report"):
            return self.check.report(runs, self.selection, outputs, self.agreement(), analysis=True,
                                     properties=properties)[1]

    def close(self) -> None:
        with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
        for runner in runners:
            runner.close()


# Options whose value is a path: pytest finds its rootdir before plugins add their options, so a value given
# as its own argument and naming an existing folder is taken for a test path and can become the rootdir.
PATH_OPTIONS = ("--chatgold-report", "--chatgold-timings")


def _rootdir_from_option(config) -> Optional[str]:
    """The path option whose value pytest took its rootdir from, or None. Then this checkout's pytest settings
    and conftest scopes are lost (its tests' session fixtures would apply to the gate: a private result store,
    every cell rendered afresh)."""
    from pathlib import Path

    args = list(config.invocation_params.args)
    if config.inipath is not None or any(a == "--rootdir" or a.startswith("--rootdir=") for a in args):
        return None  # a configuration file was found: the rootdir is its folder
    root = Path(config.rootpath).resolve()
    for option, value in zip(args, args[1:]):
        if option in PATH_OPTIONS and Path(value).exists():
            path = Path(config.invocation_params.dir, value).resolve()
            if root == path or root in path.parents:
                return f"{option} {value}"
    return None


def pytest_configure(config):
    import time

    taken = _rootdir_from_option(config)
    if taken is not None:
        option, value = taken.split(" ", 1)
        raise pytest.UsageError(f"pytest took its rootdir ({config.rootpath}) from `{taken}`, an existing folder "
                                f"given as the option's own argument (pytest reads paths before plugins add their "
                                f"options); write `{option}={value}` or pass --rootdir")
    config._chatgold_started = (time.perf_counter(), time.process_time())
    config.addinivalue_line("markers", "chatgold_gate: a conformance gate test (conformance/gate)")
    config.addinivalue_line("markers", "chatgold_renders(*jobs): the session jobs a gate test reads (a runner "
                                       "spec, or 'capabilities'), started together before the first test")


def _item_jobs(item) -> list:
    """The session jobs a test reads: its `chatgold_runner` parameter and its chatgold_renders marks."""
    callspec = getattr(item, "callspec", None)
    jobs = [callspec.params["chatgold_runner"]] if callspec and "chatgold_runner" in callspec.params else []
    for mark in item.iter_markers("chatgold_renders"):
        jobs.extend(mark.args)
    return jobs


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Tests of quick jobs first: the slowest job's tests then come last, when its results are in, instead of
    holding up everything behind them (pytest's sort is stable, so other tests keep their order)."""
    costs: dict = {}  # a job's cost looked up once, not once an item (16,275 items on the full gate)

    def cost(job: str) -> float:
        if job not in costs:
            costs[job] = _job_cost(job)
        return costs[job]

    items.sort(key=lambda item: max((cost(job) for job in _item_jobs(item)), default=0.0))


def pytest_collection_finish(session):
    """Remember the jobs the selected tests need, so the session starts them all at once."""
    needed = []
    for item in session.items:
        needed.extend(job for job in _item_jobs(item) if job not in needed)
    session.config._chatgold_needed = needed


@pytest.fixture(scope="session")
def chatgold_case():
    """None: a test item covers every selected case of its template (--chatgold-granularity cell parametrizes
    this with each case id instead)."""
    return None


@pytest.fixture(scope="session")
def chatgold_session(request):
    session = GateSession(request.config)
    request.config._chatgold_session = session  # for pytest_sessionfinish (the report)
    # What the gate makes (every outcome, verdict and record of every runner) lives until it exits, and holds
    # next to no cycles: full collections only walked it again and again, a fifth of a warm full gate's CPU
    # (103.8 s wall against 81.8 s with no collector, the same 4.3 GB peak). Until the report is written, young
    # objects are still collected, each about twice, and the old ones left alone (77.7 s; 76.9 s with none):
    # conformance/collector.py's pace, held for the whole session rather than per check.
    hold_collections()
    session.start(getattr(request.config, "_chatgold_needed", []))
    yield session
    session.agreement()  # its runner must stay open until it is done
    session.close()


def pytest_terminal_summary(terminalreporter):
    """Each checked engine's root causes that changed against its baseline: new, fixed, moved."""
    gate = getattr(terminalreporter.config, "_chatgold_session", None)
    if gate is None:
        return
    from conformance.report.changes import run_change_summary, summary_lines

    for spec in gate.checked_specs():
        try:
            results = gate.results(spec)
        except Exception:  # the engine's own failure is reported by its tests already
            continue
        if results is not None:
            terminalreporter.write_line(f"chatgold {spec}:")
            for line in summary_lines(run_change_summary(results)):
                terminalreporter.write_line(line)


def pytest_sessionfinish(session):
    gate = getattr(session.config, "_chatgold_session", None)
    try:
        _finish(session, gate)
    finally:
        if gate is not None:
            # Everything the session holds lives until exit, where pytest runs gc.collect() several times:
            # out of its way, and the collector back as it was.
            gc.freeze()
            release_collections()


def _finish(session, gate) -> None:
    directory = session.config.getoption("--chatgold-report", None)
    if gate is not None and directory:
        for path in gate.write_report(directory):
            print(f"chatgold: wrote {path}")
    if gate is not None:
        gate.store.prune_if_needed()
        counters = gate.store.counters
        print(f"chatgold: result store {gate.store.root}: {counters.hits} cells reused, {counters.rendered} rendered "
              f"({counters.written} stored), {len(counters.corrupt)} corrupt packs rendered again")
        if counters.tokens_reused or counters.tokens_asked:
            print(f"chatgold: token parity: {counters.tokens_reused} verdicts reused, {counters.tokens_asked} asked")
        _write_timings(session.config, gate)


def _write_timings(config, gate) -> None:
    path = config.getoption("--chatgold-timings", None)
    if not path or gate.times is None:
        return
    import json
    import time
    from pathlib import Path

    wall, cpu = config._chatgold_started
    data = {"session": {"wall": round(time.perf_counter() - wall, 3), "cpu": round(time.process_time() - cpu, 3)},
            **gate.times.as_dict(), "store": gate.store.counters.as_dict()}
    Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def pytest_generate_tests(metafunc):
    names = metafunc.fixturenames
    if not {"chatgold_template", "chatgold_runner", "chatgold_case"} & set(names):
        return
    opt = metafunc.config.getoption
    selection = select(metafunc.config)
    templates, cases = selection.templates, selection.cases
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
        # Otherwise the chatgold_case fixture answers None (all of a template's cases) once a session: a
        # parameter would be a fixture set up again for each of the 16,275 items.


def _safe_id(spec: str) -> str:
    return spec if spec.isidentifier() or spec.replace("-", "").isalnum() else spec.replace(" ", "_")[:40]
