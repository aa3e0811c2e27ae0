"""judge -> cause: every non-matching cell of a run explained by a confirmed minimal reproducer, clustered
into root causes and ranked by what fixing each is worth.

    explanation = explain(results, engine_runner, reference_runner, requests)

explain() runs six named stages over typed data, in this order (and nowhere else):

1. plan_groups: each non-matching cell (diverged, engine-raised, engine-rendered, raised-differently) gets
   its symptom (signature.py) from its golden, the engine's outcome and the status the judge stage gave it
   (the cell is not classified again); cells are grouped by (template, first difference) into Groups, each
   with a representative (its smallest conversation). A cell joins a cause only through its own group: it
   was reduced, or its symptom equals the reduced representative's exactly.
2. look_up: groups whose reduction the cache (cache.py) holds are Found without rendering; the others
   become Tasks (a Reduction, or a probe for a group past the per-template limit).
3. reduce_groups: the tasks run, many at once (driver.py), each reduced (reduce.py) to a Found or
   NotReproduced; reductions of one template or family hint each other.
4. cluster_causes, then _merge_by_mechanism: reproducers cluster into Causes (cluster.py), and causes that
   are one mechanism shown through different symptoms are merged, checked by rendering.
5. confirm_causes: each cause's reported reproducer is rendered once more on both sides and must still
   differ as it did (else the next smallest of its candidates is tried; else its cells are unexplained,
   with the reason).
6. rank_causes: causes are ranked by the conformance the engine would reach if that cause alone were fixed.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Optional

from conformance.explain import cluster, formats, isolate, seen
from conformance.explain.cache import ExplainCache, code_identity, runner_identity
from conformance.explain.driver import DriverStats, drive, render_pairs
from conformance.explain.reduce import (
    DEFAULT_BUDGET,
    BudgetSpent,
    Found,
    NotReproduced,
    Reduction,
    _answer,
    conversation_dict,
)
from conformance.explain.signature import Symptom, compare, outcome_record, symptom_for
from conformance.explain.template import lines_of, whitespace_kept
from conformance.judge.goldens import GoldenStore
from conformance.judge.status import NO_ANSWER, NON_MATCHING, Status, gain_if_fixed
from conformance.render.store import CachedRunner
from runners.base import (
    Conversation,
    Raised,
    RefusalKind,
    Rendered,
    RenderRequest,
    outcome_from_dict,
    outcome_to_dict,
)

EXPLAIN_FORMAT = 1
HINTS = 4


def engine_outcome(result):
    """The engine's outcome of a judged cell, as it was (output or refusal)."""
    if result.outcome is not None:
        return result.outcome
    if result.status in (Status.DIVERGED, Status.ENGINE_RENDERED):
        return Rendered(result.output or "")
    kind = result.refusal or "unknown"
    return Raised(result.message, RefusalKind(kind))


@dataclass
class Cause:
    id: str
    key: str
    title: str
    constructs: list          # the culprit constructs (the key's)
    all_constructs: list      # every construct of the reproducer
    symptom: Symptom
    found: Found              # the reported reproducer
    cells: list = field(default_factory=list)      # [(template, case)]
    statuses: dict = field(default_factory=dict)   # status -> cells
    confirmed: bool = False
    gain: float = 0.0
    conformance_if_fixed: Optional[float] = None
    cached: bool = False
    reason: str = ""          # from the baseline, when it knows the cause
    link: str = ""
    known: Optional[bool] = None  # whether the baseline knows it (None: not held against a baseline)
    # The group keys whose reproducers may stand for the cause, smallest first (confirm_causes tries them in
    # order), and the ids of the causes merged into this one (_merge_by_mechanism); neither is reported.
    candidates: list = field(default_factory=list, repr=False)
    merged: list = field(default_factory=list, repr=False)

    @property
    def templates(self) -> int:
        return len({t for t, _ in self.cells})

    def repro(self) -> dict:
        request = self.found.request
        case = request.conversation.to_dict()
        return {"template": request.template, "case": case, "bos_token": request.bos_token,
                "eos_token": request.eos_token, "reference": outcome_record(self.found.reference),
                "engine": outcome_record(self.found.engine), "confirmed": self.confirmed,
                "lines": lines_of(request.template), "messages": len(request.messages),
                **({"owner": list(self.found.owner)} if self.found.owner else {})}

    def to_dict(self) -> dict:
        data = {"id": self.id, "title": self.title, "constructs": self.constructs,
                "all_constructs": self.all_constructs, "symptom": self.symptom.to_dict(),
                "statuses": dict(sorted(self.statuses.items())),
                "cells": [list(c) for c in sorted(self.cells)], "templates": self.templates,
                "repro": self.repro(), "gain": self.gain, "conformance_if_fixed": self.conformance_if_fixed}
        if self.known is not None:
            data["known"] = self.known
        if self.reason:
            data["reason"] = self.reason
        if self.link:
            data["link"] = self.link
        return data


@dataclass
class Explanation:
    runner: dict
    reference: dict
    causes: list
    unexplained: list        # [{"template", "case", "status", "reason"}]
    stats: dict
    # known causes whose reproducer no longer differs: [{"id", "title", "reason"}]
    stale: list = field(default_factory=list)

    def cause_of(self) -> dict:
        """(template, case) -> cause id."""
        return {cell: cause.id for cause in self.causes for cell in cause.cells}

    def annotate(self, results: Iterable) -> None:
        """Record each explained cell's cause id on its result (extra["cause"])."""
        mapping = self.cause_of()
        if not mapping:
            return
        for result in results:
            cause = mapping.get((result.template_id, result.case_id))  # result.key, without a call a cell
            if cause is not None:
                result.cause = cause

    def to_dict(self) -> dict:
        return {"format": EXPLAIN_FORMAT, "runner": self.runner, "reference": self.reference,
                "causes": [c.to_dict() for c in self.causes], "unexplained": self.unexplained,
                "stats": self.stats}


# -- (de)serialising reductions for the cache ---------------------------------------------------------------

def _found_to_dict(found: Found) -> dict:
    request = found.request
    return {"template": request.template, "conversation": request.conversation.to_dict(),
            "bos_token": request.bos_token, "eos_token": request.eos_token,
            "reference": outcome_to_dict(found.reference), "engine": outcome_to_dict(found.engine),
            "symptom": found.symptom.to_dict(), "first": list(found.symptom.first), "renders": found.renders,
            "complete": found.complete, "ignores_template": found.ignores_template, "recognised": found.recognised}


def _symptom_from_dict(data: dict, first=()) -> Symptom:
    status = Status(data["status"])
    if status == Status.DIVERGED:
        return Symptom(status, frozenset(tuple(e) for e in data["edits"]), first=tuple(first or ()))
    return Symptom(status, refusal=data["refusal"])


def _found_from_dict(data: dict, template_id: str, case_id: str) -> Found:
    request = RenderRequest(data["template"], Conversation.from_dict(data["conversation"]), data["bos_token"],
                            data["eos_token"], template_id, case_id)
    return Found(request, outcome_from_dict(data["reference"]), outcome_from_dict(data["engine"]),
                 _symptom_from_dict(data["symptom"], data.get("first")), data["renders"], data["complete"],
                 ignores_template=bool(data.get("ignores_template")), recognised=bool(data.get("recognised")))


# -- the analysis -------------------------------------------------------------------------------------------

def _size(found: Found) -> tuple:
    request = found.request
    return (lines_of(request.template), len(request.messages), len(request.template),
            len(json.dumps(request.conversation.to_dict(), sort_keys=True)))


@dataclass
class Group:
    """The cells of one template that differ from the reference by the same first difference: one reduction
    (of the representative's request) serves them all."""

    key: tuple                 # (template id, the symptom's first_key())
    symptom: Symptom
    cells: list = field(default_factory=list)     # judged results (judge.status.CellResult)
    request: Optional[RenderRequest] = None       # the representative's: the cell with the smallest conversation
    not_reduced: str = ""      # why the group is only probed (past the per-template limit), else ""

    @property
    def template_id(self) -> str:
        return self.key[0]


