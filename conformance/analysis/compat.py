"""One template against every engine: does it render right where people run the model?

A publisher's template has no stored golden, so the reference renders it on every case first and its outcomes
are the goldens of this run (held in memory, never written to goldens/). Then one CheckRun renders and judges
the same cells through each selected engine. Every cell lands in exactly one bucket per engine:

    right      the engine's bytes (or refusal) are the reference's
    differs    diverged, raised differently, or rendered where the reference refused
    refuses    the engine raised where the reference rendered
    no-answer  the runner crashed or timed out (a failure: nothing says the template renders there)
    not-run    the runner cannot express the case (skipped) or the reference gave no answer: counted, shown

For each difference the engine's known cause, from its baseline (conformance/expectations/<engine>.json):

    baseline   the template is a corpus template with the same special tokens, and the baseline knows the cell
               as it is (same status and output): the baseline's own cause
    mechanism  a known cause whose recorded symptom is this cell's (same refusal, or same first edit) and whose
               culprit constructs the template uses, confirmed live by rendering its reproducer on both sides
               again (it still differs as recorded in this engine build)
    reduced    (optional, bounded) a fresh reduction of the cell (conformance/explain); the cause id is keyed
               by mechanism, so a reduced cause the baseline knows is reported with its title and reason

A difference none of these explains is reported without a cause, never dropped.
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from conformance.judge.status import NO_ANSWER, PASSING, Status

FORMAT_VERSION = 1

# The engines `chatgold compat` runs by default: the suite's Jinja-rendering runners (ollama picks a Go
# template of its own and needs a model server; the example harnesses are examples).
DEFAULT_ENGINES = ("llamacpp", "llamacpp-builtin", "minijinja", "hfjs", "tgi", "mistralrs", "llama-cpp-python")

BUCKETS = ("right", "differs", "refuses", "no-answer", "not-run")
MAX_CASES_SHOWN = 200


def bucket_of(status: Status) -> str:
    if status in PASSING:
        return "right"
    if status == Status.ENGINE_RAISED:
        return "refuses"
    if status in NO_ANSWER:
        return "no-answer"
    if status in (Status.SKIPPED, Status.NO_GOLDEN):
        return "not-run"
    return "differs"


@dataclass(frozen=True)
class UserTemplate:
    """A template as the cells want it (id, source(), special tokens); `corpus_id` when its bytes are a
    corpus template's (the baseline then knows its cells by that id)."""

    id: str
    text: str
    bos_token: Optional[str]
    eos_token: Optional[str]
    family: Optional[str] = None

    def source(self) -> str:
        return self.text


def corpus_twin(text: str):
    """The corpus entry with exactly these bytes, if any."""
    from conformance.corpus.manifest import CorpusError, load_corpus

    try:
        corpus = load_corpus()
    except (CorpusError, OSError, ValueError):
        return None
    return corpus.by_sha.get(hashlib.sha256(text.encode("utf-8")).hexdigest())


class MemoryGoldens:
    """The reference's outcomes of this run, as goldens ((template, case) -> Golden)."""

    def __init__(self):
        self.goldens: dict = {}

    def __call__(self, template_id: str, case_id: str):
        return self.goldens.get((template_id, case_id))


# -- template lines ----------------------------------------------------------------------------------------

def _construct_patterns(name: str) -> list:
    kind, _, word = name.partition(":")
    w = re.escape(word)
    return {
        "filter": [rf"\|\s*{w}\b"],
        "test": [rf"\bis\s+(?:not\s+)?{w}\b"],
        "method": [rf"\.{w}\s*\("],
        "global": [rf"\b{w}\s*\("],
        "stmt": [rf"\{{%-?\s*{w}\b"],
        "loop": [rf"\bloop\.{w}\b"],
    }.get(kind, [re.escape(word)] if word else [])


def construct_line(template: str, constructs: Sequence[str]) -> Optional[int]:
    """The first line (1-based) of the template that uses one of the constructs, None when none is found."""
    best = None
    for name in constructs:
        for pattern in _construct_patterns(name):
            match = re.search(pattern, template)
            if match:
                line = template.count("\n", 0, match.start()) + 1
                best = line if best is None else min(best, line)
    return best


_LINE_IN_MESSAGE = re.compile(r"\bline (\d+)\b")


def message_line(message: str, template: str) -> Optional[int]:
    """A refusal that names a template line (`... line 3`), when that line exists."""
    match = _LINE_IN_MESSAGE.search(message or "")
    if match and 1 <= int(match.group(1)) <= template.count("\n") + 1:
        return int(match.group(1))
    return None


# -- known causes ------------------------------------------------------------------------------------------

def _known_repro_constructs(known) -> list:
    from conformance.explain import cluster

    if known.constructs:
        return cluster.culprits(known.constructs)
    repro = known.repro or {}
    return cluster.culprits(cluster.constructs_of(repro.get("template", ""))) if repro.get("template") else []


