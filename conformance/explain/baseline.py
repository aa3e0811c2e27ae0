"""Explanations held against a runner's baseline (conformance/judge/expectations.py, format 2).

The fingerprint fast path first: a non-matching cell whose status and fingerprint the baseline already has is
known, with the baseline's cause, and is not explained again. Only the other non-matching cells (new or
changed) are explained (causes.explain, cached); a known cause id makes them expected. Every known cause
that the selection touches is checked by rendering its recorded reproducer again on both sides: one that
still differs is reported with its cells; one that no longer does is news (an unexpected pass: the engine
fixed it, or the baseline is stale), and its cells are listed unexplained with that reason.
"""
from __future__ import annotations

import time
from typing import Optional

from conformance.explain import cluster
from conformance.explain.causes import Cause, Explanation, _symptom_from_dict, explain
from conformance.explain.driver import render_pairs
from conformance.explain.reduce import Found
from conformance.explain.signature import compare
from conformance.judge.expectations import verdict
from conformance.judge.status import NO_ANSWER, NON_MATCHING, Verdict, gain_if_fixed
from runners.base import Conversation, RenderRequest, outcome_from_dict


def _repro_request(repro: dict) -> Optional[RenderRequest]:
    try:
        return RenderRequest(repro["template"], Conversation.from_dict(repro["case"]), repro.get("bos_token"),
                             repro.get("eos_token"))
    except (KeyError, TypeError, ValueError):
        return None


def _recorded_symptom(cause: Cause):
    """The difference the baseline recorded, as today's comparison sees it: worked out again from the recorded
    outcomes of both sides (a symptom stored by an older comparison would make a reproducer that still renders
    exactly as recorded look fixed); the stored symptom only where the outcomes were not recorded."""
    repro = cause.repro or {}
    try:
        recorded = compare(outcome_from_dict(repro["reference"]), outcome_from_dict(repro["engine"]))
    except (KeyError, TypeError, ValueError):
        recorded = None
    return recorded if recorded is not None and recorded.differs else _symptom_from_dict(cause.symptom)


def check_known_causes(known: list, engine, reference, store=None, render_again: Optional[set] = None) -> dict:
    """cause id -> Found (its reproducer still differs as recorded) or a reason (it does not).

    With a result store, a reproducer's outcomes are read from it (under each runner's identity, so a changed
    engine or reference renders it again) except for the causes in `render_again` (None: all), which render
    afresh; every outcome rendered is stored."""
    requests, owners, answers = [], [], {}
    for cause in known:
        request = _repro_request(cause.repro or {})
        if request is None or not cause.symptom:
            answers[cause.id] = "the baseline records no reproducer for it"
            continue
        requests.append(request)
        owners.append(cause)
    if store is None:
        pairs = render_pairs(reference, engine, requests)
    else:
        from conformance.render.store import CachedRunner

        again = [render_again is None or cause.id in render_again for cause in owners]
        pairs: list = [None] * len(requests)
        for flag in (True, False):
            indices = [i for i, a in enumerate(again) if a is flag]
            if indices:
                done = render_pairs(CachedRunner(reference, store, refresh=flag),
                                    CachedRunner(engine, store, refresh=flag), [requests[i] for i in indices])
                for i, pair in zip(indices, done):
                    pairs[i] = pair
    for cause, request, (ref, eng) in zip(owners, requests, pairs):
        target = _recorded_symptom(cause)
        symptom = compare(ref, eng)
        if symptom is not None and symptom.keeps(target):
            answers[cause.id] = Found(request, ref, eng, symptom, 0, True)
        else:
            got = "no answer" if symptom is None else str(symptom.status)
            answers[cause.id] = f"its reproducer no longer differs as recorded (now: {got})"
    return answers


def _as_recorded(result, expectation) -> bool:
    """Whether a cell's outcome is the one its baseline recorded (same status, and same output where both
    have a fingerprint)."""
    if expectation.status != result.status:
        return False
    current = result.fingerprint
    return not (expectation.fingerprint and current and expectation.fingerprint != current)


