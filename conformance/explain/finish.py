"""`chatgold expectations minimize`: finish reducing a baseline's stored reproducers, then key them again.

A reproducer recorded by an older reducer, or one its budget cut short, may still shrink: some single step of
the reducer's own registry (minimal.SHRINKS) keeps its difference. Each such reproducer is taken down one step
at a time, always the smallest candidate that keeps the difference (the check minimal.is_one_minimal makes,
both sides rendered every time), until no step keeps it. Every cause is then keyed by mechanism from its
finished reproducer (cluster.cause_key): causes whose reproducers turn out to be one mechanism become one
cause, holding all their cells and every hand-written reason; titles come from the construct kept last. A
reproducer that keeps several culprits is keyed by the one that shows its difference alone (isolate.py), so one
bug reached through a macro, `.get()` or `caller()` is one cause with the bug reached directly. Only
causes with one key merge here: explain's merge by rendering (one cause's template given another's data) says
that the other's data sets this mechanism off too, not that the other's cells have no mechanism of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from conformance.explain import cluster
from conformance.explain import template as tpl
from conformance.explain.baseline_merge import _one_cause
from conformance.explain.causes import find_owners
from conformance.explain.driver import render_pairs
from conformance.explain.isolate import isolated_constructs
from conformance.explain.minimal import _full, is_one_minimal
from conformance.explain.reduce import PROBE_TEMPLATE, Found, _answer, keyed_by_text
from conformance.explain.signature import compare, outcome_record
from conformance.judge.expectations import Expectations, KnownCause, parse_value
from runners.base import Conversation, RenderRequest

MAX_STEPS = 200  # single steps per reproducer; each removes something, so this is never the limit in practice


@dataclass
class Finished:
    """One cause's reproducer after finishing: the new record, or why it was kept as it was."""
    old_id: str
    record: Optional[KnownCause] = None
    steps: list = field(default_factory=list)   # the step names taken, in order
    kept_because: str = ""                       # set when the stored record is kept unchanged


def _request(repro: dict, template: str, case: dict) -> RenderRequest:
    return RenderRequest(template, Conversation.from_dict(case), repro.get("bos_token"), repro.get("eos_token"),
                         "repro", "repro")


def finish_one(cause: KnownCause, engine, reference, template: bool = True, confirm=None) -> Finished:
    """Reduce one stored reproducer to 1-minimal and describe it again (id, title, constructs, symptom).
    `engine` renders the candidates (an engine's reduction runner may); `confirm`, the engine itself, renders
    the finished reproducer that is stored (default: `engine`)."""
    repro = dict(cause.repro or {})
    if not isinstance(repro.get("template"), str) or not isinstance(repro.get("case"), dict):
        return Finished(cause.id, kept_because="no reproducer to render")
    done = Finished(cause.id)
    for _ in range(MAX_STEPS):
        verdict = is_one_minimal(repro, engine, reference, template=template)
        if verdict:
            break
        if not verdict.kept:
            done.kept_because = verdict.reason or "not checked"
            return done
        name, source, conversation = verdict.kept[0]   # candidates are listed smallest first
        repro = {**repro, "template": source, "case": Conversation.from_dict(conversation).to_dict()}
        done.steps.append(name)
    else:
        done.kept_because = f"still shrinking after {MAX_STEPS} steps"
        return done
    case = _full(repro["case"])
    requests = [_request(repro, repro["template"], case), _request(repro, PROBE_TEMPLATE, case)] + \
        [_request(repro, variant, case) for variant in tpl.neutral_variants(repro["template"])]
    (ref, eng), (probe_ref, probe_eng), *variant_pairs = render_pairs(reference, confirm or engine, requests)
    symptom = compare(ref, eng)
    if symptom is None or not symptom.differs:
        done.kept_because = "the finished reproducer did not differ when rendered again"
        return done
    # As a reduction decides it (Reduction.template_ignored, template_sensitive): the engine ignores the
    # template (the plain-text probe answers alike), or keys it by its exact text (the neutral variant does
    # not); `template=False` (data steps only) says so outright.
    keyed = bool(template) and keyed_by_text((ref, eng), variant_pairs, symptom)
    ignores = not template or (_answer(eng) == _answer(probe_eng) and _answer(ref) != _answer(probe_ref)) or keyed
    found = Found(requests[0], ref, eng, symptom, 0, True, ignores_template=ignores, recognised=keyed)
    find_owners({cause.id: found}, reference, confirm or engine)
    # keyed by the culprit a reproducer with several shows alone (isolate.py), rendered on the engine itself
    constructs = cluster.constructs_of(repro["template"]) if found.owner else \
        isolated_constructs(requests[0], symptom, ref, eng, reference, confirm or engine, ignores)
    data = requests[0].conversation.to_dict()
    paths = cluster.read_paths(repro["template"], data)
    key = cluster.cause_key(symptom, constructs, ref, eng, ignores, paths, data, found.owner, found.recognised_as)
    stored = {"template": repro["template"], "case": repro["case"], "bos_token": repro.get("bos_token"),
              "eos_token": repro.get("eos_token"), "reference": outcome_record(ref), "engine": outcome_record(eng),
              **({"owner": list(found.owner)} if found.owner else {})}
    title = cluster.title(symptom, constructs, ref, eng, ignores, paths, data, found.owner, found.recognised_as)
    done.record = KnownCause(cluster.cause_id(key), title, cause.reason, cause.link,
                             [] if found.owner else cluster.culprits(constructs),
                             symptom.to_dict(), stored)
    return done


def finish_baseline(baseline: Expectations, engine, reference, template: bool = True,
                    only: Optional[set] = None, log: Optional[Callable[[str], None]] = None,
                    confirm=None) -> tuple:
    """Finish every cause of `baseline` (or the ids in `only`) and key them again; causes of one key are
    merged (the smallest reproducer, every distinct reason, the first link) and the cells renamed. Returns
    (the new Expectations, not written; counts; [Finished])."""
    results = []
    for cause in baseline.causes.values():
        if only is not None and cause.id not in only:
            results.append(Finished(cause.id, kept_because="not selected"))
            continue
        finished = finish_one(cause, engine, reference, template, confirm)
        results.append(finished)
        if log is not None:
            if finished.record is None:
                log(f"{cause.id}: kept as recorded ({finished.kept_because})")
            else:
                renamed = "" if finished.record.id == cause.id else f" -> {finished.record.id}"
                log(f"{cause.id}{renamed}: {len(finished.steps)} steps; {finished.record.title}")
    rename: dict = {}
    records: dict = {}
    for finished in results:
        record = finished.record or baseline.causes[finished.old_id]
        rename[finished.old_id] = record.id
        records.setdefault(record.id, []).append(record)
    causes = {cause_id: _one_cause(found) if len(found) > 1 else found[0]
              for cause_id, found in sorted(records.items())}
    cells = {}
    for template_id, cases in baseline.cells.items():
        cells[template_id] = {}
        for case_id, value in cases.items():
            status, fp, cause_id = parse_value(value)
            if cause_id is not None:
                value = status + (f":{fp}" if fp else "") + f"@{rename.get(cause_id, cause_id)}"
            cells[template_id][case_id] = value
    new = Expectations(baseline.runner, cells, baseline.rules, baseline.path, causes, baseline.status_reasons)
    counts = {"causes_before": len(baseline.causes), "causes_after": len(causes),
              "reduced": sum(1 for f in results if f.record is not None and f.steps),
              "renamed": sum(1 for old, new_id in rename.items() if old != new_id),
              "merged": sum(len(found) - 1 for found in records.values()),
              "kept": sum(1 for f in results if f.record is None)}
    return new, counts, results