def match_known_causes(template: str, symptoms: dict, baseline, engine, reference) -> dict:
    """cell key -> (KnownCause, how) for cells whose symptom is a known cause's mechanism, confirmed live.

    `symptoms`: cell key -> Symptom. A candidate cause must show the same difference (Symptom.keeps against
    the difference its recorded outcomes show today) and use only constructs the template uses; every
    candidate is confirmed by rendering its reproducer again through the engine and the reference."""
    from conformance.explain import cluster
    from conformance.explain.baseline import _recorded_symptom, check_known_causes
    from conformance.explain.reduce import Found

    uses = set(cluster.constructs_of(template))
    candidates: dict = {}   # key -> [KnownCause]
    wanted: dict = {}
    for known in baseline.causes.values():
        if not known.symptom or not known.repro:
            continue
        target = _recorded_symptom(known)
        culprits = _known_repro_constructs(known)
        if culprits and not set(culprits) <= uses:
            continue
        for key, symptom in symptoms.items():
            if symptom is not None and symptom.keeps(target):
                candidates.setdefault(key, []).append((len(culprits), known))
                wanted[known.id] = known
    if not wanted:
        return {}
    live = check_known_causes(list(wanted.values()), engine, reference)
    out = {}
    for key, found in candidates.items():
        confirmed = [(-n, k.id, k) for n, k in found if isinstance(live.get(k.id), Found)]
        if confirmed:
            out[key] = min(confirmed, key=lambda c: (c[0], c[1]))[2]
    return out


def _cause_record(cause_id: str, title: str, reason: str, link: str, how: str, known: bool,
                  repro_template: Optional[str] = None) -> dict:
    data = {"id": cause_id, "title": title or "", "reason": reason or "", "how": how, "known": known}
    if link:
        data["link"] = link
    if repro_template is not None:
        data["reproducer"] = repro_template
    return data


# -- the run -----------------------------------------------------------------------------------------------

@dataclass
class CompatOptions:
    engines: Sequence[str] = DEFAULT_ENGINES
    workers: int = 2
    timeout: float = 20.0
    reduce: bool = False
    budget: int = 300
    max_groups: int = 3
    store: Optional[object] = None
    refresh: bool = False
    expectations_dir: Optional[object] = None
    log: Optional[Callable[[str], None]] = None
    # time.monotonic() after which no further engine starts (the service's bound); those left are listed in
    # the record's `not_run` and the template is not said to render right everywhere
    deadline: Optional[float] = None