def explain_with_baseline(run, engine, reference, requests: dict, cache=None, families=None, budget=None,
                          engine_builtin: bool = False, progress=None, everything: bool = False,
                          max_groups=None, explain_bare: bool = False, goldens=None,
                          only: Optional[set] = None, store=None, reconfirm: bool = True) -> Explanation:
    """Explain a run's non-matching cells against its baseline (run.expectations) and give every cell its
    cause (the verdict stage then holds it against the baseline). `everything`: explain every non-matching
    cell afresh (no fast path); `explain_bare`: explain the cells the baseline knows without a cause too
    (recording a baseline); `only`: the cells to look at (default: all). `store` (a result store) with
    `reconfirm` False: a known cause's reproducer is rendered again only when a cell it covers changed (is not
    known as it is) or a runner's identity changed (the store then has no outcome for it); otherwise both sides'
    outcomes come from the store."""
    started = time.perf_counter()
    baseline = run.expectations
    fast: dict = {}     # (template, case) -> known cause id
    known_bare = []     # cells the baseline knows as they are, without a cause
    need: set = set()
    touched: set = set()
    changed: set = set()  # known causes with a cell that is not as the baseline knows it
    for result in run.results:
        if only is not None and result.key not in only:
            continue
        expectation = baseline.get(result.template_id, result.case_id)
        if expectation is not None and expectation.cause:
            touched.add(expectation.cause)
            if not _as_recorded(result, expectation):
                changed.add(expectation.cause)
        if result.status in NO_ANSWER:
            need.add(result.key)  # no cause to know it by: explain() lists it unexplained, with its message
            continue
        if result.status not in NON_MATCHING:
            continue
        # Known as it is (same status and output), without looking at causes: the verdict stage decides.
        known_as_is = verdict(result, expectation) == Verdict.EXPECTED_FAIL
        if everything or not known_as_is or expectation is None:
            need.add(result.key)
        elif explain_bare and expectation.cause not in baseline.causes:
            need.add(result.key)
        elif expectation.cause in baseline.causes:
            fast[result.key] = expectation.cause
        else:
            known_bare.append({"template": result.template_id, "case": result.case_id, "status": str(result.status),
                               "reason": "the baseline knows this cell as it is, without a root cause"})
    # The baseline's causes are tested as mechanisms before a new group is reduced (causes.look_up).
    options = {"cache": cache, "families": families, "engine_builtin": engine_builtin, "progress": progress,
               "max_groups": max_groups, "goldens": goldens, "known_causes": list(baseline.causes.values())}
    if budget:
        options["budget"] = budget
    fresh = explain(run, engine, reference, requests, only=need, **options)
    checked = check_known_causes([baseline.causes[c] for c in sorted(touched) if c in baseline.causes],
                                 engine, reference, store, None if reconfirm else changed)
    figure = run.figure()
    causes: dict = {cause.id: cause for cause in fresh.causes}
    unexplained = list(fresh.unexplained) + known_bare
    stale = []
    by_key = run.by_cell
    for cell, cause_id in sorted(fast.items()):
        answer = checked.get(cause_id)
        result = by_key[cell]
        if not isinstance(answer, Found):
            unexplained.append({"template": cell[0], "case": cell[1], "status": str(result.status),
                                "reason": f"the baseline's cause {cause_id} {answer or 'was not checked'}"})
            continue
        cause = causes.get(cause_id)
        if cause is None:
            known = baseline.causes[cause_id]
            constructs = cluster.constructs_of(answer.template)
            cause = Cause(id=cause_id, key="", title=known.title or cluster.title(answer.symptom, constructs,
                                                                                   answer.reference, answer.engine),
                          constructs=list(known.constructs) or cluster.culprits(constructs),
                          all_constructs=constructs, symptom=answer.symptom, found=answer, confirmed=True,
                          cached=True)
            causes[cause_id] = cause
        cause.cells.append(cell)
        cause.statuses[str(result.status)] = cause.statuses.get(str(result.status), 0) + 1
    for cause_id, answer in checked.items():
        if not isinstance(answer, Found):
            known = baseline.causes[cause_id]
            stale.append({"id": cause_id, "title": known.title, "reason": answer})
    ranked = sorted(causes.values(), key=lambda c: (-len(c.cells), c.id))
    for cause in ranked:
        cause.conformance_if_fixed, cause.gain = gain_if_fixed(figure, len(cause.cells))
        if not cause.title and cause.id in baseline.causes:
            cause.title = baseline.causes[cause.id].title
    for cause in ranked:
        known = baseline.causes.get(cause.id)
        cause.reason = known.reason if known else ""
        cause.link = known.link if known else ""
        cause.known = known is not None
    explanation = Explanation(fresh.runner, fresh.reference, ranked, sorted(unexplained, key=lambda u: (
        u["template"], u["case"])), dict(fresh.stats, fast_path=len(fast), explained=len(need),
                                         known_checked=len(checked), stale=len(stale),
                                         seconds=round(time.perf_counter() - started, 3)), stale)
    explanation.annotate(run.results)  # the verdict stage reads each cell's cause
    lines = {cause.id: (cause.title, _one_line(cause)) for cause in ranked}  # once a cause, not once a cell
    for result in run.results:
        found = lines.get(result.cause)
        if found is not None:
            result.cause_title, result.cause_repro = found
    return explanation


def _one_line(cause: Cause) -> str:
    repro = cause.repro()
    template = repro["template"].replace("\n", "\\n")
    return f"{template[:200]!s}  with {len(repro['case']['messages'])} message(s)"