@dataclass
class Plan:
    """What plan_groups found: the groups to explain, and the cells that cannot be."""

    groups: dict               # group key -> Group, in the order the cells came
    unexplained: list          # [{"template", "case", "status", "reason"}]
    targets: int = 0           # non-matching cells looked at
    no_answer: int = 0         # of which the engine gave no answer (errored, timed out)

    @property
    def probed(self) -> int:
        return sum(1 for group in self.groups.values() if group.not_reduced)


@dataclass
class Task:
    """One group's work for the driver: its Reduction, run in full or (past the per-template limit) only
    probed; `cache_key` is where a reduction's result is kept (None: not kept). `known`: the baseline's causes
    whose mechanism may be this group's (look_up), tested first by rendering (_known_first)."""

    group: Group
    reduction: Reduction
    cache_key: Optional[str] = None
    known: list = field(default_factory=list)
    matched: str = ""          # the known cause whose mechanism the group showed, once tested

    def run(self):
        if self.group.not_reduced:
            return self.reduction.run_unreduced(self.group.not_reduced)
        if self.known:
            return _known_first(self)
        return self.reduction.run()


@dataclass
class LookUp:
    """What look_up found: the groups the cache answered (Found), and the tasks left to run."""

    found: dict                # group key -> Found
    tasks: list                # [(group key, Task)], in the order they are to start
    used_cache: bool = False
    with_known: int = 0        # tasks that test the baseline's known mechanisms before reducing


@dataclass
class Reduced:
    """What reduce_groups gave: each group's Found, the cells it could not explain, and what it spent."""

    found: dict                # group key -> Found (the cache's first, then the reductions')
    unexplained: list
    renders: int = 0           # renders the reductions spent
    incomplete: int = 0        # reductions the budget cut short
    phases: dict = field(default_factory=dict)   # reduction pass -> renders
    known_matched: int = 0     # groups a known cause's mechanism explained (no reduction of their template)


def explain(results, engine, reference, requests: dict, goldens=None, cache: Optional[ExplainCache] = None,
            only: Optional[set] = None, families: Optional[dict] = None, budget: int = DEFAULT_BUDGET,
            parallel: int = 24, engine_builtin: bool = False, max_groups: Optional[int] = None,
            progress: Optional[Callable[[int, int], None]] = None,
            log: Optional[Callable[[str], None]] = None, known_causes: Iterable = ()) -> Explanation:
    """Explain the non-matching cells of one runner's judged results (judge.pipeline.RunnerResults).

    engine / reference: open runners (the reference is `get_runner("hf")`); requests: (template, case) ->
    RenderRequest; goldens: (template, case) -> Golden (default: the local goldens); only: the (template,
    case) cells to explain (default: every non-matching cell); families: template id -> family (reductions
    of one family hint each other); engine_builtin: the engine is a builtin runner whose version identifies
    it (for the cache); max_groups: reduce at most this many (template, symptom) groups per template, those
    with the most cells first (the others' cells are unexplained, with that reason); known_causes: causes a baseline
    already names (judge.expectations.KnownCause), whose mechanisms a group is tested against before it is
    reduced (look_up)."""
    started = time.perf_counter()
    detect = formats.detector_for(results.name)
    if detect is not None:
        # An engine that writes built-in formats picked from the template text: causes by format (formats.py).
        found, unexplained, by_format = formats.explain_by_format(
            results, engine, reference, requests, goldens or GoldenStore(), detect, _reduction_runner(engine, log),
            budget, parallel, only, progress)
        unexplained.sort(key=lambda u: (u["template"], u["case"]))
        return Explanation(dict(results.info), reference.describe(), found, unexplained, by_format)
    plan = plan_groups(results.results, requests, goldens or GoldenStore(), only, max_groups)
    engine_id = runner_identity(dict(results.info), builtin=engine_builtin, code=code_identity(engine))
    reference_info = reference.describe()
    reference_id = runner_identity(reference_info, builtin=True, code=code_identity(reference))
    known = look_up(plan, cache, engine_id, reference_id, budget, families or {}, known_causes)
    if log is not None:
        log(f"{results.name}: {plan.targets} non-matching cells in {len(plan.groups)} (template, symptom) groups: "
            f"{len(known.tasks) - plan.probed} to reduce, {plan.probed} to probe, {len(known.found)} cached")
    stats = DriverStats()
    # Candidates render on the engine's reduction runner when it has one (llama.cpp: its server's chat code in
    # process, not a server start per candidate template); every cause is confirmed on the engine itself.
    reducer = _reduction_runner(engine, log)
    reduced = reduce_groups(plan, known, reference, reducer, stats, cache, families or {}, parallel, progress)
    # The stages up to confirmation render through the cache's outcome store: a re-run answers them from disk.
    outcomes = cache.outcomes() if known.used_cache else None
    kept_reference, kept_reducer = CachedRunner(reference, outcomes), CachedRunner(reducer, outcomes)
    own_differences(reduced.found, kept_reference, kept_reducer, stats)
    constructs = isolate_culprits(reduced.found, kept_reference, kept_reducer, stats)
    causes = cluster_causes(plan, reduced.found, set(known.found), constructs)
    causes = _merge_by_mechanism(causes, reduced.found, kept_reference, kept_reducer, stats)
    confirm_started = time.perf_counter()
    causes, dropped = confirm_causes(causes, plan, reduced.found, reference, engine, stats, constructs)
    unexplained = plan.unexplained + reduced.unexplained + [_unexplained(r, why) for r, why in dropped]
    rank_causes(causes, results.figure())
    unexplained.sort(key=lambda u: (u["template"], u["case"]))
    sizes = [cause.repro() for cause in causes]
    stats_out = {
        "cells": plan.targets,
        "groups": len(plan.groups), "reduced": len(known.tasks) - plan.probed, "probed": plan.probed,
        "cached": len(known.found),
        "renders": stats.renders, "reduction_renders": reduced.renders, "batches": stats.batches,
        "memo_hits": stats.memo_hits,
        "renders_by_pass": dict(sorted(reduced.phases.items(), key=lambda kv: -kv[1])),
        "renders_per_group": round(reduced.renders / len(known.tasks), 1) if known.tasks else None,
        "known_first": {"tested": known.with_known, "matched": reduced.known_matched},
        "budget_spent": reduced.incomplete,
        "causes": len(causes), "confirmed": sum(1 for c in causes if c.confirmed),
        "unexplained": len(unexplained), "no_answer": plan.no_answer,
        "median_lines": statistics.median([s["lines"] for s in sizes]) if sizes else None,
        "median_messages": statistics.median([s["messages"] for s in sizes]) if sizes else None,
        "max_lines": max((s["lines"] for s in sizes), default=None),
        "seconds": round(time.perf_counter() - started, 3),
        "confirm_seconds": round(time.perf_counter() - confirm_started, 3),
        "reference_seconds": round(stats.reference_seconds, 3), "engine_seconds": round(stats.engine_seconds, 3),
        "reducer": getattr(reducer, "name", None),
        "cache": {"used": known.used_cache, "hits": cache.hits if cache else 0,
                  "directory": str(cache.directory) if known.used_cache else None,
                  # renders of the stages between reduction and confirmation: answered from disk or rendered
                  "outcomes": {"stored": outcomes.counters.hits, "rendered": outcomes.counters.rendered}
                  if outcomes is not None else None},
    }
    for name in ("server_starts",):
        value = getattr(engine, name, None)
        if isinstance(value, int):
            stats_out["engine_" + name] = value
    return Explanation(dict(results.info), reference_info, causes, unexplained, stats_out)


# -- the stages, in their order -----------------------------------------------------------------------------

