"""One cell's status against its golden, and the conformance figure: the judge's vocabulary, defined once.

A status says what happened in a cell; a verdict (judge/expectations.py) says whether that was expected.
Two refusals match only when they are of the same kind (runners.base.RefusalKind): a compile failure
matches a compile failure, a render failure a render failure, and the template's raise_exception(M) only a
refusal of that kind carrying M. A refusal of unknown kind (a protocol-1 harness) matches a raise_exception(M)
whose M it carries, or any refusal whose message it repeats exactly (judge/classify.same_refusal_message).
Skipped and no-golden cells are outside the conformance denominator (like web-platform-tests' NOTRUN): counted
and shown, never a pass and never a failure.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Iterable, Mapping, Optional

from conformance.files import ENCODING_ERRORS
from conformance.judge.diff import Divergence


class Status(StrEnum):
    MATCH = "match"
    BOTH_RAISED = "both-raised"                # both refused, with refusals of the same kind
    DIVERGED = "diverged"
    RAISED_DIFFERENTLY = "raised-differently"  # both refused, with refusals of different kinds or messages
    ENGINE_RAISED = "engine-raised"            # the reference rendered
    ENGINE_RENDERED = "engine-rendered"        # the reference refused
    ERRORED = "errored"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    NO_GOLDEN = "no-golden"

    @property
    def passed(self) -> bool:
        return self in PASSING

    @property
    def judged(self) -> bool:
        """Inside the conformance denominator."""
        return self not in NOT_JUDGED


PASSING = frozenset({Status.MATCH, Status.BOTH_RAISED})
NOT_JUDGED = frozenset({Status.SKIPPED, Status.NO_GOLDEN})
# What an engine can get wrong on a cell it ran: the causes an explanation looks for.
NON_MATCHING = frozenset({Status.DIVERGED, Status.RAISED_DIFFERENTLY, Status.ENGINE_RAISED,
                          Status.ENGINE_RENDERED})
# Cells the engine gave no answer for (its runner failed or ran out of time): failures with no difference to
# look for a cause of. An explanation lists them unexplained, with their message, so that it accounts for
# every failing cell: NON_MATCHING | NO_ANSWER is exactly the judged cells that do not pass.
NO_ANSWER = frozenset({Status.ERRORED, Status.TIMEOUT})
STATUSES = tuple(Status)


class Verdict(StrEnum):
    """A cell's status held against the runner's expectations (web-platform-tests style)."""

    EXPECTED_PASS = "expected-pass"
    EXPECTED_FAIL = "expected-fail"      # a known non-match, same status and output (or same root cause)
    UNEXPECTED_FAIL = "unexpected-fail"  # a new non-match: gate failure
    CHANGED = "changed"                  # a known non-match whose status or output changed: gate failure
    UNEXPECTED_PASS = "unexpected-pass"  # news: a known non-match now matches (the baseline is stale)
    NOT_RUN = "not-run"                  # skipped or without a golden: nothing to hold against a baseline

    @property
    def failing(self) -> bool:
        return self in FAILING_VERDICTS


FAILING_VERDICTS = frozenset({Verdict.UNEXPECTED_FAIL, Verdict.CHANGED})
LATER_FIELDS = ("note", "fingerprint", "golden_window", "output_window", "tokens", "cause", "cause_title",
                "cause_repro", "attribution")


@dataclass
class CellResult:
    runner: str
    template_id: str
    case_id: str
    status: Status
    divergence: Optional[Divergence] = None
    message: str = ""          # the engine's refusal, error or skip reason
    detail: str = ""           # stderr tail for errors
    output: Optional[str] = None  # what the engine rendered, when it is not a match
    golden_kind: Optional[str] = None
    refusal: Optional[str] = None           # the engine's refusal kind, when it refused
    reference_refusal: Optional[str] = None  # the reference's, when it refused
    reference_message: Optional[str] = None  # the reference's refusal message, when it refused
    seconds: float = 0.0
    verdict: Optional[Verdict] = None
    expectation: Optional[object] = None     # judge.expectations.Expectation, when the baseline knows the cell
    outcome: Optional[object] = field(default=None, repr=False, compare=False)  # the engine's runners.base.Outcome
    judgement: Optional["Judgement"] = field(default=None, repr=False, compare=False)
    # What later stages add, each written by one stage: judge (note, fingerprint, the two windows), tokens,
    # explain (cause, its title and one-line reproducer), attribute.
    note: Optional[str] = None               # why two refusals differ
    fingerprint: Optional[str] = None        # see fingerprint()
    golden_window: Optional[dict] = None     # the bytes around the first difference, each side
    output_window: Optional[dict] = None
    tokens: Optional[dict] = None            # the token verdict (judge/tokens.py)
    cause: Optional[str] = None              # the root cause id (conformance/explain)
    cause_title: Optional[str] = None
    cause_repro: Optional[str] = None
    attribution: Optional[dict] = None       # where the golden's first differing byte came from

    def __post_init__(self):
        if type(self.status) is not Status:
            self.status = Status(self.status)

    @property
    def passed(self) -> bool:
        return self.status.passed

    @property
    def key(self) -> tuple:
        return (self.template_id, self.case_id)

    @classmethod
    def matched(cls, runner: str, template_id: str, case_id: str, outcome, judgement, seconds: float = 0.0):
        """A rendered match, equal to CellResult(runner, template_id, case_id, Status.MATCH, golden_kind="rendered",
        seconds=seconds, outcome=outcome, judgement=judgement), built from a copy of the defaults: most cells
        are matches, and the generated __init__ with its keywords cost twice as much a cell."""
        result = object.__new__(cls)
        values = _MATCH_DEFAULTS.copy()
        values["runner"], values["template_id"], values["case_id"] = runner, template_id, case_id
        values["outcome"], values["judgement"], values["seconds"] = outcome, judgement, seconds
        result.__dict__ = values
        return result

    def to_dict(self) -> dict:
        data = {"runner": self.runner, "template": self.template_id, "case": self.case_id,
                "status": str(self.status)}
        if self.divergence is not None:
            data["divergence"] = self.divergence.to_dict()
        for name in ("message", "detail", "golden_kind", "refusal", "reference_refusal", "reference_message"):
            if getattr(self, name):
                data[name] = getattr(self, name)
        if self.output is not None:
            data["output"] = self.output
        if self.verdict is not None:
            data["verdict"] = str(self.verdict)
        for name in LATER_FIELDS:
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        return data


def _match_defaults() -> dict:
    values = {}
    for spec in fields(CellResult):
        if spec.default_factory is not MISSING:  # a fresh object per result: a copied default would be shared
            raise TypeError(f"CellResult.{spec.name}: CellResult.matched copies plain defaults only")
        values[spec.name] = None if spec.default is MISSING else spec.default  # the positional ones: set by matched
    values.update(status=Status.MATCH, golden_kind="rendered")
    return values


_MATCH_DEFAULTS = _match_defaults()


@dataclass(frozen=True)
class Judgement:
    status: Status
    divergence: Optional[Divergence] = None
    note: str = ""   # why two refusals differ


def fingerprint(result: CellResult) -> Optional[str]:
    """A short hash of what the engine produced, so a known non-match whose output changes is noticed.

    Errors and timeouts have none: their messages carry timings and process details that vary run to run."""
    if result.status in PASSING or result.status in (Status.ERRORED, Status.TIMEOUT, Status.NO_GOLDEN):
        return None
    if result.output is not None:
        payload = "out:" + result.output
    else:
        payload = "msg:" + (result.message or "")
    return hashlib.sha256(payload.encode("utf-8", ENCODING_ERRORS)).hexdigest()[:16]


def figure(counts: Mapping[str, int]) -> dict:
    """The conformance figure from status counts, the one place it is computed.

    cells: all; judged: cells the engine ran that have a golden; conformance: passed / judged (percent);
    ran: judged / cells (percent), so "ran 96% of cells; 86.2% of those match"."""
    cells = sum(counts.get(s, 0) for s in STATUSES)
    judged = sum(counts.get(s, 0) for s in STATUSES if Status(s).judged)
    passed = sum(counts.get(s, 0) for s in PASSING)
    return {"cells": cells, "judged": judged, "passed": passed,
            "not_run": cells - judged,
            "conformance": round(100.0 * passed / judged, 2) if judged else None,
            "ran": round(100.0 * judged / cells, 2) if cells else None}


def gain_if_fixed(fig: dict, cells: int) -> tuple[Optional[float], float]:
    """(conformance if `cells` more cells passed, points gained) from a figure()."""
    judged, passed = fig["judged"], fig["passed"]
    if not judged:
        return None, 0.0
    after = 100.0 * min(judged, passed + cells) / judged
    return round(after, 2), round(after - 100.0 * passed / judged, 2)


def count_statuses(results: Iterable) -> dict:
    """{status: count} over CellResults (or dicts with a "status"), every status present."""
    counts = {str(s): 0 for s in STATUSES}
    # Tallied by Counter (a C loop) and each status named once: a full gate counts millions of results.
    tally = Counter(result.status if hasattr(result, "status") else result["status"] for result in results)
    for status, n in tally.items():
        counts[str(status)] += n
    return counts


def describe_figure(fig: dict) -> str:
    """"ran 96.0% of 5 cells; 86.2% of those match" (or why there is no figure)."""
    if not fig["cells"]:
        return "no cells"
    if not fig["judged"]:
        return f"none of {fig['cells']} cells ran ({fig['not_run']} skipped or without golden)"
    text = f"{fig['conformance']:.2f}% of {fig['judged']} cells match"
    if fig["not_run"]:
        text = f"ran {fig['ran']:.1f}% of {fig['cells']} cells; " + text.replace(" cells match", " match")
    return text
