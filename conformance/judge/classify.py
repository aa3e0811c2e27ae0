"""The judge: one engine outcome held against one golden, giving a cell's status (judge/status.py's vocabulary).

Apart from status.py so that what reads results (reports, history) needs no runner module."""
from __future__ import annotations

from typing import Optional

from conformance.files import ENCODING_ERRORS
from conformance.judge.diff import compare_bytes
from conformance.judge.goldens import Golden
from conformance.judge.status import CellResult, Judgement, Status, fingerprint
from runners.base import Errored, Outcome, Raised, RefusalKind, Rendered, Skipped


MATCHED = Judgement(Status.MATCH)


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
    ref_kind, _, ref_message = golden.refusal
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
            and golden.matches_text(outcome.text):
        # Most cells: a match has no divergence, message, output or fingerprint (what the general path gives).
        return CellResult.matched(runner_name, template_id, case_id, outcome, MATCHED, seconds)
    judgement = classify(golden, outcome)
    status = judgement.status
    result = CellResult(
        runner=runner_name, template_id=template_id, case_id=case_id, status=status,
        divergence=judgement.divergence, message=getattr(outcome, "message", "") or "",
        detail=outcome.detail if isinstance(outcome, Errored) else "",
        output=outcome.text if isinstance(outcome, Rendered) and status != Status.MATCH else None,
        golden_kind=golden.kind if golden else None, seconds=seconds,
        refusal=str(outcome.refusal) if isinstance(outcome, Raised) else None,
        outcome=outcome, judgement=judgement,
    )
    if golden is not None and golden.raised and status != Status.MATCH:
        result.reference_refusal = str(golden.refusal.kind)
        result.reference_message = golden.text
    if judgement.note:
        result.note = judgement.note
    fp = fingerprint(result)
    if fp:
        result.fingerprint = fp
    return result
