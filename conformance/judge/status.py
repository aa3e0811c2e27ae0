"""Compare runner outcomes with the goldens: one status per cell."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from runners.base import Errored, Outcome, Raised, Rendered, Skipped

from conformance.judge.attribution import attribute_results
from conformance.judge.diff import Divergence, compare_bytes
from conformance.judge.goldens import ENCODING_ERRORS, Golden, read_golden

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
                outcomes: Optional[Iterable[Outcome]] = None,
                goldens: Optional[Callable[[str, str], Optional[Golden]]] = None) -> list[CellResult]:
    """Render every cell through the runner and classify it against its golden.

    `outcomes` (one per cell, in order) skips rendering when the caller already has them (the pytest gate).
    `goldens(template_id, case_id)` reads goldens (default: from `goldens_root`; the gate passes a shared cache).
    Diverged cells get `extra["attribution"]` (see attribute_results) unless attribute=False."""
    read = goldens or (lambda template_id, case_id: read_golden(template_id, case_id, goldens_root))
    results = []
    pending = []
    total = len(cells)
    last = time.perf_counter()
    if outcomes is None:
        outcomes = runner.render_many([cell.request for cell in cells])
    name = runner if isinstance(runner, str) else runner.name
    for index, (cell, outcome) in enumerate(zip(cells, outcomes), 1):
        now = time.perf_counter()
        golden = read(cell.template.id, cell.case.id)
        result = result_for(name, cell.template.id, cell.case.id, golden, outcome, now - last)
        result.extra["fingerprint"] = fingerprint(result)
        if result.status == DIVERGED:
            pending.append((result, cell.request, golden))
        results.append(result)
        last = now
        if progress:
            progress(index, total)
    if attribute:
        attribute_results(pending)
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


def summarize(results: Iterable[CellResult]) -> dict:
    counts = {status: 0 for status in STATUSES}
    total = 0
    for result in results:
        counts[result.status] += 1
        total += 1
    passed = counts[MATCH] + counts[BOTH_RAISED]
    return {"cells": total, "passed": passed, "counts": counts,
            "conformance": round(100.0 * passed / total, 2) if total else None}