def plan_groups(results: Iterable, requests: dict, goldens, only: Optional[set] = None,
                max_groups: Optional[int] = None) -> Plan:
    """Stage plan: the non-matching cells (of `only`, when given) grouped by (template, first difference),
    each group with its representative; cells with nothing to reduce are unexplained, with the reason.
    A cell's symptom is worked out from the status the judge stage gave it, not by classifying it again."""
    plan = Plan({}, [])
    for result in results:
        if only is not None and result.key not in only:
            continue
        if result.status in NO_ANSWER:
            # A failing cell with nothing to reduce: counted and shown, never left out of the explanation.
            plan.targets += 1
            plan.no_answer += 1
            plan.unexplained.append(_unexplained(result, no_answer_reason(result)))
            continue
        if result.status not in NON_MATCHING:
            continue
        plan.targets += 1
        symptom = symptom_for(result.status, goldens(*result.key), engine_outcome(result))
        if symptom is None or not symptom.differs:
            plan.unexplained.append(_unexplained(result, "no golden to compare with" if symptom is None else
                                                 "the golden and the engine's outcome no longer differ"))
            continue
        # one group per (template, first difference): what a reduction keeps (signature.Symptom.keeps)
        key = (result.template_id, symptom.first_key())
        plan.groups.setdefault(key, Group(key, symptom)).cells.append(result)
    for group in plan.groups.values():
        representative = min(group.cells, key=lambda r: (
            len(json.dumps(conversation_dict(requests[r.key].conversation), sort_keys=True)), r.case_id))
        group.request = requests[representative.key]
    if max_groups:
        per_template: dict = {}
        for group in plan.groups.values():
            per_template.setdefault(group.template_id, []).append((-len(group.cells), group.key[1], group))
        for template_id, ranked in per_template.items():
            for _, _, group in sorted(ranked, key=lambda item: item[:2])[max_groups:]:
                group.not_reduced = (f"not reduced: {template_id} shows more than {max_groups} different "
                                     f"symptoms (the limit of groups reduced per template)")
    return plan


def look_up(plan: Plan, cache: Optional[ExplainCache], engine_id: Optional[str], reference_id: Optional[str],
            budget: int = DEFAULT_BUDGET, families: Optional[dict] = None, known: Iterable = ()) -> LookUp:
    """Stage look up: each group's reduction from the cache (keyed by both runners' identities, the
    representative's request and the symptom), or a Task to run. A task first tests the known causes (the
    baseline's, `known`: judge.expectations.KnownCause) whose mechanism its cells may show (known_mechanisms),
    before any reduction. The tasks go round-robin over templates (a template's first group before any second
    one), families together: a template's later groups and a family's later templates then start with hints
    from finished ones."""
    use_cache = cache is not None and engine_id is not None and reference_id is not None
    found: dict = {}
    tasks: list = []
    mechanisms = None  # parsed on the first group that is not in the cache: a warm run parses none
    with_known = 0
    for key, group in plan.groups.items():
        request = group.request
        cache_key = ExplainCache.key(engine_id, reference_id, request, group.symptom.key()) if use_cache else None
        hit = cache.get(cache_key) if use_cache and not group.not_reduced else None
        if hit is not None:
            found[key] = _found_from_dict(hit, request.template_id, request.case_id)
            continue
        # a probe is not a reduction: nothing worth keeping
        if mechanisms is None and not group.not_reduced:
            mechanisms = known_mechanisms(known)
        candidates = [] if group.not_reduced else mechanisms_for(group, mechanisms)
        with_known += bool(candidates)
        tasks.append((key, Task(group, Reduction(request, group.symptom, budget=budget),
                                None if group.not_reduced else cache_key, candidates)))
    rank: dict = {}
    for key, _ in tasks:
        rank.setdefault(key[0], []).append(key)
    family_of = families or {}
    tasks.sort(key=lambda task: (rank[task[0][0]].index(task[0]), family_of.get(task[0][0], task[0][0]),
                                 task[0][0]))
    return LookUp(found, tasks, use_cache, with_known)


# -- known mechanisms first (part of the look-up stage) -----------------------------------------------------

KNOWN_TRIES = 8   # known causes a group tests, at most (each is one render of its data on that cause's template)


@dataclass
class KnownMechanism:
    """A baseline cause as a mechanism to test a new group against: its reproducer's template and what the
    reproducer's data holds (data_features: the trigger must be in the group's data too)."""

    id: str
    template: str
    status: Status
    refusal: str
    first: tuple
    constructs: frozenset     # the culprit constructs (the group's template must use every one)
    features: frozenset
    names: frozenset          # what the cause is keyed by (stored_keyed_names): the group's template has each
    case: dict                # the reproducer's data (conversation_dict form)


def known_mechanisms(known: Iterable) -> list:
    """The baseline's causes that can be tested as mechanisms: a reproducer that renders (template and case),
    a recorded symptom, and a template that depends on what it is given (an engine that ignores the template
    is found by its own probe). Reproducers are parsed once here, not once per group."""
    out = []
    for cause in known:
        repro = getattr(cause, "repro", None) or {}
        if not isinstance(repro.get("template"), str) or not isinstance(repro.get("case"), dict):
            continue
        try:
            recorded = compare(outcome_from_dict(repro["reference"]), outcome_from_dict(repro["engine"]))
        except (KeyError, TypeError, ValueError):
            continue
        if recorded is None or not recorded.differs:
            continue
        constructs = cluster.constructs_of(repro["template"])
        if "ignores the template" in (getattr(cause, "title", "") or "") or not constructs:
            continue
        out.append(KnownMechanism(cause.id, repro["template"], recorded.status, recorded.refusal, recorded.first,
                                  frozenset(cluster.culprits(constructs)), frozenset(data_features(repro["case"])),
                                  frozenset(stored_keyed_names(repro, constructs, getattr(cause, "constructs", None))),
                                  conversation_dict(Conversation.from_dict(repro["case"]))))
    return out


def mechanisms_for(group: Group, mechanisms: list) -> list:
    """The known mechanisms this group's cells may show, to test by rendering (at most KNOWN_TRIES): the same
    kind of outcome (a refusal the same refusal), every culprit construct in the group's template, and the
    reproducer's trigger in the group's data. Those showing the same first difference come first."""
    if not mechanisms:
        return []
    target = group.symptom
    constructs = set(cluster.constructs_of(group.request.template))
    features = data_features(group.request.conversation.to_dict())
    names = None   # the template's names, parsed once and only when a mechanism gets that far
    fitting = []
    for mechanism in mechanisms:
        if mechanism.status != target.status or not mechanism.constructs <= constructs:
            continue
        if target.status != Status.DIVERGED and mechanism.refusal != target.refusal:
            continue
        if not mechanism.features <= features:
            continue
        if names is None:
            names = template_names(group.request.template)
        # a cause keyed by what it reads (`tools is not none`) is no mechanism of a template that never reads it:
        # its reproducer given this group's data may differ alike, through the group's data alone
        if not mechanism.names <= names:
            continue
        fitting.append((mechanism.first != target.first, len(mechanism.template), mechanism.id, mechanism))
    fitting.sort(key=lambda item: item[:3])
    return [item[3] for item in fitting[:KNOWN_TRIES]]


def _known_first(task: Task):
    """A group's task when known mechanisms may explain it: each mechanism's reproducer template rendered with
    the group's own data, all in one batch; the first that differs exactly as the group does (Symptom.keeps:
    the same first difference, or the same refusal) is the group's mechanism: its own reproducer stands for the
    group when it shows the group's difference too (one render more), else the group's case is reduced on that
    template (already a minimal reproducer) and made 1-minimal. None does: the full reduction runs, reusing
    what these renders found (the reduction's memo)."""
    reduction = task.reduction
    conversation = conversation_dict(reduction.original.conversation)
    reduction.phase = "known"
    requests = [reduction._request(m.template, conversation) for m in task.known]
    try:
        pairs = yield from reduction.render(requests)
    except BudgetSpent:
        pairs = []
    for mechanism, request, pair in zip(task.known, requests, pairs):
        symptom = compare(*pair)
        if symptom is None or not symptom.keeps(reduction.target):
            continue
        task.matched = mechanism.id
        reduction.best = (request, pair, symptom)
        try:
            # The known reproducer itself, when it shows this group's difference: nothing left to reduce.
            if (yield from reduction.test(mechanism.template, mechanism.case)):
                best_request, best_pair, best_symptom = reduction.best
                return Found(best_request, best_pair[0], best_pair[1], best_symptom, reduction.renders, True,
                             dict(reduction.phase_renders))
            yield from reduction.reduce_case(request.template, conversation)
            reduction.phase = "onestep"
            yield from reduction.onestep()
        except BudgetSpent:
            reduction.complete = False
        best_request, best_pair, best_symptom = reduction.best
        return Found(best_request, best_pair[0], best_pair[1], best_symptom, reduction.renders, reduction.complete,
                     dict(reduction.phase_renders))
    return (yield from reduction.run())


