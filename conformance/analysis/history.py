"""Conformance history of one engine across versions: what each version introduced and fixed.

Input: one judged run (judge.pipeline.RunnerResults) per version, oldest first, over the same selection. Output
(schema: conformance/schemas/history.schema.json): per version the conformance figure; per pair of consecutive
versions the cells that started or stopped passing, grouped by cause; per template the first version that
renders all its judged cells right, and the version since which it stays right.

A cause is whatever `cause_of(cell)` returns for a cell that does not pass. `chatgold history` uses root
causes by default (conformance/explain: the id of the cell's confirmed minimal reproducer, the same id at
every version the bug shows in; cause_kind "root", with each id's title and reproducer under `causes`). The
cheap alternative is `signature`: the status plus the engine's refusal message with locations and numbers
blanked, or for a diverged cell the smallest edit at the first differing byte (e.g. "'T' -> 't'": the
golden's `True` printed as `true`).
"""
from __future__ import annotations

import difflib
import re
from collections import defaultdict
from typing import Callable, Optional, Sequence

from conformance.files import ENCODING_ERRORS
from conformance.judge.status import NON_MATCHING, Status, figure

FORMAT = 1
EXAMPLES = 5        # cells listed per cause group
EDIT_WINDOW = 48    # characters after the first difference searched for the smallest edit
EDIT_LIMIT = 24     # characters of each side of an edit kept in its signature

_LOCATION = re.compile(r"\s*\(in [^()]*:\d+\)")
_QUOTED = re.compile(r"'[^'\n]{1,80}'|\"[^\"\n]{1,80}\"")
_NUMBER = re.compile(r"\d+")


