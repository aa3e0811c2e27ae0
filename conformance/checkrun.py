"""One check run: the stages of a check, in their one order, configured by every entry point.

    select -> render -> judge -> tokens -> explain -> verdict -> attribute -> report

`chatgold check`, `expectations update`, `explain`, `history`, `remote-check` and the pytest gate each build a
CheckRun and say which stages run and which outputs are written; none of them calls a stage itself (a test
holds this: tests/test_checkrun.py). The stages are typed functions elsewhere (render/stage.py, judge/pipeline.py,
judge/tokens.py, explain/, judge/attribution.py, report/); only this module calls them in sequence.

The verdict is decided once per cell, after causes are known: the explain stage reads the baseline to decide
which cells need a cause, but only the verdict stage writes a verdict. With the explain stage off, a cell the
baseline knows gets the same verdict it gets with it on (its cause is the baseline's).

One GoldenStore serves every stage of a run (judge, tokens, explain, attribution): each golden is read once.
"""
from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Optional, Sequence

from conformance.collector import few_collections
from conformance.judge.expectations import Expectations, baseline_directory, load_expectations
from conformance.judge.goldens import GoldenStore
from conformance.judge.pipeline import (
    Cell,
    GoldenJudge,
    RunnerResults,
    add_token_parity,
    apply_expectations,
    judge_outcomes,
    requests_by_cell,
)
from conformance.render.stage import render, runner_info
from conformance.timings import timed

STAGES = ("select", "render", "judge", "tokens", "explain", "verdict", "attribute", "report")

Progress = Optional[Callable[[int, int], None]]


@dataclass(frozen=True)
class ExplainOptions:
    """What the explain stage does.

    scope "baseline": the cells the runner's baseline does not know as they are, plus a check that every known
    cause the selection touches still reproduces (`chatgold check`, the gate, `expectations update`);
    scope "all": every non-matching cell, without the baseline's fast path (`chatgold explain`).
    everything: with "baseline", explain the cells the baseline knows afresh too; bare: explain the cells the
    baseline knows without a cause (recording a baseline)."""

    scope: str = "baseline"
    everything: bool = False
    bare: bool = False
    cache: bool = True
    budget: Optional[int] = None
    max_groups: Optional[int] = None
    progress: Optional[Callable[[str], Progress]] = None   # spec -> progress callback
    log: Optional[Callable[[str], None]] = None
    report: Optional[Callable[[object], None]] = None        # called with each runner's explanation
    # Render every known cause's reproducer again (scheduled runs). Otherwise a cause is re-rendered when a cell
    # it covers changed outcome, and its reproducer's outcomes are read from the run's result store, which
    # renders them again when a runner's identity changed.
    reconfirm: bool = False


@dataclass(frozen=True)
class Outputs:
    """The report stage's files (any may be None)."""

    json: Optional[str] = None
    junit: Optional[str] = None
    markdown: Optional[str] = None
    badges: Optional[str] = None
    html: Optional[str] = None

    @classmethod
    def from_args(cls, args) -> "Outputs":
        return cls(*(getattr(args, name, None) for name in ("json", "junit", "markdown", "badges", "html")))

    def any(self) -> bool:
        return any((self.json, self.junit, self.markdown, self.badges, self.html))