def reduce_groups(plan: Plan, known: LookUp, reference, engine, stats: DriverStats,
                  cache: Optional[ExplainCache] = None, families: Optional[dict] = None, parallel: int = 24,
                  progress: Optional[Callable[[int, int], None]] = None) -> Reduced:
    """Stage reduce: every task run to a Found (kept in the cache) or NotReproduced (its cells unexplained),
    many at once through both runners (driver.drive); each reduction starts with hints from finished ones."""
    family_of = families or {}
    finished: list = []   # (template id, family, status, template text) of finished reductions

    def hint(group_key, task: Task) -> None:
        template_id = group_key[0]
        family = family_of.get(template_id)
        status = task.reduction.target.status
        same = [t for tid, fam, st, t in reversed(finished) if tid == template_id and st == status]
        kin = [t for tid, fam, st, t in reversed(finished) if family and fam == family and st == status]
        other = [t for tid, fam, st, t in reversed(finished) if st == status]
        hints, seen = [], set()
        for text in same + kin + other[:HINTS]:
            if text not in seen:
                seen.add(text)
                hints.append(text)
            if len(hints) >= HINTS:
                break
        task.reduction.hints = hints

    done_count = [len(known.found)]
    total = len(plan.groups)
    tasks = dict(known.tasks)

    def on_done(group_key, outcome) -> None:
        done_count[0] += 1
        if progress:
            progress(done_count[0], total)
        if isinstance(outcome, Found):
            if outcome.complete:  # a budget-limited result is no template to settle on
                finished.append((group_key[0], family_of.get(group_key[0]), outcome.symptom.status,
                                 outcome.template))
            cache_key = tasks[group_key].cache_key
            if known.used_cache and cache_key:
                cache.put(cache_key, _found_to_dict(outcome))

    with _scratch_artefacts(engine, idle=parallel):
        outcomes = drive(list(known.tasks), reference, engine, parallel=parallel, on_done=on_done, stats=stats,
                         make=hint, failed=lambda key, exc: NotReproduced(
                             f"the reducer failed ({type(exc).__name__}: {exc}); please report it", 0))
    reduced = Reduced(dict(known.found), [])
    reduced.known_matched = sum(1 for _, task in known.tasks if task.matched)
    for group_key, outcome in outcomes.items():
        if isinstance(outcome, Found):
            reduced.found[group_key] = outcome
            reduced.renders += outcome.renders
            reduced.incomplete += not outcome.complete
            for name, n in outcome.phases.items():
                reduced.phases[name] = reduced.phases.get(name, 0) + n
        else:
            reduced.renders += outcome.renders
            for result in plan.groups[group_key].cells:
                reduced.unexplained.append(_unexplained(result, outcome.reason))
    return reduced


def rank_causes(causes: list, figure: dict) -> None:
    """Stage rank: each cause's gain (the conformance if it alone were fixed); the most cells first."""
    for cause in causes:
        cause.conformance_if_fixed, cause.gain = gain_if_fixed(figure, len(cause.cells))
    causes.sort(key=lambda c: (-len(c.cells), c.id))


def _reduction_runner(engine, log=None):
    """The runner that renders an engine's candidates: its `reduction_runner()` when it offers one (a runner
    that renders as the engine does, tested against it), else the engine."""
    try:
        reducer = engine.reduction_runner()
    except Exception as exc:  # no faster route: reduce on the engine itself, as before
        if log is not None:
            log(f"{getattr(engine, 'name', 'engine')}: reducing on the engine itself ({type(exc).__name__}: {exc})")
        return engine
    return reducer if reducer is not None else engine


@contextlib.contextmanager
def _scratch_artefacts(engine, idle: int = 0):
    """The runner's scratch space (Runner.scratch_space) for rendering candidates, in a temporary folder
    removed afterwards: a reduction renders thousands of templates never seen again."""
    scratch = tempfile.mkdtemp(prefix="chatgold-explain-")
    try:
        with engine.scratch_space(Path(scratch), idle=idle):
            yield
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def no_answer_reason(result) -> str:
    """Why an errored or timed-out cell has no cause: the engine's own message, whole."""
    said = "timed out" if result.status == Status.TIMEOUT else "errored"
    return f"the engine {said}, so there is no difference to explain: {result.message or '(no message)'}"


def _unexplained(result, reason: str) -> dict:
    return {"template": result.template_id, "case": result.case_id, "status": str(result.status), "reason": reason}


def _paths(request: RenderRequest) -> list:
    """What a reproducer's template reads, normalised against its own data (cluster.read_paths)."""
    return cluster.read_paths(request.template, request.conversation.to_dict())


