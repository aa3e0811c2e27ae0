"""Select -> render -> judge: the one path every entry point takes.

`chatgold check` (local goldens or `--service`), the pytest gate and the service's POST /v1/check all select
cells here, render them through a Runner, judge each outcome against its golden (status) and the runner's
expectations (verdict), and read the conformance figure from the result. Nothing here writes a report:
judged results carry what the report writers need (windows around the first difference, both sides'
refusals), so report/ imports no engine and reads no golden.
"""
from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Protocol, Sequence

from conformance.judge.expectations import Expectations, baseline_directory, load_expectations, verdict
from conformance.judge.goldens import ENCODING_ERRORS, Golden, GoldenStore
from conformance.judge.status import (
    CellResult,
    Status,
    Verdict,
    count_statuses,
    figure,
    result_for,
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
            result.extra["golden_window"] = _window(golden.data, result.divergence.offset)
            result.extra["output_window"] = _window(result.output.encode("utf-8", ENCODING_ERRORS),
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

    def __post_init__(self):
        self.by_cell = {r.key: r for r in self.results}

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
        cause = result.extra.get("cause")
        if (cause and result.verdict == Verdict.EXPECTED_FAIL
                and (expectation is None or expectation.status != result.status
                     or (expectation.fingerprint or None) not in (None, result.extra.get("fingerprint")))):
            recorded = expectation.cause if expectation is not None else None
            expectation = expectations.for_cause(cause, str(result.status))
            if recorded and recorded != cause and expectation is not None:
                known = expectations.causes.get(recorded)
                expectation.recorded_cause = {"id": recorded, "title": known.title if known else ""}
        elif cause and expectation is not None and expectation.cause and expectation.cause != cause:
            known = expectations.causes.get(expectation.cause)
            expectation.recorded_cause = {"id": expectation.cause, "title": known.title if known else ""}
        result.expectation = expectation


def render(runner, cells: Sequence[Cell], progress: Optional[Callable[[int, int], None]] = None,
           store=None, refresh: bool = False) -> list:
    """Every cell's outcome through the runner, in order. With a result store (judge/store.py) the store
    answers first and only the cells it does not hold are rendered; refresh renders every cell and stores
    what comes back."""
    from conformance.judge.store import cached_render_many

    outcomes = []
    total = len(cells)
    for index, outcome in enumerate(cached_render_many(runner, [c.request for c in cells], store, refresh), 1):
        outcomes.append(outcome)
        if progress:
            progress(index, total)
    return outcomes


def judge_outcomes(info: dict, cells: Sequence[Cell], outcomes: Sequence[Outcome], judge: Optional[Judge] = None,
                   expectations: Optional[Expectations] = None, expectations_dir=None,
                   suite_baseline: bool = True) -> RunnerResults:
    """Status and verdict for every cell of one runner. `suite_baseline`: the runner is one the suite ships
    (Runner.suite_baseline), whose baseline may be the suite's own; never true of a `command:` harness."""
    name = str(info.get("name", "runner"))
    judge = judge or GoldenJudge()
    results = judge.judge(name, [(c.template.id, c.case.id, o) for c, o in zip(cells, outcomes)])
    if expectations is None:
        expectations = load_expectations(name, baseline_directory(suite_baseline, expectations_dir))
    apply_expectations(results, expectations)
    return RunnerResults(info, results, expectations)


def runner_info(runner, seconds: Optional[float] = None) -> dict:
    """The runner's description for judged results, with what it decided per template (Runner.template_facts:
    e.g. llama.cpp's built-in format), which the report shows beside each template. Call after rendering."""
    info = dict(runner.describe())
    if seconds is not None:
        info["seconds"] = round(seconds, 3)
    facts = runner.template_facts()
    if facts:
        info["template_facts"] = facts
    return info


def add_token_parity(runner, cells: Sequence[Cell], results: RunnerResults, judge: Optional[Judge]) -> None:
    """The second verdict, on tokens (judge/tokens.py), for runners that can tell what they feed their model;
    it needs local goldens (a GoldenJudge)."""
    goldens = getattr(judge, "goldens", None)
    if goldens is not None and runner.reports_tokens():
        from conformance.judge.tokens import token_parity

        token_parity(runner, cells, results.results, goldens)


def run(runner, cells: Sequence[Cell], judge: Optional[Judge] = None, expectations_dir=None,
        progress: Optional[Callable[[int, int], None]] = None, store=None, refresh: bool = False,
        tokens: bool = True) -> RunnerResults:
    """Render every cell through an open runner (the result store first, when given) and judge the outcomes
    (and, with `tokens`, the tokens the engine feeds its model, where the runner can tell)."""
    started = time.perf_counter()
    outcomes = render(runner, cells, progress, store, refresh)
    info = runner_info(runner, time.perf_counter() - started)
    judge = judge or GoldenJudge()
    results = judge_outcomes(info, cells, outcomes, judge, expectations_dir=expectations_dir,
                             suite_baseline=getattr(runner, "suite_baseline", True))
    if tokens:
        add_token_parity(runner, cells, results, judge)
    return results


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
           "render", "run", "runner_info", "add_token_parity", "shard_of", "parse_shard", "iter_cells", "summary_of", "requests_by_cell"]