@dataclass
class CheckRun:
    """A check over one selection's cells, through any number of runners.

    cells: the selected cells (stage `select` is the caller's Selection or the service's listing); judge: how
    a cell is judged (default: against the local goldens, through `goldens`); store/refresh: the result store
    the render stage reads first; tokens: the token verdict where a runner can tell; explain: the explain
    stage's options (None: off); attribute: the byte provenance of diverged cells (needs local goldens).
    reference: an open reference runner for the explain stage (default: one opened on first use and closed by
    close()); render_slot / explain_lock: what the gate holds around rendering and explaining (threads)."""

    cells: Sequence[Cell]
    judge: Optional[object] = None
    goldens: Optional[GoldenStore] = None
    expectations_dir: Optional[object] = None
    store: Optional[object] = None
    refresh: bool = False
    tokens: bool = True
    explain: Optional[ExplainOptions] = None
    attribute: bool = False
    families: dict = field(default_factory=dict)
    workers: int = 2
    timeout: float = 20.0
    reference: Optional[Callable[[], object]] = None
    render_slot: Optional[object] = None
    explain_lock: Optional[object] = None
    times: Optional[object] = None  # conformance.timings.StageTimes: per-stage wall/CPU for benchmarks
    _reference: object = field(default=None, init=False, repr=False)
    _lock: object = field(default_factory=threading.Lock, init=False, repr=False)
    _judged_sections: Optional[list] = field(default=None, init=False, repr=False)
    _sections_lock: object = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self):
        self.cells = list(self.cells)
        if self.judge is None:
            self.goldens = GoldenStore() if self.goldens is None else self.goldens
            self.judge = GoldenJudge(self.goldens)
        elif self.goldens is None:
            self.goldens = getattr(self.judge, "goldens", None)  # None: judged elsewhere (a service)

    @cached_property
    def requests(self) -> dict:
        """(template id, case id) -> request, for the stages that look cells up (explain, attribution)."""
        return requests_by_cell(self.cells)

    # -- one runner ------------------------------------------------------------------------------------------

    def outcomes(self, runner, progress: Progress = None, refresh: Optional[bool] = None) -> list:
        """Stage render alone: every cell's outcome, in order (the gate's reference). `refresh` overrides the
        run's for this runner."""
        with self.render_slot or nullcontext(), timed(self.times, "render", _who(runner)):
            return render(runner, self.cells, progress, self.store, self.refresh if refresh is None else refresh)

    def check(self, runner, spec: Optional[str] = None, progress: Progress = None,
              explain_only: Optional[set] = None, expectations: Optional[Expectations] = None) -> RunnerResults:
        """render -> judge -> tokens -> explain -> verdict for one open runner."""
        with few_collections():
            results = self._judged(runner, progress, expectations)
            self._explain(results, runner, spec, explain_only)
            apply_expectations(results.results, results.expectations)
        return results

    def _judged(self, runner, progress: Progress, expectations: Optional[Expectations]) -> RunnerResults:
        started = time.perf_counter()
        identity = self._judged_identity(runner)
        if identity is None:
            outcomes = self.outcomes(runner, progress)
        else:
            kept, pending = self._kept_judged(runner, identity)
            outcomes = self._render_pending(runner, pending, progress)
        info = runner_info(runner, time.perf_counter() - started, [cell.request for cell in self.cells])
        name = str(info.get("name", "runner"))
        if expectations is None:  # a command: harness is never held against a baseline the suite ships
            directory = baseline_directory(getattr(runner, "suite_baseline", True), self.expectations_dir)
            expectations = load_expectations(name, directory)
        with timed(self.times, "judge", name):
            if identity is None:
                results = judge_outcomes(info, self.cells, outcomes, self.judge, expectations)
            else:
                results = RunnerResults(info, self._judge_pending(identity, name, kept, pending, outcomes),
                                        expectations)
        if self.tokens and self.goldens is not None:
            with self.render_slot or nullcontext(), timed(self.times, "tokens", name):
                add_token_parity(runner, self.cells, results, self.goldens, self.store, self.refresh)
        return results

    # -- judged results kept in the result store (judge/judged.py) ------------------------------------------

    def _judged_identity(self, runner) -> Optional[tuple]:
        """The runner's store identity when its judged results may be kept: a result store, goldens judged by
        the GoldenJudge (a service's own judge is not), a runner the store caches."""
        if self.store is None or type(self.judge) is not GoldenJudge or self.goldens is None:
            return None
        return self.store.identity_of(runner)

    def _kept_judged(self, runner, identity: tuple) -> tuple:
        """(cell index -> kept CellResult, [(template's cell indices, file key, digest)] still to judge), each
        template's judged file read once; with refresh nothing is read (all is rendered and judged again)."""
        from conformance.judge.judged import decode_section

        kept: dict = {}
        pending: list = []
        with timed(self.times, "judge", _who(runner)):
            for indices, file_key, digest, goldens in self._sections():
                if file_key is None:
                    pending.append((indices, None, None))  # not keyable: judged every time
                    continue
                cells = [self.cells[i] for i in indices]
                template = cells[0].template.id
                data = None if self.refresh else self.store.read_judged(identity[0], file_key)
                restored = None if data is None else decode_section(  # the runner's name is set once known
                    data, digest, "", template, [cell.case.id for cell in cells], goldens)
                if restored is None:
                    pending.append((indices, file_key, digest))
                else:
                    kept.update(zip(indices, restored))
        self.store.count_reused(len(kept))
        return kept, pending

    def _sections(self) -> list:
        """Per template of the selection: (its cell indices, judged file key, digest, goldens), the same for every
        runner, so made once a run; the key is None for cells the store cannot key."""
        with self._sections_lock:  # every runner's thread asks at once: one computes, the others wait for it
            if self._judged_sections is None:
                self._judged_sections = self._make_sections()
            return self._judged_sections

    def _make_sections(self) -> list:
        from conformance.judge.judged import judged_key, section_digest
        from conformance.render.store import request_key

        sections = []
        for indices in _template_runs(self.cells):
            cells = [self.cells[i] for i in indices]
            keys = [request_key(cell.request) for cell in cells]
            if any(key is None for key in keys) or len({key[0] for key in keys}) != 1:
                sections.append((indices, None, None, None))
                continue
            template = cells[0].template.id
            goldens = [self.goldens(template, cell.case.id) for cell in cells]
            sections.append((indices, judged_key(keys[0][0], template),
                             section_digest(keys[0][0], [key[1] for key in keys], goldens), goldens))
        return sections

    def _render_pending(self, runner, pending: list, progress: Progress) -> list:
        """Stage render for the cells without kept judged results."""
        cells = [self.cells[i] for indices, _, _ in pending for i in indices]
        if not cells:
            return []
        with self.render_slot or nullcontext(), timed(self.times, "render", _who(runner)):
            return render(runner, cells, progress, self.store, self.refresh)

    def _judge_pending(self, identity: tuple, name: str, kept: dict, pending: list, outcomes: list) -> list:
        """Every cell's result in order: the kept ones, and the rest judged now (their files written again)."""
        from conformance.judge.judged import encode_section

        for result in kept.values():
            result.runner = name
        indices = [i for group, _, _ in pending for i in group]
        judged = self.judge.judge(name, [(self.cells[i].template.id, self.cells[i].case.id, outcome)
                                         for i, outcome in zip(indices, outcomes)])
        kept.update(zip(indices, judged))
        for group, file_key, digest in pending:
            data = None if file_key is None else encode_section(digest, [kept[i] for i in group])
            if data is not None:
                self.store.write_judged(identity, file_key, data)
        return [kept[i] for i in range(len(self.cells))]

    def _explain(self, results: RunnerResults, runner, spec: Optional[str], only: Optional[set]) -> None:
        options = self.explain
        if options is None or self.goldens is None:
            return
        from conformance.explain.cache import ExplainCache
        from runners import is_builtin

        common = {"cache": ExplainCache() if options.cache else None, "families": self.families,
                  "engine_builtin": bool(spec) and is_builtin(spec), "goldens": self.goldens,
                  "max_groups": options.max_groups,
                  "progress": options.progress(spec or results.name) if options.progress else None}
        if options.budget:
            common["budget"] = options.budget
        with self.explain_lock or nullcontext(), timed(self.times, "explain", spec or results.name):
            reference = self._reference_runner()
            if options.scope == "all":
                from conformance.explain.causes import explain

                explanation = explain(results, runner, reference, self.requests, only=only, log=options.log,
                                      **common)
                explanation.annotate(results.results)
            else:
                from conformance.explain.baseline import explain_with_baseline

                explanation = explain_with_baseline(results, runner, reference, self.requests, only=only,
                                                    everything=options.everything, explain_bare=options.bare,
                                                    store=self.store,
                                                    reconfirm=options.reconfirm or self.refresh, **common)
        results.explanation = explanation
        if options.report is not None:
            options.report(explanation)

    def _reference_runner(self):
        if self.reference is not None:
            return self.reference()
        with self._lock:
            if self._reference is None:
                from runners import REFERENCE_RUNNER, get_runner

                self._reference = get_runner(REFERENCE_RUNNER, workers=self.workers, timeout=self.timeout)
            return self._reference

    # -- several runners -------------------------------------------------------------------------------------

    def check_all(self, specs: Sequence[str], open_runner: Callable[[str], object],
                  progress: Optional[Callable[[str], Progress]] = None,
                  while_open: Optional[Callable[[str, object, RunnerResults], None]] = None,
                  explain_changes: Optional[Callable[[list, int], set]] = None) -> list:
        """check() every runner in turn, each closed when done. `while_open(spec, runner, results)` runs
        before a runner closes (e.g. the capability agreement). `explain_changes(runs, index)`: explain only
        the cells it names for each runner, which may depend on the next runner's results (history: a change
        involves both neighbours), so a runner stays open until the next one is judged."""
        runs: list = []
        waiting = None  # (index, spec, runner) judged, not yet explained (explain_changes)
        try:
            for index, spec in enumerate(specs):
                runner = open_runner(spec)
                if explain_changes is None:
                    try:
                        runs.append(self.check(runner, spec, progress(spec) if progress else None))
                        if while_open is not None:
                            while_open(spec, runner, runs[-1])
                    finally:
                        runner.close()
                    continue
                try:
                    runs.append(self._judged(runner, progress(spec) if progress else None, None))
                except BaseException:
                    runner.close()
                    raise
                previous, waiting = waiting, (index, spec, runner)
                if previous is not None:
                    self._finish_change(runs, previous, explain_changes)
            if waiting is not None:
                last, waiting = waiting, None
                self._finish_change(runs, last, explain_changes)
        finally:
            if waiting is not None:
                waiting[2].close()
        return runs

    def _finish_change(self, runs: list, judged: tuple, explain_changes) -> None:
        index, spec, runner = judged
        try:
            only = explain_changes(runs, index)
            if only:
                self._explain(runs[index], runner, spec, only)
        finally:
            runner.close()
        apply_expectations(runs[index].results, runs[index].expectations)

    # -- after every runner ----------------------------------------------------------------------------------

    def attribute_results(self, results: Sequence) -> None:
        """Stage attribute: where each diverged cell's first differing golden byte came from (cells attributed
        already are left as they are)."""
        if not self.attribute or self.goldens is None or not results:
            return
        from conformance.judge.attribution import attribute_diverged

        attribute_diverged(results, self.requests, self.goldens, None if self.refresh else self.store)

    def report(self, runs: Sequence[RunnerResults], selection, outputs: Outputs = Outputs(),
               agreement: Optional[dict] = None, extra_sections: Optional[dict] = None, analysis: bool = False,
               properties: Optional[dict] = None):
        """Stages attribute and report: the report of every runner's results, and the outputs asked for.
        analysis: add the stored property records (or `properties`, derived this session) and the suite
        audit. Returns (report, paths written)."""
        from conformance.report import build_report, write_outputs

        with timed(self.times, "report:attribute"):
            self.attribute_results([r for run in runs for r in run.results])
        sections = dict(extra_sections or {})
        if analysis:
            with timed(self.times, "report:analysis"):
                sections.update(analysis_sections(selection, properties, self.goldens))
        with timed(self.times, "report:build"):
            report = build_report(runs, selection.describe(), selection.metadata(), agreement,
                                  extra_sections=sections)
        with timed(self.times, "report:write"):
            paths = write_outputs(report, outputs.json, outputs.junit, outputs.markdown, outputs.badges,
                                  outputs.html)
        return report, paths

    def close(self) -> None:
        with self._lock:
            reference, self._reference = self._reference, None
        if reference is not None:
            reference.close()

    def __enter__(self) -> "CheckRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _who(runner) -> str:
    return str(getattr(runner, "name", "runner"))