def own_differences(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """Stage own: which data owns each reproducer's difference (find_owners)."""
    find_owners(found, reference, engine, stats)


def find_owners(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """Each reproducer whose data holds a trigger an engine's request layer may handle on its own
    (cluster.ownable: a flag set, an uncommon role, a null) is rendered again without each such trigger
    (cluster.ablate), both sides, in one batch; the triggers whose removal leaves no difference at all own it
    (Found.owner), and it is keyed by them (cluster.cause_key); a field the request has as none is taken out by
    binding it in the template as the reference does (cluster.rebound). A 1-minimal reproducer needs its
    trigger to show its own difference, but another difference may show without it: then the trigger does not
    own it.
    Taking out data the template itself looks at (a role it compares, a null it tests) may also take away what
    the template does with it, so that counts only for a reproducer with no construct of its own (one that only
    prints data) or one whose reference answer stays the same without it (the reference drops a null key
    itself: only the engine's input changed); the trigger is also replaced by what a request layer may make of
    it (cluster.stand_ins: a role as a usual one, a null as ""), the reference alone rendering: the reference
    printing exactly what the engine printed owns the difference too. A refusal is the engine's own, never its
    request layer's."""
    batch, owners, stand_in, stand_in_owners, controls, control_owners = [], [], [], [], [], []
    for key, repro in found.items():
        if repro.ignores_template or repro.symptom.status not in (Status.DIVERGED, Status.ENGINE_RENDERED):
            continue
        case = repro.request.conversation.to_dict()
        bare = not cluster.culprits(cluster.constructs_of(repro.request.template))
        for trigger in cluster.ownable(case):
            ablated = _with_case(repro.request, cluster.ablate(case, trigger))
            if trigger.endswith(cluster.UNBOUND):
                ablated = replace(ablated, template=cluster.rebound(ablated.template, trigger))
                # the same prefix binding a name no template reads: an engine that keys templates by their
                # text (a built-in format for known bytes) answers otherwise, and the rebinding then says nothing
                controls.append(replace(repro.request, template=cluster.rebound(
                    repro.request.template, cluster.CONTROL_NAME + cluster.UNBOUND)))
                control_owners.append((key, trigger))
            batch.append(ablated)
            # rebinding a field changes the template: only the reference answering as before makes it sound
            owners.append((key, trigger, (bare or trigger in cluster.UNSEEN_BY_TEMPLATES)
                           and not trigger.endswith(cluster.UNBOUND)))
            if isinstance(repro.engine, Rendered):
                for variant in cluster.stand_ins(case, trigger):
                    stand_in.append(_with_case(repro.request, variant))
                    stand_in_owners.append((key, trigger))
    owned: dict = {}
    pairs = render_pairs(reference, engine, batch + controls, stats)
    blind = {owner for owner, (ref, eng) in zip(control_owners, pairs[len(batch):])
             if (_answer(ref), _answer(eng)) != (_answer(found[owner[0]].reference), _answer(found[owner[0]].engine))}
    for (key, trigger, sound), pair in zip(owners, pairs[:len(batch)]):
        if (key, trigger) in blind:
            continue
        if _answered(pair) and not _differs(pair) and (sound or _answer(pair[0]) == _answer(found[key].reference)):
            owned.setdefault(key, set()).add(trigger)
    if stand_in:
        for (key, trigger), outcome in zip(stand_in_owners, reference.render_many(stand_in)):
            if isinstance(outcome, Rendered) and outcome.text == found[key].engine.text:
                owned.setdefault(key, set()).add(trigger)
    for key, triggers in owned.items():
        found[key].owner = tuple(sorted(triggers))
    _owned_by_what_is_bound({key: repro for key, repro in found.items() if not repro.owner}, reference, engine,
                            stats)
    _owned_by_what_is_seen({key: repro for key, repro in found.items() if not repro.owner}, reference, engine,
                           stats)


def _owned_by_what_is_bound(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """The reproducers whose difference is a global the engine binds where the request gives none
    (cluster.bound_names): the template reading another name instead, one nobody binds, both sides rendered,
    leaves no difference (each name alone first, then all of them). Keyed by the names alone (cluster.cause_key),
    whatever the template does with them: `if enable_thinking` printing a space and `enable_thinking is defined`
    printing a `<` are one engine binding `enable_thinking`. A control (the template with a name no one reads
    bound first) must answer as the reproducer did: an engine that keys templates by their text answers
    otherwise for any other text, and a rename then says nothing."""
    batch, tried, controls = [], [], []
    for key, repro in found.items():
        if repro.ignores_template or repro.symptom.status not in (Status.DIVERGED, Status.ENGINE_RENDERED):
            continue
        request = repro.request
        names = cluster.bound_names(request.template, request.conversation.to_dict(), request.bos_token,
                                    request.eos_token)
        if not names:
            continue
        for chosen in [[name] for name in names] + ([names] if len(names) > 1 else []):
            batch.append(replace(request, template=cluster.renamed(request.template, chosen)))
            tried.append((key, tuple(chosen)))
        controls.append(replace(request, template=cluster.rebound(request.template,
                                                                  cluster.CONTROL_NAME + cluster.UNBOUND)))
    if not batch:
        return
    keys = list(dict.fromkeys(key for key, _ in tried))
    pairs = render_pairs(reference, engine, batch + controls, stats)
    blind = {key for key, pair in zip(keys, pairs[len(batch):])
             if (_answer(pair[0]), _answer(pair[1])) != (_answer(found[key].reference), _answer(found[key].engine))}
    for (key, chosen), pair in zip(tried, pairs[:len(batch)]):
        if key in blind or found[key].owner or not _answered(pair) or _differs(pair):
            continue
        found[key].owner = tuple(cluster.BINDS + name for name in chosen)


def _owned_by_what_is_seen(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """The reproducers whose data the engine was given otherwise (seen.py: one probe template a reproducer, both
    sides rendering it with the reproducer's data) and whose difference that owns: the case without the paths
    of one change, both sides rendered again, agree. A key the engine dropped must also leave the engine's own
    answer as it was (it never saw the key), so the reference without it prints what the engine printed:
    the rebuilt request, not the template, is the bug, and every template that reads it is one cause. A
    refusal counts here as output does: a template's own `raise_exception()` for a key the engine dropped is
    the drop's."""
    probes, keys = [], []
    for key, repro in found.items():
        if repro.ignores_template:
            continue
        paths = seen.paths_of(repro.request.conversation.to_dict())
        if paths:
            probes.append(replace(repro.request, template=seen.probe_template(paths)))
            keys.append((key, paths))
    if not probes:
        return
    batch, tried, stand_in, stand_in_owners = [], [], [], []
    for (key, paths), (ref, eng) in zip(keys, render_pairs(reference, engine, probes, stats)):
        if not (isinstance(ref, Rendered) and isinstance(eng, Rendered)):
            continue
        by_trigger: dict = {}
        case = found[key].request.conversation.to_dict()
        for trigger, concrete in seen.changes(paths, ref.text, eng.text):
            # a key the request has as null, which the reference drops (R4) and the engine kept: the null's
            # trigger, as find_owners names it, so the engine keeping nulls is one cause whether it renders or
            # refuses
            # an uncommon role given as another: the role's trigger, as find_owners names it
            by_trigger.setdefault(seen.null_kept(case, concrete) or seen.role_rewritten(case, concrete) or trigger,
                                  []).append(concrete)
        for trigger, concretes in by_trigger.items():
            batch.append(_with_case(found[key].request, seen.without(case, concretes)))
            tried.append((key, trigger))
            if trigger.endswith("=list>string") and len(concretes) == 1:
                # an engine that needs the key (mistral.rs refuses a message without content) cannot be shown
                # the case without it: the reference given the parts' text instead, printing what the engine
                # printed, shows the change is the difference
                for variant in seen.joined(case, concretes[0]):
                    stand_in.append(_with_case(found[key].request, variant))
                    stand_in_owners.append((key, trigger))
            if trigger.endswith("=dropped") and concretes == [(concretes[0][0],)]:
                # a top-level field dropped: the reference taking it out binds it as none (R7), the engine left
                # it unbound, so the reference reads it under a name nobody binds instead
                request = found[key].request
                stand_in.append(replace(request, template=cluster.renamed(request.template, [concretes[0][0]])))
                stand_in_owners.append((key, trigger))
    owned: dict = {}
    for (key, trigger), pair in zip(tried, render_pairs(reference, engine, batch, stats)):
        if not _answered(pair) or _differs(pair):
            continue
        if trigger.endswith("=dropped") and _answer(pair[1]) != _answer(found[key].engine):
            continue
        owned.setdefault(key, set()).add(trigger)
    if stand_in:
        for (key, trigger), outcome in zip(stand_in_owners, reference.render_many(stand_in)):
            if _answer(outcome) == _answer(found[key].engine):
                owned.setdefault(key, set()).add(trigger)
    for key, triggers in owned.items():
        # a top-level field the engine dropped is the field left unbound, as where the request has it as none
        # (find_owners' `tools=unbound`): mistral.rs binds `tools` only when the list is not empty
        found[key].owner = tuple(sorted(_as_unbound(trigger) for trigger in triggers))
    _owned_by_key_order({key: repro for key, repro in found.items() if not repro.owner}, reference, engine, stats)
    _owned_by_whitespace_settings({key: repro for key, repro in found.items() if not repro.owner}, reference,
                                  engine, stats)
    _owned_by_added_content({key: repro for key, repro in found.items() if not repro.owner}, reference, engine,
                            stats)
    _owned_by_request_rewrite({key: repro for key, repro in found.items() if not repro.owner}, reference, engine,
                              stats)


def _as_unbound(trigger: str) -> str:
    path, _, change = trigger[len(seen.PREFIX):].rpartition("=")
    return path + cluster.UNBOUND if change == "dropped" and path in seen.TOPS else trigger


def _owned_by_key_order(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """The reproducers whose mappings the engine was given in another key order (seen.order_template: one probe
    a reproducer, both sides) and whose difference that owns: the reference given the case with those mappings
    in the engine's order prints exactly what the engine printed. Nothing can be taken out here (the keys are
    all there), so the reference is shown what the engine was."""
    probes, keys = [], []
    for key, repro in found.items():
        if repro.ignores_template or not isinstance(repro.engine, Rendered):
            continue
        paths = seen.ordered_paths(seen.paths_of(repro.request.conversation.to_dict()))
        if paths:
            probes.append(replace(repro.request, template=seen.order_template(paths)))
            keys.append((key, paths))
    if not probes:
        return
    stand_in, owners = [], []
    for (key, paths), (ref, eng) in zip(keys, render_pairs(reference, engine, probes, stats)):
        if not (isinstance(ref, Rendered) and isinstance(eng, Rendered)):
            continue
        changes = seen.order_changes(paths, ref.text, eng.text)
        if changes:
            case = found[key].request.conversation.to_dict()
            stand_in.append(_with_case(found[key].request, seen.reordered(case, changes)))
            owners.append((key, (seen.ORDER,)))
    if stand_in:
        for (key, triggers), outcome in zip(owners, reference.render_many(stand_in)):
            if _answer(outcome) == _answer(found[key].engine):
                found[key].owner = triggers


# Each setting's probe: plain `{% if %}` tags whose whitespace only that setting removes; the reference prints
# WHITESPACE_TRIMMED, an engine lacking the setting WHITESPACE_KEPT.
WHITESPACE_PROBES = {"trim_blocks": "{% if true %}\nX{% endif %}", "lstrip_blocks": "\n  {% if true %}X{% endif %}"}
WHITESPACE_TRIMMED = {"trim_blocks": "X", "lstrip_blocks": "\nX"}
WHITESPACE_KEPT = {"trim_blocks": "\nX", "lstrip_blocks": "\n  X"}


def _owned_by_whitespace_settings(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """The reproducers whose difference is a block-whitespace setting the engine's environment lacks: the
    template with trim_blocks, lstrip_blocks or both turned off at every tag (template.whitespace_kept), both
    sides rendered, has the reference print what the engine printed on the reproducer and the engine answer as
    before (for the engine the `+` changes nothing: it never trimmed). One setting alone is tried before both.
    Keyed by the setting alone, whatever construct's tag shows it (a `{% macro %}` body's newline and an
    `{% endif %}`'s are one missing trim_blocks). The engine must also show the setting off on a template of
    plain `{% if %}` tags (WHITESPACE_PROBES), or a construct's own stray newline (a macro body's) would pass for
    the environment's."""
    candidates = [(key, repro) for key, repro in found.items()
                  if not repro.ignores_template and isinstance(repro.engine, Rendered)]
    if not candidates:
        return
    # one user message: no request layer rewrites it (TGI cuts the output after a final assistant message)
    case = dict(candidates[0][1].request.conversation.to_dict(), messages=[{"role": "user", "content": ""}])
    request = _with_case(candidates[0][1].request, case)
    probes = render_pairs(reference, engine, [replace(request, template=WHITESPACE_PROBES[setting])
                                              for setting in cluster.WHITESPACE_SETTINGS], stats)
    lacking = tuple(setting for setting, (ref, eng) in zip(cluster.WHITESPACE_SETTINGS, probes)
                    if (_answer(ref), _answer(eng)) == (_answer(Rendered(WHITESPACE_TRIMMED[setting])),
                                                        _answer(Rendered(WHITESPACE_KEPT[setting]))))
    if not lacking:
        return
    settings = [(setting,) for setting in lacking] + ([lacking] if len(lacking) > 1 else [])
    batch, tried = [], []
    for key, repro in candidates:
        for chosen in settings:
            variant = whitespace_kept(repro.request.template, trim="trim_blocks" in chosen,
                                      lstrip="lstrip_blocks" in chosen)
            if variant != repro.request.template:
                batch.append(replace(repro.request, template=variant))
                tried.append((key, chosen))
    if not batch:
        return
    for (key, chosen), (ref, eng) in zip(tried, render_pairs(reference, engine, batch, stats)):
        engine_answer = _answer(found[key].engine)
        if not found[key].owner and _answer(ref) == engine_answer and _answer(eng) == engine_answer:
            found[key].owner = tuple(cluster.ENVIRONMENT + setting for setting in chosen)


def _owned_by_added_content(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """The reproducers with a message that has no `content` which the engine fills in (seen.absent_contents: a
    probe a message, both sides): the difference is the filling when the reference, given the case with the
    engine's string there, answers as the engine did on the reproducer (a refusal counts as the judge counts
    it: the same `raise_exception()` message) and the engine, given the same, answers as before. Keyed by the
    filling alone, whichever of the message's other keys the engine dropped with it."""
    probes, where = [], []
    for key, repro in found.items():
        if repro.ignores_template:
            continue
        for expression, concrete in seen.absent_contents(repro.request.conversation.to_dict()):
            probes.append(replace(repro.request, template=seen.added_template(expression)))
            where.append((key, concrete))
    if not probes:
        return
    added: dict = {}
    for (key, concrete), (ref, eng) in zip(where, render_pairs(reference, engine, probes, stats)):
        if _answer(ref) == _answer(Rendered("u")) and isinstance(eng, Rendered) and eng.text.startswith("s"):
            added.setdefault(key, []).append((concrete, eng.text[1:]))
    if not added:
        return
    keys, stand_ins = [], []
    for key, values in added.items():
        case = found[key].request.conversation.to_dict()
        # the string alone, then as the message's only data besides its role: a request layer of plain text
        # messages that writes the tool calls into `content` drops `tool_calls` too
        for variant in (seen.with_values(case, values), seen.as_text_messages(seen.with_values(case, values),
                                                                              values)):
            keys.append(key)
            stand_ins.append(_with_case(found[key].request, variant))
    for key, (ref, eng) in zip(keys, render_pairs(reference, engine, stand_ins, stats)):
        if _answered((ref, eng)) and not _differs((ref, found[key].engine)) and \
                _answer(eng) == _answer(found[key].engine):
            found[key].owner = (seen.ADDED_CONTENT,)


def _owned_by_request_rewrite(found: dict, reference, engine, stats: Optional[DriverStats] = None) -> None:
    """The reproducers whose conversation the engine rewrote before the template ran, in a way it decides by
    the template (cluster.REWRITES: a system message taken out, string content as a text part), whether the
    template then prints or raises its own refusal. A probe template cannot show it (an engine that decides by
    what the template does keeps the data for a probe that prints it), so each rewrite is tried on the
    reproducer's own template, both sides rendered: the reference given a variant answers as the engine did
    on the reproducer, and the engine given the variant answers as the reference (nothing is left to
    rewrite); so again with the template printing after it what the rewrite changes (the messages' roles,
    their content's kinds: Rewrite.suffix), which the rewrite must explain too. The rewrite's control must be
    explained the same way by the variant in the same place (or, where the control leaves nothing to rewrite,
    both sides agree on it): a template's own semantics (an empty string iterated once, a system check
    skipped) would not. Keyed by the rewrite alone, whatever the template does with the data: one bug, not one
    cause for each template's check. The reference refuses a conversation left empty, so a lone system
    message left out cannot be shown."""
    tried, batch = [], []
    for key, repro in found.items():
        if repro.ignores_template:
            continue
        case = repro.request.conversation.to_dict()
        for trigger, (variants_of, control_of, suffix) in cluster.REWRITES.items():
            variants = variants_of(case)
            if not variants:
                continue
            shaped = replace(repro.request, template=repro.request.template + suffix)
            control = control_of(case)
            controls = variants_of(control)
            if controls and len(controls) != len(variants):
                continue
            tried.append((key, trigger, len(variants), len(controls)))
            batch.append(shaped)
            batch.extend(_with_case(repro.request, v) for v in variants)
            batch.extend(_with_case(shaped, c) for c in [control] + variants + controls)
    if not batch:
        return
    pairs = iter(render_pairs(reference, engine, batch, stats))
    for key, trigger, count, rewritten in tried:
        shaped = next(pairs)
        plain = [next(pairs) for _ in range(count)]
        control = next(pairs)
        variants = [next(pairs) for _ in range(count)]
        # a control with nothing to rewrite: the reference's own answer to it is what the engine must give
        controls = [next(pairs) for _ in range(rewritten)] or [control] * count
        if found[key].owner or not _answered(control) or not _rewrite_can_show(found[key].engine):
            continue
        for before, variant, controlled in zip(plain, variants, controls):
            # across engines answers are compared as the judge compares them (a refusal is the same refusal
            # whichever engine words it); the engine with itself exactly: were the variant what the engine made
            # of the request, it answers both alike to the byte and the word, where an engine that lacks a
            # method refuses a list in other words than a string, and both sides refusing would show nothing
            if _answered(before) and not _differs(before) and not _differs((before[0], found[key].engine)) \
                    and before[1] == found[key].engine \
                    and _answered(variant) and not _differs(variant) and not _differs((variant[0], shaped[1])) \
                    and variant[1] == shaped[1] \
                    and _answered(controlled) and not _differs((controlled[0], control[1])):
                found[key].owner = (trigger,)
                break


def _rewrite_can_show(engine_answer) -> bool:
    """Whether answers can show a rewrite owning this difference: what the engine printed, or a refusal the
    template words itself (raise_exception). An engine's own error (an unknown method, a type error) cannot:
    one engine given a list where the request has a string and another lacking that method for strings both
    refuse, as does the reference given the list, and which of the two the engine did no answer says."""
    return not isinstance(engine_answer, Raised) or engine_answer.refusal == RefusalKind.RAISE


def _with_case(request: RenderRequest, case: dict) -> RenderRequest:
    return replace(request, conversation=Conversation.from_dict(case))


def isolate_culprits(found: dict, reference, engine, stats=None) -> dict:
    """Stage cluster, first part: each reproducer's constructs as its key sees them, narrowed to the culprit a
    reproducer with several shows alone when rendered (isolate.py: the macro, `.get()` or `caller()` that only
    carried the value to a misbehaving `tojson` is no part of the cause). group key -> constructs."""
    out, jobs = {}, {}
    for group_key, repro in found.items():
        constructs = cluster.constructs_of(repro.template)
        out[group_key] = constructs
        # a difference the request's data owns (own_differences) is keyed by that data, not by constructs
        names = [] if repro.owner else isolate.candidates(constructs, repro.ignores_template)
        if names:
            jobs[group_key] = isolate.Job(repro.request, repro.symptom, repro.reference, repro.engine, names)
    if jobs:
        isolate.isolate(list(jobs.values()), reference, engine, stats)
        for group_key, job in jobs.items():
            out[group_key] = isolate.narrowed(out[group_key], job.shown)
    return out


def cluster_causes(plan: Plan, found: dict, cached_groups: set, constructs_of: Optional[dict] = None) -> list:
    """Stage cluster: the reproducers grouped by cause key (cluster.py) into Causes, each reported with its
    smallest reproducer and holding every cell of its groups. `constructs_of`: group key -> the constructs its
    key sees (isolate_culprits; default: all of the reproducer's)."""
    constructs_of = constructs_of or {}
    by_key: dict = {}
    for group_key, repro in found.items():
        constructs = constructs_of.get(group_key) or cluster.constructs_of(repro.template)
        key = cluster.cause_key(repro.symptom, constructs, repro.reference, repro.engine, repro.ignores_template,
                                _paths(repro.request), repro.request.conversation.to_dict(), repro.owner,
                                repro.recognised_as)
        entry = by_key.setdefault(key, {"groups": [], "constructs": constructs})
        entry["groups"].append(group_key)
    causes = []
    for key, entry in by_key.items():
        candidates = sorted(entry["groups"], key=lambda g: (_size(found[g]), g))
        best = found[candidates[0]]
        constructs = constructs_of.get(candidates[0]) or cluster.constructs_of(best.template)
        cause = Cause(id=cluster.cause_id(key), key=key,
                      title=cluster.title(best.symptom, constructs, best.reference, best.engine,
                                          best.ignores_template, _paths(best.request),
                                          best.request.conversation.to_dict(), best.owner, best.recognised_as),
                      constructs=[] if best.owner else cluster.culprits(constructs),
                      all_constructs=cluster.constructs_of(best.template),
                      symptom=best.symptom,
                      found=best, cached=all(g in cached_groups for g in entry["groups"]), candidates=candidates)
        for group_key in entry["groups"]:
            for result in plan.groups[group_key].cells:
                cause.cells.append(result.key)
                cause.statuses[str(result.status)] = cause.statuses.get(str(result.status), 0) + 1
        causes.append(cause)
    return causes


def confirm_causes(causes: list, plan: Plan, found: dict, reference, engine, stats,
                   constructs_of: Optional[dict] = None) -> tuple:
    """Stage confirm: render every cause's reproducer again on both sides; keep the causes whose reproducer
    still differs as it did (trying a cause's next smallest reproducer when one does not). Returns (the causes
    kept, [(result, why it is unexplained)] for the cells of the others). `constructs_of`: as cluster_causes."""
    with _scratch_artefacts(engine):
        return _confirm(causes, plan, found, reference, engine, stats, constructs_of or {})


def _confirm(causes: list, plan: Plan, found: dict, reference, engine, stats,
             constructs_of: Optional[dict] = None) -> tuple:
    constructs_of = constructs_of or {}
    pending = {cause.id: 0 for cause in causes}
    by_id = {cause.id: cause for cause in causes}
    confirmed: set = set()
    while pending:
        batch, owners = [], []
        for cause_id, index in pending.items():
            cause = by_id[cause_id]
            repro = found[cause.candidates[index]]
            batch.append(repro.request)
            owners.append((cause_id, repro))
        pairs = render_pairs(reference, engine, batch, stats)
        still: dict = {}
        for (cause_id, repro), (ref, eng) in zip(owners, pairs):
            cause = by_id[cause_id]
            group_key = cause.candidates[pending[cause_id]]
            symptom = compare(ref, eng)
            if symptom is not None and symptom.keeps(repro.symptom):
                cause.found = Found(repro.request, ref, eng, symptom, repro.renders, repro.complete,
                                    ignores_template=repro.ignores_template, owner=repro.owner,
                                    recognised=repro.recognised)
                cause.confirmed = True
                constructs = constructs_of.get(group_key) or cluster.constructs_of(repro.request.template)
                cause.title = cluster.title(symptom, constructs, ref, eng, repro.ignores_template,
                                            _paths(repro.request), repro.request.conversation.to_dict(),
                                            repro.owner, repro.recognised_as)
                confirmed.add(cause_id)
            elif pending[cause_id] + 1 < min(len(cause.candidates), 3):
                still[cause_id] = pending[cause_id] + 1
        pending = still
    kept, dropped = [], []
    for cause in causes:
        if cause.id in confirmed:
            kept.append(cause)
            continue
        for group_key in cause.candidates:
            for result in plan.groups[group_key].cells:
                dropped.append((result, "its reproducer did not differ in the same way when rendered again "
                                        "(is the engine deterministic?)"))
    return kept, dropped


# -- one mechanism, several symptoms ------------------------------------------------------------------------

def data_features(case: dict) -> set:
    """What a reproducer's data holds, names and paths normalised: (field, key path without indices, value
    class). A null, a boolean or a role is its value; anything else its type. Text in messages is no feature
    (every case has some), nor are the roles every case has (user, assistant, system, or one cut to nothing):
    a case of such messages alone holds no trigger."""
    out: set = set()

    def walk(value, top: str, path: tuple) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, top, path + (key,))
        elif isinstance(value, list):
            for item in value:
                walk(item, top, path)
        elif value is None or isinstance(value, bool):
            out.add((top, path, value))
        elif path[-1:] == ("role",):
            if value not in seen.USUAL_ROLES:
                out.add((top, path, value))
        elif not (top == "messages" and isinstance(value, str)):
            out.add((top, path, type(value).__name__))

    for name in ("messages", "tools", "documents", "kwargs"):
        if case.get(name):
            walk(case[name], name, ())
    for flag in ("add_generation_prompt", "continue_final_message"):
        if case.get(flag):
            out.add((flag, (), True))
    return out


def _same_mechanism(cause, pair) -> bool:
    """Whether `pair`, the cause's own template rendered with another cause's data, shows the cause's mechanism:
    the same refusal, or different bytes of the same kind (cluster.difference_class: which text the other data
    makes it print is that data's)."""
    symptom = compare(*pair)
    if symptom is None or not symptom.differs or symptom.status != cause.found.symptom.status:
        return False
    if symptom.status != Status.DIVERGED:
        return symptom.keeps(cause.found.symptom)
    mine = cluster.difference_class(cause.found.reference.text, cause.found.engine.text)
    return cluster.difference_class(pair[0].text, pair[1].text) == mine


def _explains(mine, pair, triggered: set) -> bool:
    """Whether `pair`, `mine`'s template given another cause's data, shows `mine`'s mechanism set off by that
    data: `mine` is in `triggered` (given no data, its template does not differ so). A template that differs
    whatever the data (a compile error, a token bound as none) shows its difference with any data, which says
    nothing of the other cause's cells: it would otherwise take every cause whose data shares an incidental
    feature with its own (add_generation_prompt)."""
    return mine.id in triggered and _same_mechanism(mine, pair)


def keyed_names(cause) -> set:
    """What a cause is keyed and titled by: its culprit constructs, the names in the data paths it reads when it
    has none (cluster.reads_key: `messages[].thinking` -> messages, thinking), and the names it reads that its
    request does not give (cluster.unbound_globals: `enable_thinking`)."""
    names = set(cause.constructs)
    for part in cause.key.partition("#")[0].split(","):
        for prefix in ("reads:", "binds:"):
            if part.startswith(prefix):
                names |= path_names(part[len(prefix):])
    return names


def stored_keyed_names(repro: dict, constructs: Optional[list] = None, culprits: Optional[list] = None) -> set:
    """keyed_names of a stored cause, recomputed from its reproducer (cluster.cause_key): its culprit
    constructs, the names of the paths it is keyed as reading, the names it is keyed as binding. `culprits`,
    the stored cause's own constructs when it has them, stand for the reproducer's: they are the one a
    rendering showed alone (isolate.py), which a recomputed key cannot know."""
    if repro.get("owner"):
        return set()   # keyed by the data that owns its difference, whatever the template uses
    if culprits:
        names = stored_keyed_names(repro, constructs)
        keyed = {name for name in names if ":" in name}
        # only where the stored ones narrow the recomputed key's (a key by a bound name keeps no test at all)
        return names - keyed | set(culprits) if set(culprits) < keyed else names
    constructs = cluster.constructs_of(repro["template"]) if constructs is None else constructs
    reference, engine = outcome_from_dict(repro["reference"]), outcome_from_dict(repro["engine"])
    symptom = compare(reference, engine)
    if symptom is None:
        return set(cluster.culprits(constructs))
    case = Conversation.from_dict(repro["case"]).to_dict()
    key = cluster.cause_key(symptom, constructs, reference, engine, False,
                            cluster.read_paths(repro["template"], case), case)
    names: set = set()
    for part in key.partition("#")[0].split(","):
        if part.startswith(("reads:", "binds:")):
            names |= path_names(part.split(":", 1)[1])
        elif part:
            names.add(part)
    return names


def path_names(path: str) -> set:
    return {part.replace("[]", "") for part in path.split(".")} - {"*", ""}


def template_names(template: str) -> set:
    """Every construct a template uses and every name in the paths it reads (un-normalised)."""
    names = set(cluster.constructs_of(template))
    for path in cluster.read_paths(template, maybe_data=True):
        names |= path_names(path)
    return names


def _named_truly(members: list, constructs: dict):
    """The cause these merged causes would be reported as, if one can be named truly for every member's cells:
    the smallest reproducer among the members keyed by names (keyed_names) that every member's template uses
    (`|tojson` is no cause of a template without tojson; `message.thinking` printing nothing names the
    `is defined` test of `message.thinking` too, not the reverse). None when no member can."""
    fits = [c for c in members if all(keyed_names(c) <= constructs[m.id] for m in members)]
    return min(fits, key=lambda c: (_size(c.found), c.id)) if fits else None


def _no_data(request: RenderRequest) -> RenderRequest:
    """The request's template with data that holds no trigger (data_features): one user message of one letter,
    no tools, documents or kwargs. The flags stay as they were: an engine may render only one setting of them
    (TGI always adds the generation prompt) and skip the others."""
    conversation = request.conversation
    return RenderRequest(request.template, Conversation(
        messages=[{"role": "user", "content": "H"}], add_generation_prompt=conversation.add_generation_prompt,
        continue_final_message=conversation.continue_final_message, now=conversation.now),
        request.bos_token, request.eos_token, request.template_id, request.case_id)


def _differs(pair) -> bool:
    symptom = compare(*pair)
    return symptom is None or symptom.differs


def _answered(pair) -> bool:
    return all(outcome.kind in ("rendered", "raised") for outcome in pair)


def _merge_by_mechanism(causes: list, found: dict, reference, engine, stats) -> list:
    """Causes that are one mechanism shown through different symptoms, merged, checked by rendering: two causes
    whose reproducers' data share a trigger (data_features) are one when one's template, given the other's
    data, still shows its own kind of difference, its difference needs data to show (its template given no
    data does not differ so, _explains), and the merged cause's name is true of all (_named_truly). A template
    that differs whatever the data (a missing trim_blocks, a compile error) has no trigger and is never merged
    this way: its key alone identifies it."""
    features = {cause.id: data_features(cause.found.request.conversation.to_dict()) for cause in causes}
    pairs = [(a, b) for i, a in enumerate(causes) for b in causes[i + 1:]
             if features[a.id] & features[b.id] and not a.found.ignores_template and not b.found.ignores_template]
    if not pairs:
        return causes
    batch = []
    for a, b in pairs:
        for mine, theirs in ((a, b), (b, a)):
            request = mine.found.request
            batch.append(RenderRequest(request.template, theirs.found.request.conversation, request.bos_token,
                                       request.eos_token, request.template_id, request.case_id))
    involved = list({cause.id: cause for pair in pairs for cause in pair}.values())
    batch.extend(_no_data(cause.found.request) for cause in involved)
    outcomes = render_pairs(reference, engine, batch, stats)
    plain = outcomes[2 * len(pairs):]
    # Needs data to differ: given none, both sides answer alike (an engine that skips, errors or differs in any
    # way on that request says nothing: SGLang's gateway refuses an empty message, which once made a `bos_token`
    # cause look set off by data and take 26,128 cells of other causes).
    triggered = {cause.id for cause, pair in zip(involved, plain) if _answered(pair) and not _differs(pair)}
    parent = {cause.id: cause.id for cause in causes}

    def root(cause_id: str) -> str:
        while parent[cause_id] != cause_id:
            cause_id = parent[cause_id]
        return cause_id

    constructs = {cause.id: template_names(cause.found.request.template) for cause in causes}
    component = {cause.id: [cause] for cause in causes}   # root -> the causes merged into it so far
    for index, (a, b) in enumerate(pairs):
        if not (_explains(a, outcomes[2 * index], triggered) or _explains(b, outcomes[2 * index + 1], triggered)):
            continue
        ra, rb = root(a.id), root(b.id)
        if ra != rb and _named_truly(component[ra] + component[rb], constructs) is not None:
            parent[rb] = ra
            component[ra] += component.pop(rb)
    merged: dict = {}
    for cause in causes:
        merged.setdefault(root(cause.id), []).append(cause)
    out = []
    for members in merged.values():
        if len(members) == 1:
            out.append(members[0])
            continue
        head = _named_truly(members, constructs)
        members = [head] + sorted((c for c in members if c is not head), key=lambda c: (_size(c.found), c.id))
        for other in members[1:]:
            head.cells.extend(other.cells)
            for status, count in other.statuses.items():
                head.statuses[status] = head.statuses.get(status, 0) + count
            head.candidates = head.candidates + other.candidates
            head.cached = head.cached and other.cached
        head.merged = [c.id for c in members[1:]]
        out.append(head)
    return out
