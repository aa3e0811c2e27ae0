"""Causes of an engine that renders built-in formats instead of the template (llama.cpp without Jinja).

llama.cpp's built-in route (`llama_chat_apply_template`) never evaluates a template: it picks one of its
hard-coded formats by substrings of the template text (runners/llamacpp/builtin.py ports the rules) and writes
that format. A cell's cause is therefore the format detected and the rule that picked it, with how the cell
differs: one cause per (format, rule, symptom), where the symptom is the engine's refusal (a template no rule
knows, tools without Jinja, a construct llama-server will not load at start-up) or the kind of difference (the
format's prompt differs from the template's; the format renders where the template refuses). Its reproducer is
the template cut, by the detection port alone, to the text that picks the same format by the same rule
(cut_template), with the conversation reduced (reduce.Reduction without template passes) on the engine's
reduction runner. Where that cut no longer differs so (the difference needs the template's own answer: its
refusal, or a construct the server will not load), the whole template is reduced as Jinja instead, every
candidate held to the same format by the same rule (FormatReduction: both sides rendered, so the reference's
answer and the engine's are both kept). Either is rendered again on the engine itself and kept only if it still
differs as it did.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from typing import Callable, Optional

from conformance.explain.driver import DriverStats, drive, render_pairs
from conformance.explain.reduce import DEFAULT_BUDGET, BudgetSpent, Found, Reduction, conversation_dict
from conformance.explain.signature import Symptom, compare, symptom_for
from conformance.judge.status import NO_ANSWER, NON_MATCHING, Status, gain_if_fixed

# A format cause's reproducer: the smallest cells of its group, tried in order until one is confirmed.
TRIES = 3


def _llamacpp_detect(template: str) -> tuple:
    from runners.llamacpp.builtin import detect

    found = detect(template)
    return found.name, found.rule


# Engines whose outcome is decided by a built-in format picked from the template text: runner name -> the
# port of their detection (template -> (format or None, rule)).
DETECTORS: dict = {"llamacpp-builtin": _llamacpp_detect}


def detector_for(runner_name: str) -> Optional[Callable]:
    return DETECTORS.get((runner_name or "").split("@")[0])


def _ddmin(items: list, keeps: Callable) -> list:
    """The smallest sublist (order kept) that `keeps` holds for, by removing ever smaller chunks (delta
    debugging's complement steps); 1-minimal: no single item can go."""
    chunk = max(1, len(items) // 2)
    while items:
        start, removed = 0, False
        while start < len(items):
            candidate = items[:start] + items[start + chunk:]
            if candidate and keeps(candidate):
                items, removed = candidate, True
            else:
                start += chunk
        if chunk == 1 and not removed:
            break
        chunk = max(1, chunk // 2) if not removed else chunk
    return items


def cut_template(template: str, detect: Callable) -> str:
    """The smallest text that `detect` gives the same (format, rule) as `template`: its lines first, then its
    characters. Pure string work on the detection port: the engine only confirms the result."""
    target = detect(template)

    def same(text: str) -> bool:
        return detect(text) == target

    lines = _ddmin(template.splitlines(keepends=True), lambda kept: same("".join(kept)))
    return "".join(_ddmin(list("".join(lines)), lambda kept: same("".join(kept))))


# The pair a candidate that picks another format (or the same by another rule) stands for, never rendered: both
# sides alike, so it keeps no difference.
_OTHER_FORMAT = "the candidate picks another built-in format"


class FormatReduction(Reduction):
    """Reduce a format cause's template as Jinja (the reducer's template passes and single steps, both sides
    rendered) while every candidate picks the same format by the same rule: a cause whose difference needs the
    template's own answer (its refusal, or a construct llama-server will not load) keeps that answer, and the
    format stays the one that renders or refuses. Candidates that pick another format are never rendered."""

    def __init__(self, request, target: Symptom, detect: Callable, **kwargs):
        super().__init__(request, target, **kwargs)
        self.detect = detect
        self.picked = detect(request.template)
        self.other_format = 0   # candidates turned away by detection alone, unrendered

    def render(self, requests: list):
        from runners.base import Raised

        for request in requests:
            key = self._key(request)
            if key not in self.memo and self.detect(request.template) != self.picked:
                self.memo[key] = (Raised(_OTHER_FORMAT), Raised(_OTHER_FORMAT))
                self.other_format += 1
        return (yield from super().render(requests))

    def run(self):
        found = yield from super().run()
        if not isinstance(found, Found) or not found.complete:
            return found
        # The template passes keep a node's text whole (a `{% raw %}` block's lines): its lines go last, then
        # the single steps again, so the result stays 1-minimal.
        request = self.best[0]
        lines = request.template.splitlines(keepends=True)
        if len(lines) > 1:
            conversation = conversation_dict(request.conversation)
            try:
                self.phase = "lines"
                yield from self.ddmin(lines, lambda kept: ("".join(kept), conversation))
                if self.best[0].template != request.template:
                    self.phase = "onestep"
                    yield from self.onestep()
            except BudgetSpent:
                self.complete = False
        return self.found(found.ignores_template)


def symptom_kind(symptom: Symptom) -> str:
    """What of a symptom names a format cause: a refusal by its text (the engine's own: 'not supported',
    'tools param requires --jinja'); otherwise the status (what the format prints differs per template)."""
    if symptom.status in (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY):
        return f"{symptom.status}|{symptom.refusal}"
    return str(symptom.status)


def cause_id(runner: str, name: Optional[str], rule: str, kind: str) -> str:
    text = json.dumps([runner, name, rule, kind], ensure_ascii=False)
    return "c-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


def title_of(name: Optional[str], rule: str, symptom: Symptom, engine_message: str = "") -> str:
    picked = f"built-in format `{name}` ({rule})" if name else f"no built-in format ({rule})"
    if symptom.status in (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY):
        return f"{picked}: the engine refuses ({(engine_message or symptom.refusal).splitlines()[0][:80]})"
    if symptom.status == Status.ENGINE_RENDERED:
        return f"{picked}: the format renders where the template refuses"
    return f"{picked}: the format's hard-coded prompt differs from the template's"


def _size(result, requests: dict) -> tuple:
    request = requests[result.key]
    return (len(json.dumps(conversation_dict(request.conversation), sort_keys=True)), len(request.template),
            result.key)


def explain_by_format(results, engine, reference, requests: dict, goldens, detect: Callable,
                      reducer=None, budget: int = DEFAULT_BUDGET, parallel: int = 24, only: Optional[set] = None,
                      progress=None) -> tuple:
    """(causes, unexplained, stats) for the non-matching cells (of `only`) of an engine that writes built-in
    formats: causes.Cause objects keyed by (format, rule, symptom kind), each confirmed on `engine`."""
    from conformance.explain.causes import (
        Cause,
        _scratch_artefacts,
        _unexplained,
        engine_outcome,
        no_answer_reason,
    )

    started = time.perf_counter()
    runner = results.name
    formats: dict = {}     # template text -> (name, rule)
    groups: dict = {}      # cause id -> {"name", "rule", "kind", "cells": [(result, symptom)]}
    unexplained: list = []
    targets = no_answer = 0
    for result in results.results:
        if only is not None and result.key not in only:
            continue
        if result.status in NO_ANSWER:
            targets += 1
            no_answer += 1
            unexplained.append(_unexplained(result, no_answer_reason(result)))
            continue
        if result.status not in NON_MATCHING:
            continue
        targets += 1
        symptom = symptom_for(result.status, goldens(*result.key), engine_outcome(result))
        if symptom is None or not symptom.differs:
            unexplained.append(_unexplained(result, "no golden to compare with" if symptom is None else
                                            "the golden and the engine's outcome no longer differ"))
            continue
        template = requests[result.key].template
        if template not in formats:
            formats[template] = detect(template)
        name, rule = formats[template]
        kind = symptom_kind(symptom)
        entry = groups.setdefault(cause_id(runner, name, rule, kind),
                                  {"name": name, "rule": rule, "kind": kind, "cells": []})
        entry["cells"].append((result, symptom))
    stats = DriverStats()
    # Each group's smallest cell, its template cut to the text that picks the same format, rendered once on the
    # reduction runner: where it still differs in the group's kind its conversation is reduced on the cut
    # template, else on the whole one.
    starts: dict = {}
    for key, entry in groups.items():
        entry["cells"].sort(key=lambda pair: _size(pair[0], requests))
        result, symptom = entry["cells"][0]
        starts[key] = (requests[result.key], symptom)
    cut_starts = {key: replace(request, template=cut_template(request.template, detect))
                  for key, (request, _) in starts.items()}
    cut_starts = {key: request for key, request in cut_starts.items() if request.template != starts[key][0].template}
    done = [0]

    def on_done(key, outcome) -> None:
        done[0] += 1
        if progress:
            progress(done[0], len(starts))

    cut_kept: set = set()
    with _scratch_artefacts(reducer or engine, idle=parallel):
        order = list(cut_starts)
        for key, (ref, eng) in zip(order, render_pairs(reference, reducer or engine,
                                                       [cut_starts[key] for key in order], stats)):
            symptom = compare(ref, eng)
            if symptom is not None and symptom.differs and symptom_kind(symptom) == groups[key]["kind"]:
                starts[key] = (cut_starts[key], symptom)
                cut_kept.add(key)
        # Where the cut does not differ so (the template's own refusal, or a construct the server will not
        # load, is part of the difference), the whole template is reduced as Jinja, keeping the format.
        tasks = [(key, Reduction(request, symptom, budget=budget, reduce_template=False) if key in cut_kept else
                  FormatReduction(request, symptom, detect, budget=budget))
                 for key, (request, symptom) in starts.items()]
        reduced = drive(tasks, reference, reducer or engine, parallel=parallel, on_done=on_done, stats=stats,
                        failed=lambda key, exc: None)
    reduction_renders = sum(getattr(o, "renders", 0) for o in reduced.values() if o is not None)
    # Confirm on the engine itself: the reduced reproducer (on the cut template, or the template reduced with
    # its format kept), else the group's smallest cells as they are (each cut first).
    candidates = {}
    cuts: dict = {}
    for key, entry in groups.items():
        whole = [requests[r.key] for r, _ in entry["cells"][:TRIES]]
        outcome = reduced.get(key)
        listed = []
        if isinstance(outcome, Found):
            if key in cut_kept:
                whole.insert(0, outcome.request)
            else:
                listed.append(outcome.request)
        for request in whole:
            if request.template not in cuts:
                cuts[request.template] = cut_template(request.template, detect)
            if cuts[request.template] != request.template:
                listed.append(replace(request, template=cuts[request.template]))
            listed.append(request)
        candidates[key] = listed
    confirmed: dict = {}
    with _scratch_artefacts(engine):
        _confirm(candidates, groups, confirmed, reference, engine, stats)
    causes = []
    for key, entry in groups.items():
        found = confirmed.get(key)
        if found is None:
            for result, _ in entry["cells"]:
                unexplained.append(_unexplained(result, "its reproducer did not differ in the same way when "
                                                        "rendered again (is the engine deterministic?)"))
            continue
        cause = Cause(id=key, key=f"{entry['name']}#{entry['rule']}#{entry['kind']}",
                      title=title_of(entry["name"], entry["rule"], found.symptom,
                                     getattr(found.engine, "message", "")),
                      constructs=[], all_constructs=[], symptom=found.symptom, found=found, confirmed=True)
        for result, _ in entry["cells"]:
            cause.cells.append(result.key)
            cause.statuses[str(result.status)] = cause.statuses.get(str(result.status), 0) + 1
        causes.append(cause)
    figure = results.figure()
    for cause in causes:
        cause.conformance_if_fixed, cause.gain = gain_if_fixed(figure, len(cause.cells))
    causes.sort(key=lambda c: (-len(c.cells), c.id))
    out = {"cells": targets, "groups": len(groups), "reduced": len(tasks), "probed": 0, "cached": 0,
           "renders": stats.renders, "reduction_renders": reduction_renders, "batches": stats.batches,
           "memo_hits": stats.memo_hits,
           "causes": len(causes), "confirmed": len(causes), "unexplained": len(unexplained),
           "no_answer": no_answer, "by_format": True, "seconds": round(time.perf_counter() - started, 3)}
    return causes, unexplained, out


def _confirm(candidates: dict, groups: dict, confirmed: dict, reference, engine, stats) -> None:
    """Render each group's candidates on both sides, in order, until one differs as the group's cells do."""
    pending = {key: 0 for key in groups}
    while pending:
        order = list(pending)
        pairs = render_pairs(reference, engine, [candidates[key][pending[key]] for key in order], stats)
        still = {}
        for key, (ref, eng) in zip(order, pairs):
            symptom = compare(ref, eng)
            if symptom is not None and symptom.differs and symptom_kind(symptom) == groups[key]["kind"]:
                confirmed[key] = Found(candidates[key][pending[key]], ref, eng, symptom, 0, True)
            elif pending[key] + 1 < len(candidates[key]):
                still[key] = pending[key] + 1
        pending = still


def finish_format_cause(runner: str, cause, detect: Callable, reference, reducer, engine,
                        budget: int = DEFAULT_BUDGET) -> tuple:
    """A stored format cause's reproducer reduced again by FormatReduction (on `reducer`, the engine's reduction
    runner) and confirmed on `engine`: (the new KnownCause or None, why not, renders spent on the reducer). Kept
    only when the engine itself gives the cause's own id again (the same format, rule and kind of difference),
    so the cause's id and cells stay as recorded."""
    from conformance.explain.signature import outcome_record
    from conformance.judge.expectations import KnownCause
    from runners.base import Conversation, RenderRequest

    repro = cause.repro or {}
    if not isinstance(repro.get("template"), str) or not isinstance(repro.get("case"), dict):
        return None, "no reproducer to render", 0
    request = RenderRequest(repro["template"], Conversation.from_dict(repro["case"]), repro.get("bos_token"),
                            repro.get("eos_token"), "repro", "repro")

    def same_cause(template: str, symptom) -> bool:
        return symptom is not None and symptom.differs and \
            cause_id(runner, *detect(template), symptom_kind(symptom)) == cause.id

    (ref, eng), = render_pairs(reference, reducer, [request])
    symptom = compare(ref, eng)
    if not same_cause(request.template, symptom):
        return None, "the stored reproducer does not differ so on the reduction runner", 1
    found = drive([("cause", FormatReduction(request, symptom, detect, budget=budget))], reference, reducer,
                  parallel=1, failed=lambda key, exc: None).get("cause")
    if not isinstance(found, Found):
        return None, getattr(found, "reason", "not reduced"), 1
    (ref, eng), = render_pairs(reference, engine, [found.request])
    symptom = compare(ref, eng)
    if not same_cause(found.request.template, symptom):
        return None, "the reduced reproducer does not differ so on the engine itself", found.renders + 1
    name, rule = detect(found.request.template)
    stored = {"template": found.request.template, "case": found.request.conversation.to_dict(),
              "bos_token": request.bos_token, "eos_token": request.eos_token, "reference": outcome_record(ref),
              "engine": outcome_record(eng)}
    record = KnownCause(cause.id, title_of(name, rule, symptom, getattr(eng, "message", "")), cause.reason,
                        cause.link, list(cause.constructs), symptom.to_dict(), stored)
    return record, "", found.renders + 1


def finish_format_baseline(baseline, detect: Callable, reference, reducer, engine, only: Optional[set] = None,
                           log: Optional[Callable[[str], None]] = None) -> tuple:
    """`expectations minimize` for an engine that writes built-in formats: each cause (of `only`) whose stored
    template a FormatReduction still shrinks is stored with the smaller reproducer, confirmed on `engine`; ids
    and cells stay (a format cause is keyed by format, rule and kind, which the reduction keeps). Returns (the
    new Expectations, not written; counts)."""
    from dataclasses import replace as replaced

    causes, reduced, kept = {}, 0, 0
    for cause in baseline.causes.values():
        record = None
        if only is None or cause.id in only:
            record, why, renders = finish_format_cause(baseline.runner, cause, detect, reference, reducer, engine)
            if record is not None and record.repro["template"] == cause.repro["template"] and \
                    record.repro["case"] == cause.repro["case"]:
                record = None
                why = "already as small as FormatReduction makes it"
            if log is not None:
                lines = lambda repro: len(repro["template"].splitlines()) or 1  # noqa: E731
                log(f"{cause.id}: " + (f"{lines(cause.repro)} -> {lines(record.repro)} template lines, "
                                       f"{renders} renders" if record is not None else f"kept as recorded ({why})"))
        reduced += record is not None
        kept += record is None
        causes[cause.id] = record or cause
    counts = {"causes_before": len(baseline.causes), "causes_after": len(causes), "reduced": reduced,
              "renamed": 0, "merged": 0, "kept": kept}
    return replaced(baseline, causes=causes), counts

