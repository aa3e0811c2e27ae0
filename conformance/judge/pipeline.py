"""Select -> render -> judge: the one path every entry point takes.

`chatgold check` (local goldens or `--service`), the pytest gate and the service's POST /v1/check all select
cells here, render them through a Runner, judge each outcome against its golden (status) and the runner's
expectations (verdict), and read the conformance figure from the result. Nothing here writes a report:
judged results carry what the report writers need (windows around the first difference, both sides'
refusals), so report/ imports no engine and reads no golden.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Protocol, Sequence

from conformance.files import ENCODING_ERRORS
from conformance.judge.classify import result_for
from conformance.judge.expectations import Expectations, verdict
from conformance.judge.goldens import Golden, GoldenStore
from conformance.judge.status import (
    CellResult,
    Status,
    Verdict,
    count_statuses,
    figure,
)
from runners.base import Outcome, RenderRequest

WINDOW = 160  # bytes of golden and output kept either side of the first difference


# -- selection -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    template: object  # corpus.manifest.TemplateEntry
    case: object      # corpus.cases.Case
    request: RenderRequest

    @property
    def key(self) -> tuple:
        return (self.template.id, self.case.id)


def shard_of(key: str, count: int) -> int:
    """Deterministic shard for a template id: stable across machines and Python runs (no hash randomisation)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % count


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N), 1 <= I <= N; ValueError naming the problem otherwise."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"shard {text!r}: expected I/N, e.g. 2/4") from None
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"shard {text}: I must be between 1 and N")
    return index, count


@dataclass
class Selection:
    """Which templates and cases a run covers (globs match ids case-insensitively)."""

    corpus: object
    all_cases: list
    templates: list
    cases: list
    template_globs: tuple = ()
    case_globs: tuple = ()
    features: tuple = ()
    shard: Optional[str] = None

    @classmethod
    def load(cls, templates: Sequence[str] = (), cases: Sequence[str] = (), features: Sequence[str] = (),
             shard: Optional[str] = None, corpus=None, all_cases: Optional[list] = None) -> "Selection":
        from conformance.corpus.cases import load_cases, select_cases
        from conformance.corpus.manifest import load_corpus

        corpus = corpus if corpus is not None else load_corpus()
        all_cases = all_cases if all_cases is not None else load_cases()
        chosen = corpus.select(list(templates) or None)
        if shard:
            index, count = parse_shard(shard)
            chosen = [t for t in chosen if shard_of(t.id, count) == index - 1]
        return cls(corpus, all_cases, chosen, select_cases(all_cases, list(cases) or None, list(features) or None),
                   tuple(templates), tuple(cases), tuple(features), shard)

    @property
    def full(self) -> bool:
        return not (self.template_globs or self.case_globs or self.features or self.shard)

    def cells(self) -> list[Cell]:
        out = []
        for template in self.templates:
            source = template.source()
            for case in self.cases:
                out.append(Cell(template, case, case.request(source, template.bos_token, template.eos_token,
                                                             template.id)))
        return out

    def describe(self) -> dict:
        return {"templates": list(self.template_globs), "cases": list(self.case_globs),
                "features": list(self.features), "shard": self.shard,
                "template_count": len(self.templates), "case_count": len(self.cases)}

    def metadata(self) -> dict:
        """What report writers need to know of the inputs: each case's features, each template's constructs
        (recorded with the corpus) and family."""
        from conformance.corpus.manifest import load_constructs

        try:
            constructs = load_constructs()
        except (OSError, ValueError):
            constructs = {}
        return {"cases": {c.id: {"features": list(c.features)} for c in self.cases},
                "templates": {t.id: {"family": t.family, "constructs": constructs.get(t.sha256)}
                              for t in self.templates}}


# -- judging -------------------------------------------------------------------------------------------------

class Judge(Protocol):
    """Gives each (template, case, outcome) its status against the golden."""

    def judge(self, runner_name: str, cells: Sequence[tuple]) -> list[CellResult]: ...


def _window(data: bytes, offset: int) -> dict:
    start = max(0, offset - WINDOW)
    return {"start": start, "before": data[start:offset].decode("utf-8", "backslashreplace"),
            "after": data[offset:offset + WINDOW].decode("utf-8", "backslashreplace"),
            "truncated_after": offset + WINDOW < len(data)}