def compat(template: UserTemplate, options: CompatOptions, check_run: Callable, explain_options: Callable,
           cases: Optional[list] = None, open_runner: Optional[Callable[[str], object]] = None) -> dict:
    """The compat record of one template (conformance/schemas/compat.schema.json#/$defs/template).

    check_run / explain_options: conformance.checkrun's CheckRun and ExplainOptions, handed in by the caller
    (the check run sits a floor above analysis): every render and judgement goes through one check run."""
    from conformance.corpus.cases import load_cases
    from conformance.explain.signature import reference_golden, symptom_of
    from conformance.judge.pipeline import GoldenJudge, iter_cells
    from runners import REFERENCE_RUNNER, get_runner

    started = time.perf_counter()
    cases = load_cases() if cases is None else cases
    twin = corpus_twin(template.text)
    if twin is not None and (twin.bos_token, twin.eos_token) == (template.bos_token, template.eos_token):
        template = UserTemplate(twin.id, template.text, template.bos_token, template.eos_token, twin.family)
    cells = list(iter_cells([template], cases))
    goldens = MemoryGoldens()
    opener = open_runner or (lambda spec: get_runner(spec, workers=options.workers, timeout=options.timeout))
    log = options.log or (lambda _: None)

    reference_runner = opener(REFERENCE_RUNNER)
    run = check_run(cells, judge=GoldenJudge(goldens), expectations_dir=options.expectations_dir,
                   store=options.store, refresh=options.refresh, tokens=False, workers=options.workers,
                   timeout=options.timeout, reference=lambda: reference_runner)
    try:
        reference_outcomes = run.outcomes(reference_runner)
        reference_failed = []
        for cell, outcome in zip(cells, reference_outcomes):
            golden = reference_golden(outcome)
            if golden is None:
                reference_failed.append({"case": cell.case.id, "kind": outcome.kind,
                                         "message": getattr(outcome, "message", "")[:500]})
            goldens.goldens[cell.key] = golden
        reference_info = dict(reference_runner.describe())
        engines, not_run = [], []
        for spec in options.engines:
            if options.deadline is not None and time.monotonic() > options.deadline:
                not_run.append({"engine": spec, "why": "the run's time limit was reached before this engine started"})
                continue
            log(f"{spec}: rendering {len(cells)} cases")
            engine = opener(spec)
            try:
                results = run.check(engine, spec)
                engines.append(_engine_record(spec, results, template, goldens, engine, reference_runner,
                                              options, run, symptom_of, explain_options))
            finally:
                engine.close()
    finally:
        reference_runner.close()
    rendered = sum(1 for o in reference_outcomes if o.kind == "rendered")
    digest = hashlib.sha256()
    for cell in cells:  # every case's reference bytes (or refusal), in case order: --fix proves rewrites by it
        golden = goldens.goldens.get(cell.key)
        digest.update(f"{cell.case.id}\x1f{golden.kind if golden else 'none'}\x1f".encode())
        digest.update((golden.data if golden else b"") + b"\x1e")
    record = {
        "format": FORMAT_VERSION,
        "template": {"name": template.id, "corpus_id": twin.id if twin else None,
                     "bos_token": template.bos_token, "eos_token": template.eos_token,
                     "lines": template.text.count("\n") + 1},
        "reference": {"runner": reference_info, "cases": len(cells), "rendered": rendered,
                      "raised": sum(1 for o in reference_outcomes if o.kind == "raised"),
                      "failed": reference_failed, "digest": digest.hexdigest()},
        "engines": engines,
        "renders_right_everywhere": all(e["renders_right"] for e in engines) and not not_run,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if not_run:
        record["not_run"] = not_run
    return record


def _engine_record(spec, results, template: UserTemplate, goldens, engine, reference, options: CompatOptions,
                   run, symptom_of, explain_options) -> dict:
    from conformance.explain.causes import engine_outcome
    from conformance.judge.status import NON_MATCHING, Verdict

    counts = {b: 0 for b in BUCKETS}
    rows = []
    symptoms = {}
    for result in results.results:
        bucket = bucket_of(result.status)
        counts[bucket] += 1
        if bucket == "right":
            continue
        row = {"case": result.case_id, "status": str(result.status), "bucket": bucket}
        if result.message:
            row["message"] = result.message[:500]
        if result.divergence is not None:
            row["offset"] = result.divergence.offset
            row["reference"] = result.golden_window
            row["engine"] = result.output_window
        rows.append(row)
        if result.status in NON_MATCHING:
            symptoms[result.key] = symptom_of(goldens(*result.key), engine_outcome(result))
    baseline = results.expectations
    causes: dict = {}
    assigned: dict = {}
    # 1. the baseline knows the cell as it is (a corpus template with its own special tokens)
    for result in results.results:
        if result.key in symptoms and result.verdict == Verdict.EXPECTED_FAIL and result.expectation is not None \
                and result.expectation.cause in baseline.causes:
            assigned[result.key] = (baseline.causes[result.expectation.cause], "baseline")
    # 2. a known cause's mechanism, confirmed by rendering its reproducer again
    rest = {k: s for k, s in symptoms.items() if k not in assigned}
    if rest:
        for key, known in match_known_causes(template.text, rest, baseline, engine, reference).items():
            assigned[key] = (known, "mechanism")
    for key, (known, how) in assigned.items():
        causes.setdefault(known.id, _cause_record(known.id, known.title, known.reason, known.link, how, True,
                                                  (known.repro or {}).get("template")))
    # 3. a fresh, bounded reduction of what is left
    unexplained = {k for k in symptoms if k not in assigned}
    if options.reduce and unexplained:
        # the check run's explain stage, on these cells only (scope "all": no baseline fast path to take)
        run.explain = explain_options(scope="all", budget=options.budget, max_groups=options.max_groups)
        try:
            explanation = run.check(engine, spec, explain_only=unexplained).explanation
        finally:
            run.explain = None
        for cause in explanation.causes:
            known = baseline.causes.get(cause.id)
            record = _cause_record(cause.id, known.title if known else cause.title, known.reason if known else "",
                                   known.link if known else "", "reduced", known is not None,
                                   cause.found.request.template)
            record["constructs"] = list(cause.constructs)
            causes.setdefault(cause.id, record)
            for cell in cause.cells:
                assigned[tuple(cell)] = (None, cause.id)
    for row in rows:
        key = (template.id, row["case"])
        if key in assigned:
            known, how = assigned[key]
            row["cause"] = known.id if known is not None else how
    for cause in causes.values():
        cause["cases"] = sorted(r["case"] for r in rows if r.get("cause") == cause["id"])
        constructs = cause.get("constructs")
        if constructs is None:
            known = baseline.causes.get(cause["id"])
            constructs = _known_repro_constructs(known) if known else []
            cause["constructs"] = constructs
        cause["line"] = construct_line(template.text, constructs)
    for row in rows:
        line = None
        if row.get("cause") in causes:
            line = causes[row["cause"]]["line"]
        if line is None and row.get("message"):
            line = message_line(row["message"], template.text)
        row["line"] = line
    failing = counts["differs"] + counts["refuses"] + counts["no-answer"]
    return {
        "engine": spec, "runner": results.info.get("name", spec), "version": str(results.info.get("version", "")),
        "cases": len(results.results), "counts": counts, "renders_right": failing == 0,
        "explained": sum(1 for r in rows if r.get("cause")),
        "unexplained": sum(1 for r in rows if r["bucket"] in ("differs", "refuses") and not r.get("cause")),
        "causes": sorted(causes.values(), key=lambda c: (-len(c["cases"]), c["id"])),
        "failures": rows[:MAX_CASES_SHOWN], "failures_shown": min(len(rows), MAX_CASES_SHOWN),
        "failures_total": len(rows),
    }
