"""One cell's status against its golden, and the conformance figure: the judge's vocabulary, defined once.

A status says what happened in a cell; a verdict (judge/expectations.py) says whether that was expected.
Two refusals match only when they are of the same kind (runners.base.RefusalKind): a compile failure
matches a compile failure, a render failure a render failure, and the template's raise_exception(M) only a
refusal of that kind carrying M. A refusal of unknown kind (a protocol-1 harness) matches a raise_exception(M)
whose M it carries, or any refusal whose message it repeats exactly (same_refusal_message). Skipped and
no-golden cells are outside the conformance denominator (like web-platform-tests' NOTRUN): counted and shown,
never a pass and never a failure.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Iterable, Mapping, Optional

from conformance.judge.diff import Divergence, compare_bytes
from conformance.judge.goldens import ENCODING_ERRORS, Golden
from runners.base import Errored, Outcome, Raised, RefusalKind, Rendered, Skipped
from runners.hf import reference_refusal


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
    extra: dict = field(default_factory=dict)  # fingerprint, root cause, attribution: what later stages add

    def __post_init__(self):
        if type(self.status) is not Status:
            self.status = Status(self.status)

    @property
    def passed(self) -> bool:
        return self.status.passed

    @property
    def key(self) -> tuple:
        return (self.template_id, self.case_id)

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
        data.update(self.extra)
        return data


@dataclass(frozen=True)
class Judgement:
    status: Status
    divergence: Optional[Divergence] = None
    note: str = ""   # why two refusals differ


def same_refusal_message(reference: str, message: str) -> bool:
    """Whether a refusal message without a kind (protocol 1) is the reference's refusal (as goldens store it,
    "<ExceptionType>: <message>") said again: byte for byte, or byte for byte without the "<ExceptionType>: "
    prefix (an engine that reports the exception's message alone). Nothing is normalised (no whitespace,
    locations or digits), and an empty message vouches for nothing."""
    if not message:
        return False
    if message == reference:
        return True
    type_name, sep, bare = reference.partition(": ")
    return bool(sep and type_name.isidentifier() and bare and message == bare)


def judge_refusal(golden: Golden, outcome: Raised) -> Judgement:
    """Two refusals: the same kind (and, for raise_exception, the template's message) or not."""
    ref_kind, ref_message = reference_refusal(golden.text)
    kind = outcome.refusal
    if kind == RefusalKind.UNKNOWN:
        # A protocol-1 harness does not say which kind; only the message can vouch for it: the template's own
        # raise_exception message, or the reference's whole refusal said again exactly.
        if ref_kind == RefusalKind.RAISE and ref_message and ref_message in outcome.message:
            return Judgement(Status.BOTH_RAISED)
        if same_refusal_message(golden.text, outcome.message):
            return Judgement(Status.BOTH_RAISED)
        return Judgement(Status.RAISED_DIFFERENTLY,
                         note=f"the reference's refusal is of kind {ref_kind}; the harness did not say which kind "
                              f"its refusal is (protocol version 1), and its message is not the reference's")
    if kind != ref_kind:
        return Judgement(Status.RAISED_DIFFERENTLY,
                         note=f"the reference's refusal is of kind {ref_kind}, the engine's of kind {kind}")
    if kind == RefusalKind.RAISE and ref_message not in outcome.message:
        return Judgement(Status.RAISED_DIFFERENTLY,
                         note="both called raise_exception, but the engine's message lacks the template's")
    return Judgement(Status.BOTH_RAISED)


def classify(golden: Optional[Golden], outcome: Outcome) -> Judgement:
    """One engine outcome against one golden."""
    if isinstance(outcome, Skipped):
        return Judgement(Status.SKIPPED)
    if isinstance(outcome, Errored):
        return Judgement(Status.TIMEOUT if outcome.timed_out else Status.ERRORED)
    if golden is None:
        return Judgement(Status.NO_GOLDEN)
    if isinstance(outcome, Raised):
        return judge_refusal(golden, outcome) if golden.raised else Judgement(Status.ENGINE_RAISED)
    assert isinstance(outcome, Rendered)
    if golden.raised:
        return Judgement(Status.ENGINE_RENDERED)
    divergence = compare_bytes(golden.data, outcome.text.encode("utf-8", ENCODING_ERRORS))
    return Judgement(Status.DIVERGED if divergence else Status.MATCH, divergence)


def result_for(runner_name: str, template_id: str, case_id: str, golden: Optional[Golden], outcome: Outcome,
               seconds: float = 0.0) -> CellResult:
    if type(outcome) is Rendered and golden is not None and golden.kind == "rendered" \
            and outcome.text.encode("utf-8", ENCODING_ERRORS) == golden.data:
        # Most cells: a match has no divergence, message, output or fingerprint (what the general path gives).
        return CellResult(runner_name, template_id, case_id, Status.MATCH, golden_kind="rendered", seconds=seconds)
    judgement = classify(golden, outcome)
    status = judgement.status
    result = CellResult(
        runner=runner_name, template_id=template_id, case_id=case_id, status=status,
        divergence=judgement.divergence, message=getattr(outcome, "message", "") or "",
        detail=outcome.detail if isinstance(outcome, Errored) else "",
        output=outcome.text if isinstance(outcome, Rendered) and status != Status.MATCH else None,
        golden_kind=golden.kind if golden else None, seconds=seconds,
        refusal=str(outcome.refusal) if isinstance(outcome, Raised) else None,
    )
    if golden is not None and golden.raised and status != Status.MATCH:
        kind, _ = reference_refusal(golden.text)
        result.reference_refusal = str(kind)
        result.reference_message = golden.text
    if judgement.note:
        result.extra["note"] = judgement.note
    fp = fingerprint(result)
    if fp:
        result.extra["fingerprint"] = fp
    return result


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
    for result in results:
        status = result.status if hasattr(result, "status") else result["status"]
        counts[str(status)] += 1
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
