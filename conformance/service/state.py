"""What the service loads once per process (corpus, cases, the pools, the result store) and the work its
routes do: summaries, judging posted cells (through a CheckRun), attribution in its pool, new goldens in the
reference's pool."""
from __future__ import annotations

import asyncio
import functools
import importlib
import time
from pathlib import Path
from typing import Optional

from fastapi import HTTPException

from conformance.corpus.cases import Case, load_cases
from conformance.corpus.manifest import Corpus, TemplateEntry, load_corpus, sha256_text, templates_dir
from conformance.files import ENCODING_ERRORS
from conformance.checkrun import CheckRun
from conformance.judge.expectations import Expectations
from conformance.judge.goldens import read_golden, read_meta
from conformance.judge.pipeline import Cell
from conformance.render.stage import Posted
from conformance.service.limits import (
    ATTRIBUTION_QUEUE,
    ATTRIBUTION_WORKERS,
    COMPAT_CELL_SECONDS,
    COMPAT_QUEUE,
    COMPAT_TOTAL_SECONDS,
    COMPAT_WORKERS,
    GOLDENS_CELL_SECONDS,
    GOLDENS_QUEUE,
    GOLDENS_TOTAL_SECONDS,
    GOLDENS_WORKERS,
    ID_PATTERN,
    ID_RE,
    WORKER_NICE,
)
from conformance.service.models import CheckRequest, CompatRequest, GoldensRequest
from conformance.service.workers import Busy, WorkPool
from runners.base import Raised, RefusalKind, Rendered