def analysis_sections(selection, properties: Optional[dict] = None, goldens=None) -> dict:
    """The report's `properties` (the stored records, or those derived this session) and `audit` sections
    (the audit reads goldens through the run's store)."""
    from conformance.analysis.audit import run_audit
    from conformance.analysis.properties import properties_section

    selected = [t.id for t in selection.templates]
    sections = {"properties": properties_section(selected, properties)}
    # Templates chosen by id: the audit's pairs among them only (a check of some templates says nothing of the
    # others). A shard keeps the corpus-wide audit, which `report merge` takes from any one shard.
    only = set(selected) if selection.template_globs else None
    audit = run_audit(selection.corpus.entries, [c.id for c in selection.all_cases], only=only, goldens=goldens)
    if audit["pairs"]:
        sections["audit"] = audit
    return sections


def _template_runs(cells: Sequence[Cell]) -> list:
    """Indices of consecutive cells of one template (a selection's cells come template by template)."""
    runs: list = []
    previous = None
    for index, cell in enumerate(cells):
        if cell.template.id != previous:
            runs.append([])
            previous = cell.template.id
        runs[-1].append(index)
    return runs


def check_cells(runner, cells: Sequence[Cell], judge=None, expectations_dir=None, progress: Progress = None,
                store=None, refresh: bool = False, tokens: bool = True) -> RunnerResults:
    """The stages render -> judge -> tokens -> verdict over some cells with one open runner (no explain)."""
    return CheckRun(cells, judge=judge, expectations_dir=expectations_dir, store=store, refresh=refresh,
                    tokens=tokens).check(runner, progress=progress)
