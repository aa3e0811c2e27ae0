"""Compare runner outcomes with the goldens: one status per cell."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from runners.base import Errored, Outcome, Raised, Rendered, Skipped

from .diff import Divergence, compare_bytes
from .goldens import ENCODING_ERRORS, Golden, read_golden

MATCH = "match"
DIVERGED = "diverged"
BOTH_RAISED = "both-raised"
ENGINE_RAISED = "engine-raised"
ENGINE_RENDERED = "engine-rendered"
ERRORED = "errored"
TIMEOUT = "timeout"
SKIPPED = "skipped"
NO_GOLDEN = "no-golden"

STATUSES = (MATCH, BOTH_RAISED, DIVERGED, ENGINE_RAISED, ENGINE_RENDERED, ERRORED, TIMEOUT, SKIPPED, NO_GOLDEN)
PASSING = frozenset({MATCH, BOTH_RAISED})


@dataclass
class CellResult:
    runner: str
    template_id: str
    case_id: str
    status: str
    divergence: Optional[Divergence] = None
    message: str = ""          # the engine's refusal / error / skip reason
    detail: str = ""           # stderr tail for errors
    output: Optional[str] = None  # what the engine rendered
    golden_kind: Optional[str] = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)  # attribution and anything a later stage adds

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    @property
    def key(self) -> str:
        return f"{self.template_id}/{self.case_id}"

    def to_dict(self) -> dict:
        data = {"runner": self.runner, "template": self.template_id, "case": self.case_id, "status": self.status}
        if self.divergence is not None:
            data["divergence"] = self.divergence.to_dict()
        for name in ("message", "detail", "golden_kind"):
            if getattr(self, name):
                data[name] = getattr(self, name)
        if self.output is not None:
            data["output"] = self.output
        if self.extra:
            data.update(self.extra)
        return data


def classify(golden: Optional[Golden], outcome: Outcome) -> tuple[str, Optional[Divergence], str]:
    """(status, divergence, message) for one engine outcome against one golden."""
    if isinstance(outcome, Skipped):
        return SKIPPED, None, outcome.reason
    if isinstance(outcome, Errored):
        return (TIMEOUT if outcome.timed_out else ERRORED), None, outcome.message
    if golden is None:
        return NO_GOLDEN, None, ""
    if isinstance(outcome, Raised):
        return (BOTH_RAISED if golden.raised else ENGINE_RAISED), None, outcome.message
    assert isinstance(outcome, Rendered)
    if golden.raised:
        return ENGINE_RENDERED, None, golden.text
    divergence = compare_bytes(golden.data, outcome.text.encode("utf-8", ENCODING_ERRORS))
    return (DIVERGED if divergence else MATCH), divergence, ""


def result_for(runner_name: str, template_id: str, case_id: str, golden: Optional[Golden], outcome: Outcome,
               seconds: float = 0.0) -> CellResult:
    status, divergence, message = classify(golden, outcome)
    return CellResult(
        runner=runner_name, template_id=template_id, case_id=case_id, status=status, divergence=divergence,
        message=message, detail=outcome.detail if isinstance(outcome, Errored) else "",
        output=outcome.text if isinstance(outcome, Rendered) and status != MATCH else None,
        golden_kind=golden.kind if golden else None, seconds=seconds,
    )


def check_cells(runner, cells: list, goldens_root=None,
                progress: Optional[Callable[[int, int], None]] = None, attribute: bool = True,
                outcomes: Optional[Iterable[Outcome]] = None) -> list[CellResult]:
    """Render every cell through the runner and classify it against its golden.

    `outcomes` (one per cell, in order) skips rendering when the caller already has them (the pytest gate).
    Diverged cells get `extra["attribution"]` (see attribute_divergence) unless attribute=False."""
    results = []
    total = len(cells)
    last = time.perf_counter()
    if outcomes is None:
        outcomes = runner.render_many([cell.request for cell in cells])
    name = runner if isinstance(runner, str) else runner.name
    for index, (cell, outcome) in enumerate(zip(cells, outcomes), 1):
        now = time.perf_counter()
        golden = read_golden(cell.template.id, cell.case.id, goldens_root)
        result = result_for(name, cell.template.id, cell.case.id, golden, outcome, now - last)
        result.extra["fingerprint"] = fingerprint(result)
        if attribute and result.status == DIVERGED:
            result.extra["attribution"] = attribute_divergence(cell.request, golden, result.divergence.offset)
        results.append(result)
        last = now
        if progress:
            progress(index, total)
    return results


def fingerprint(result: CellResult) -> Optional[str]:
    """A short hash of what the engine produced, so a known divergence whose output changes is noticed.

    Errors and timeouts have none: their messages carry timings and process details that vary run to run."""
    if result.status in (MATCH, BOTH_RAISED, ERRORED, TIMEOUT, NO_GOLDEN):
        return None
    if result.output is not None:
        payload = "out:" + result.output
    else:
        payload = "msg:" + (result.message or "")
    return hashlib.sha256(payload.encode("utf-8", ENCODING_ERRORS)).hexdigest()[:16]


_ATTRIBUTION_PROBLEM: list = []  # why attribution cannot work at all in this process (import failure)


def attribute_divergence(request, golden: Golden, offset: int) -> dict:
    """Which template line and construct emitted the golden's byte at `offset`.

    Re-renders the golden's cell with the evaluator's byte provenance (render_traced) and looks up the span
    covering the offset. Returns {"line", "construct", "source_line"} or {"unavailable": why}: the
    evaluator's traced output must equal the golden byte for byte, otherwise its spans say nothing about it."""
    try:
        from runners.evaluator import ChatTemplate, origin_at
    except Exception as exc:  # the evaluator is optional for checking; say so instead of guessing
        return {"unavailable": f"attribution unavailable: runners.evaluator cannot be imported ({exc})"}
    try:
        traced = ChatTemplate(request.template).render_traced(
            request.messages, tools=request.tools, documents=request.documents,
            add_generation_prompt=request.add_generation_prompt, bos_token=request.bos_token,
            eos_token=request.eos_token, kwargs=dict(request.kwargs), now=request.now,
            continue_final_message=request.continue_final_message)
    except Exception as exc:
        return {"unavailable": f"attribution unavailable: the evaluator's traced render failed: "
                               f"{type(exc).__name__}: {str(exc)[:200]}"}
    if traced.data != golden.data:
        return {"unavailable": "attribution unavailable: the evaluator's traced render differs from the golden"}
    if offset >= len(golden.data):
        # The engine's output is longer than the golden: the golden ended; blame what emitted its last byte.
        if not golden.data:
            return {"unavailable": "attribution unavailable: the golden is empty (the engine emitted extra bytes)"}
        offset = len(golden.data) - 1
        at_end = True
    else:
        at_end = False
    try:
        span = origin_at(traced.spans, offset)
    except IndexError as exc:
        return {"unavailable": f"attribution unavailable: {exc}"}
    lines = request.template.splitlines()
    source_line = lines[span.lineno - 1] if 0 < span.lineno <= len(lines) else ""
    found = {"line": span.lineno, "construct": span.construct, "source_line": source_line[:400]}
    if at_end:
        found["at_golden_end"] = True
    return found


def summarize(results: Iterable[CellResult]) -> dict:
    counts = {status: 0 for status in STATUSES}
    total = 0
    for result in results:
        counts[result.status] += 1
        total += 1
    passed = counts[MATCH] + counts[BOTH_RAISED]
    return {"cells": total, "passed": passed, "counts": counts,
            "conformance": round(100.0 * passed / total, 2) if total else None}