class State:
    """Everything loaded once per server process; the reference runner starts on first use and stays warm."""

    def __init__(self, corpus: Optional[Corpus] = None, cases: Optional[list[Case]] = None):
        self.corpus = corpus or load_corpus()
        self.cases = {c.id: c for c in (cases if cases is not None else load_cases())}
        self.reference = {k: str(v) for k, v in read_meta().items()}
        self.goldens_pool = WorkPool("reference", _reference_runner, GOLDENS_WORKERS, GOLDENS_QUEUE,
                                     retry_after=int(GOLDENS_TOTAL_SECONDS // 4))
        self.attribution_pool = WorkPool("attribution", _attribution_worker, ATTRIBUTION_WORKERS,
                                         ATTRIBUTION_QUEUE, retry_after=5)
        # compat opens its own runners per run (the reference and each engine, out of process)
        self.compat_pool = WorkPool("compat", _NoResource, COMPAT_WORKERS, COMPAT_QUEUE,
                                    retry_after=int(COMPAT_TOTAL_SECONDS // 4))
        # Reference outcomes already rendered for the same transformers, template and case (render/store.py).
        from conformance.render.store import ResultStore

        self.store = ResultStore()
        self.listings: dict = {}  # (id globs, detail) -> GET /v1/templates' encoded body (routes.build_listing)

    def template(self, template_id: str) -> TemplateEntry:
        if not ID_RE.match(template_id):
            raise HTTPException(400, f"invalid template id {template_id!r}: ids match {ID_PATTERN}")
        entry = self.corpus.by_id.get(template_id)
        if entry is None:
            raise HTTPException(404, f"unknown template id {template_id!r} (GET /v1/templates lists them)")
        return entry

    def case(self, case_id: str) -> Case:
        if not ID_RE.match(case_id):
            raise HTTPException(400, f"invalid case id {case_id!r}: ids match {ID_PATTERN}")
        case = self.cases.get(case_id)
        if case is None:
            raise HTTPException(404, f"unknown case id {case_id!r} (GET /v1/cases lists them)")
        return case

    def close(self) -> None:
        self.goldens_pool.close()
        self.attribution_pool.close()
        self.compat_pool.close()


class _NoResource:
    def close(self) -> None:
        pass


def _reference_runner():
    from runners.hf import HFRunner

    return HFRunner(timeout=GOLDENS_CELL_SECONDS, nice=WORKER_NICE)


def _attribution_worker():
    from conformance.judge.attribution import AttributionWorker

    return AttributionWorker(nice=WORKER_NICE)


@functools.lru_cache(maxsize=4)
def _construct_table(root: str) -> dict:
    from conformance.corpus.manifest import load_constructs

    return load_constructs(Path(root))


def _constructs(entry: TemplateEntry, notes: list) -> Optional[list[str]]:
    names = _construct_table(str(entry.root or templates_dir())).get(entry.sha256)
    if names is None:
        notes.append("constructs unavailable: not recorded in templates/constructs.json (run `chatgold corpus build`)")
    return names


def _capabilities(entry: TemplateEntry, notes: list) -> Optional[dict]:
    try:
        module = importlib.import_module("conformance.analysis.capabilities")
        load = getattr(module, "load_capabilities")
    except Exception as exc:
        notes.append(f"capabilities unavailable: conformance.analysis.capabilities.load_capabilities missing ({exc})")
        return None
    try:
        found = load(entry.id)
    except Exception as exc:
        notes.append(f"capabilities unavailable: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    return dict(found) if found else None


def summary_of(entry: TemplateEntry, detail: bool) -> dict:
    notes: list = []
    data = {"id": entry.id, "sha256": entry.sha256, "family": entry.family, "variant": entry.variant,
            "generic": entry.generic, "bos_token": entry.bos_token, "eos_token": entry.eos_token,
            "aliases": entry.aliases(), "constructs": None, "capabilities": None, "notes": notes}
    if detail:
        data["constructs"] = _constructs(entry, notes)
        data["capabilities"] = _capabilities(entry, notes)
    return data


def check_cells(state: State, cells: list, numbered: bool = True) -> list[dict]:
    """Judge posted cells (CheckRequest) through a CheckRun whose render stage's source is what was posted: a
    file read and a byte compare per cell. Attribution is added by the caller, through the attribution pool.
    A cell naming an unknown template or case is an HTTPException naming it (numbered: as cells[i], in a batch)."""
    chosen, posted = [], []
    for index, cell in enumerate(cells):
        try:
            entry, case = state.template(cell.template), state.case(cell.case)
        except HTTPException as exc:
            if not numbered:
                raise
            raise HTTPException(exc.status_code, f"cells[{index}]: {exc.detail}") from None
        # The render stage never renders here: the request only names the cell its posted outcome answers.
        request = case.request("", entry.bos_token, entry.eos_token, template_id=entry.id)
        chosen.append(Cell(entry, case, request))
        posted.append((request, Rendered(cell.output) if cell.output is not None else
                       Raised(cell.raised, RefusalKind(cell.refusal) if cell.refusal else RefusalKind.UNKNOWN)))
    source = Posted(posted)
    run = CheckRun(chosen, tokens=False)
    judged = run.check(source, Posted.name, expectations=Expectations(Posted.name)).results
    return [{"template": r.template_id, "case": r.case_id, "status": str(r.status), "passed": r.passed,
             "golden_kind": r.golden_kind, "divergence": r.divergence.to_dict() if r.divergence else None,
             "reference_message": r.reference_message, "reference_refusal": r.reference_refusal,
             "note": r.note, "attribution": None} for r in judged]


async def attribute(state: State, results: list) -> None:
    """Attribute every diverged result in the attribution pool (one task per template); a full pool leaves them
    {"unavailable": ...} saying so rather than making the caller wait."""
    tasks: dict = {}  # template id -> (entry, cells)
    places = []       # (result, template id, index of its cell in the task)
    for result in results:
        if result["divergence"] is None:
            continue
        entry, case = state.corpus.by_id[result["template"]], state.cases[result["case"]]
        cells = tasks.setdefault(entry.id, (entry, []))[1]
        places.append((result, entry.id, len(cells)))
        cells.append((case.request("", entry.bos_token, entry.eos_token, template_id=entry.id),
                      read_golden(entry.id, case.id), [result["divergence"]["offset"]]))
    if not places:
        return
    jobs: dict = {}
    try:
        for template_id, (entry, cells) in tasks.items():
            jobs[template_id] = state.attribution_pool.submit(
                functools.partial(_run_attribution, (entry.source(), cells)))
    except Busy as exc:
        for future in jobs.values():
            future.cancel()
        for result, _, _ in places:
            result["attribution"] = {"unavailable": f"attribution unavailable: {exc}"}
        return
    answers = {template_id: await asyncio.wrap_future(future) for template_id, future in jobs.items()}
    for result, template_id, index in places:
        result["attribution"] = answers[template_id][index][0]


def _run_attribution(task, worker) -> list:
    return worker.run(task)


def render_goldens(state: State, body: GoldensRequest, cases: list, runner) -> dict:
    data = body.template.encode("utf-8", ENCODING_ERRORS)
    runner.retry_starts()  # a reference that failed to start for an earlier request gets another chance
    deadline = time.monotonic() + GOLDENS_TOTAL_SECONDS
    goldens, complete = [], True
    requests = [case.request(body.template, body.bos_token, body.eos_token, template_id="<posted>")
                for case in cases]
    # The store answers first; only the cells it does not hold cost reference renders (and the deadline).
    identity = state.store.identity_of(runner)
    known = state.store.lookup(identity[0], requests) if identity else [None] * len(requests)
    fresh: list = []
    for case, request, outcome in zip(cases, requests, known):
        if outcome is None:
            if time.monotonic() > deadline:
                complete = False
                goldens.append({"case": case.id, "kind": "not-run",
                                "text": f"overall limit of {GOLDENS_TOTAL_SECONDS:.0f} s reached"})
                continue
            outcome = runner.render(request)
            fresh.append((request, outcome))
        if isinstance(outcome, Rendered):
            goldens.append({"case": case.id, "kind": "rendered", "text": outcome.text})
        elif isinstance(outcome, Raised):
            goldens.append({"case": case.id, "kind": "raised", "text": outcome.message})
        else:
            complete = False
            why = outcome.message
            goldens.append({"case": case.id, "kind": "errored", "text": why})
    if identity and fresh:
        state.store.record(identity, [r for r, _ in fresh], [o for _, o in fresh])
    sha = sha256_text(data)
    match = state.corpus.by_sha.get(sha)
    return {"sha256": sha, "corpus_id": match.id if match else None, "reference": state.reference,
            "complete": complete, "goldens": goldens}


def compat_engines(engines: Optional[list]) -> list:
    """The engines a compat request names: the suite's own runners only (never `command:` or an example
    harness, which would run a program the request chose), the reference left out (it always renders)."""
    from conformance.analysis.compat import DEFAULT_ENGINES
    from runners import BUILTIN_RUNNERS, REFERENCE_RUNNER

    chosen = []
    for spec in engines or DEFAULT_ENGINES:
        if spec.partition("@")[0] not in BUILTIN_RUNNERS:
            raise HTTPException(400, f"engines: unknown engine {spec!r}; known: {', '.join(sorted(BUILTIN_RUNNERS))}")
        if spec != REFERENCE_RUNNER and spec not in chosen:
            chosen.append(spec)
    if not chosen:
        raise HTTPException(400, "engines: no engine besides the reference selected")
    return chosen


def run_compat(state: State, body: CompatRequest, engines: list, cases: list, _resource=None) -> dict:
    """The compat record of a posted template (conformance/schemas/compat.schema.json), as `chatgold compat
    --format json` writes it; no engine starts after COMPAT_TOTAL_SECONDS (those left are listed as not run)."""
    from conformance.analysis.compat import CompatOptions, UserTemplate, compat
    from conformance.checkrun import ExplainOptions

    options = CompatOptions(engines=engines, workers=1, timeout=COMPAT_CELL_SECONDS, store=state.store,
                            deadline=time.monotonic() + COMPAT_TOTAL_SECONDS)
    template = UserTemplate("posted", body.template, body.bos_token, body.eos_token)
    record = compat(template, options, CheckRun, ExplainOptions, cases=cases)
    return {"format": 1, "file": "<posted>", "engines": engines, "templates": [record],
            "renders_right_everywhere": record["renders_right_everywhere"]}