def normalise_message(message: str) -> str:
    """An engine's message with what varies per template blanked: template locations, quoted names, numbers."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    first = _LOCATION.sub("", first)
    first = _QUOTED.sub("'…'", first)
    return _NUMBER.sub("N", first)[:200]


def smallest_edit(golden: str, output: str) -> tuple[str, str]:
    """(golden part, output part) of the first non-equal opcode of a character diff of two texts that start
    at their first difference."""
    matcher = difflib.SequenceMatcher(None, golden, output, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            return golden[i1:i2][:EDIT_LIMIT], output[j1:j2][:EDIT_LIMIT]
    return golden[:EDIT_LIMIT], output[:EDIT_LIMIT]


def signature(result) -> str:
    """A cause key computable from one judged cell (CellResult) alone."""
    status = Status(result.status)
    if status == Status.DIVERGED:
        golden_after = (result.golden_window or {}).get("after", "")
        output_after = (result.output_window or {}).get("after")
        if output_after is None and result.output is not None and result.divergence is not None:
            data = result.output.encode("utf-8", ENCODING_ERRORS)
            output_after = data[result.divergence.offset:].decode("utf-8", "backslashreplace")
        left, right = smallest_edit(golden_after[:EDIT_WINDOW], (output_after or "")[:EDIT_WINDOW])
        return f"diverged: {left!r} -> {right!r}"
    if status in (Status.ENGINE_RAISED, Status.RAISED_DIFFERENTLY):
        return f"{status}: {result.refusal or 'unknown'}: {normalise_message(result.message)}"
    if status == Status.ENGINE_RENDERED:
        return f"{status}: the reference refused ({result.reference_refusal or 'unknown'})"
    return str(status)


CauseOf = Callable[[object], str]


def _group(cells: list, cause_of: CauseOf, side: int) -> list:
    """[(before, after)] cell pairs grouped by the cause of the side that does not pass."""
    groups: dict = defaultdict(list)
    for pair in cells:
        groups[cause_of(pair[side])].append(pair[side])
    out = []
    for cause, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        out.append({"cause": cause, "cells": len(members), "templates": len({m.template_id for m in members}),
                    "examples": [{"template": m.template_id, "case": m.case_id, "status": str(m.status)}
                                 for m in sorted(members, key=lambda m: (m.template_id, m.case_id))[:EXAMPLES]]})
    return out


def compare(before, after, cause_of: CauseOf = signature) -> dict:
    """What changed between two versions' judged runs (RunnerResults) over the same cells.

    introduced: cells that passed before and do not now, grouped by their cause now; fixed: cells that did not
    pass before and do now, grouped by their cause before; changed: cells that fail on both sides for a
    different cause (grouped by "before => after"). Cells not judged on either side (skipped, no golden) are
    left out: nothing was compared."""
    introduced, fixed, changed = [], [], []
    for key, old in before.by_cell.items():
        new = after.by_cell.get(key)
        if new is None or not (Status(old.status).judged and Status(new.status).judged):
            continue
        if old.passed and not new.passed:
            introduced.append((old, new))
        elif not old.passed and new.passed:
            fixed.append((old, new))
        elif not old.passed and not new.passed:
            was, now = cause_of(old), cause_of(new)
            if was != now:
                changed.append((old, new, f"{was} => {now}"))
    changed_groups: dict = defaultdict(list)
    for old, new, label in changed:
        changed_groups[label].append(new)
    return {
        "introduced": _group(introduced, cause_of, 1),
        "fixed": _group(fixed, cause_of, 0),
        "changed": [{"cause": label, "cells": len(members), "templates": len({m.template_id for m in members}),
                     "examples": [{"template": m.template_id, "case": m.case_id, "status": str(m.status)}
                                  for m in members[:EXAMPLES]]}
                    for label, members in sorted(changed_groups.items(), key=lambda item: (-len(item[1]), item[0]))],
        "cells_introduced": len(introduced), "cells_fixed": len(fixed), "cells_changed": len(changed),
    }


def involved_cells(runs: Sequence, index: int) -> set:
    """The cells of runs[index] that do not pass and that a change involves (as `compare` sees changes): judged
    at a neighbouring version too, and passing there or failing there with another signature. Only those
    need a root cause."""
    wanted = set()
    neighbours = [runs[i] for i in (index - 1, index + 1) if 0 <= i < len(runs)]
    for key, result in runs[index].by_cell.items():
        if result.status not in NON_MATCHING:   # the statuses a root cause explains
            continue
        for other in neighbours:
            twin = other.by_cell.get(key)
            if twin is None or not Status(twin.status).judged:
                continue
            if twin.passed or signature(twin) != signature(result):
                wanted.add(key)
    return wanted


def _template_verdicts(run) -> dict:
    """template id -> True (every judged cell passes), False (one does not), None (nothing judged)."""
    verdicts: dict = {}
    for result in run.results:
        if not Status(result.status).judged:
            verdicts.setdefault(result.template_id, None)
            continue
        so_far = verdicts.get(result.template_id)
        verdicts[result.template_id] = (True if so_far is None else so_far) and result.passed
    return verdicts


def template_history(versions: Sequence[str], runs: Sequence) -> dict:
    """Per template: right/wrong/unjudged per version, the first version that renders it right, and the
    version since which every later one does (None when the latest does not)."""
    per_run = [_template_verdicts(run) for run in runs]
    templates = sorted({t for verdicts in per_run for t in verdicts})
    out = {}
    for template in templates:
        right = [verdicts.get(template) for verdicts in per_run]
        first = next((v for v, ok in zip(versions, right) if ok), None)
        since = None
        for version, ok in reversed(list(zip(versions, right))):
            if not ok:
                break
            since = version
        out[template] = {"right": right, "first_right": first, "right_since": since}
    return out


def build_history(engine: str, versions: Sequence[str], runs: Sequence, cause_of: CauseOf = signature,
                  cause_kind: str = "signature", installs: Optional[Sequence[dict]] = None,
                  causes: Optional[dict] = None) -> dict:
    """The history document of one engine: `runs[i]` is the judged run (RunnerResults) of `versions[i]`,
    oldest first. `installs[i]` (optional) says what installing that version cost; `causes` (root causes
    only) maps each cause id to its title, constructs, reproducer template and the versions it was found at."""
    if len(versions) != len(runs) or not runs:
        raise ValueError("history: one judged run per version is needed")
    rows = []
    for index, (version, run) in enumerate(zip(versions, runs)):
        counts = run.counts()
        row = {"version": version, "runner": run.info, "counts": counts, "figure": figure(counts)}
        if installs and installs[index]:
            row["install"] = installs[index]
        rows.append(row)
    changes = []
    for (v1, r1), (v2, r2) in zip(zip(versions, runs), zip(versions[1:], runs[1:])):
        changes.append({"from": v1, "to": v2, **compare(r1, r2, cause_of)})
    templates = template_history(versions, runs)
    right_latest = sum(1 for t in templates.values() if t["right"][-1])
    summary = {
        "templates": len(templates),
        "right_per_version": [sum(1 for t in templates.values() if t["right"][i]) for i in range(len(versions))],
        "right_in_latest": right_latest,
        "never_right": sum(1 for t in templates.values() if t["first_right"] is None),
        "regressed": sorted(t for t, row in templates.items() if row["first_right"] and not row["right"][-1]),
    }
    history = {"format": FORMAT, "engine": engine, "cause_kind": cause_kind, "versions": rows, "changes": changes,
               "templates": templates, "summary": summary}
    if causes is not None:
        history["causes"] = causes
    return history


def cause_label(history: dict, cause: str) -> str:
    """A cause key as people read it: a root cause's id with its title."""
    known = (history.get("causes") or {}).get(cause)
    return f"{cause} {known['title']}" if known else cause


def history_lines(history: dict, causes: int = 3) -> list:
    """A terminal summary: one line per version, then the top causes each change introduced and fixed."""
    lines = [f"{history['engine']}: conformance per version ({history['summary']['templates']} templates)"]
    right = history["summary"]["right_per_version"]
    for row, templates_right in zip(history["versions"], right):
        fig = row["figure"]
        pct = "n/a" if fig["conformance"] is None else f"{fig['conformance']:.2f}%"
        lines.append(f"  {row['version']:>12}  {pct:>7} of {fig['judged']} judged cells; "
                     f"{templates_right} templates fully right")
    for change in history["changes"]:
        lines.append(f"  {change['from']} -> {change['to']}: {change['cells_introduced']} cells newly failing, "
                     f"{change['cells_fixed']} fixed, {change['cells_changed']} failing differently")
        for label, key in (("introduced", "introduced"), ("fixed", "fixed")):
            for group in change[key][:causes]:
                lines.append(f"      {label}: {group['cells']} cells / {group['templates']} templates  "
                             f"{cause_label(history, group['cause'])}")
    return lines