class GoldenJudge:
    """Judges against the goldens on disk (read once through a shared GoldenStore)."""

    def __init__(self, goldens: Optional[Callable[[str, str], Optional[Golden]]] = None):
        self.goldens = goldens or GoldenStore()

    def judge_one(self, runner_name: str, template_id: str, case_id: str, outcome: Outcome,
                  seconds: float = 0.0) -> CellResult:
        golden = self.goldens(template_id, case_id)
        result = result_for(runner_name, template_id, case_id, golden, outcome, seconds)
        if result.divergence is not None:
            result.golden_window = _window(golden.data, result.divergence.offset)
            result.output_window = _window(result.output.encode("utf-8", ENCODING_ERRORS),
                                                    result.divergence.offset)
        return result

    def judge(self, runner_name: str, cells: Sequence[tuple]) -> list[CellResult]:
        return [self.judge_one(runner_name, t, c, o) for t, c, o in cells]


@dataclass
class RunnerResults:
    """One runner's judged cells over a selection."""

    info: dict
    results: list
    expectations: Expectations
    by_cell: dict = field(default_factory=dict)
    explanation: Optional[object] = None  # explain.causes.Explanation, when the explain stage ran

    def __post_init__(self):
        self.by_cell = {(r.template_id, r.case_id): r for r in self.results}  # r.key, without a call a cell

    @property
    def name(self) -> str:
        return str(self.info.get("name", "runner"))

    def counts(self) -> dict:
        return count_statuses(self.results)

    def figure(self) -> dict:
        return figure(self.counts())

    def verdicts(self) -> Counter:
        return Counter(str(r.verdict) for r in self.results)

    def unexpected(self) -> list:
        return [r for r in self.results if r.verdict is not None and r.verdict.failing]


def apply_expectations(results: Iterable[CellResult], expectations: Expectations) -> None:
    """Give every result its verdict (and the expectation it was held against). A cell the baseline does not
    know as it is, but whose explained root cause (extra["cause"]) the baseline knows, is held against that
    cause."""
    for result in results:
        expectation = expectations.get(result.template_id, result.case_id)
        result.verdict = verdict(result, expectation, expectations.causes)
        cause = result.cause
        if (cause and result.verdict == Verdict.EXPECTED_FAIL
                and (expectation is None or expectation.status != result.status
                     or (expectation.fingerprint or None) not in (None, result.fingerprint))):
            recorded = expectation.cause if expectation is not None else None
            expectation = expectations.for_cause(cause, str(result.status))
            if recorded and recorded != cause and expectation is not None:
                known = expectations.causes.get(recorded)
                expectation.recorded_cause = {"id": recorded, "title": known.title if known else ""}
        elif cause and expectation is not None and expectation.cause and expectation.cause != cause:
            known = expectations.causes.get(expectation.cause)
            expectation.recorded_cause = {"id": expectation.cause, "title": known.title if known else ""}
        result.expectation = expectation


def judge_outcomes(info: dict, cells: Sequence[Cell], outcomes: Sequence[Outcome], judge: Judge,
                   expectations: Expectations) -> RunnerResults:
    """Stage judge: every cell's status against its golden (the verdict comes later, once causes are known)."""
    name = str(info.get("name", "runner"))
    results = judge.judge(name, [(c.template.id, c.case.id, o) for c, o in zip(cells, outcomes)])
    return RunnerResults(info, results, expectations)


def add_token_parity(runner, cells: Sequence[Cell], results: RunnerResults, goldens, store=None,
                     refresh: bool = False) -> None:
    """Stage tokens: the second verdict, on tokens (judge/tokens.py), for runners that can tell what they feed
    their model; it needs local goldens. With a result store, verdicts stored under the same runner and
    tokenizer identities are read, not asked again."""
    if runner.reports_tokens():
        from conformance.judge.tokens import token_parity

        token_parity(runner, cells, results.results, goldens, store, refresh)


def requests_by_cell(cells: Iterable[Cell]) -> dict:
    return {c.key: c.request for c in cells}


def iter_cells(templates: Iterable, cases: Iterable) -> Iterator[Cell]:
    """Cells of arbitrary templates (corpus entries or look-alikes) x cases."""
    cases = list(cases)
    for template in templates:
        source = template.source()
        for case in cases:
            yield Cell(template, case, case.request(source, template.bos_token, template.eos_token, template.id))


def summary_of(results: Iterable[CellResult]) -> dict:
    """{cells, judged, passed, not_run, conformance, ran, counts}: a batch's figure (service, CLI)."""
    counts = count_statuses(results)
    return {**figure(counts), "counts": counts}


__all__ = ["Cell", "Selection", "GoldenJudge", "RunnerResults", "Status", "apply_expectations", "judge_outcomes",
           "add_token_parity", "shard_of", "parse_shard", "iter_cells", "summary_of", "requests_by_cell"]
