"""`chatgold expectations merge`: one baseline from the baselines N machines recorded, each over one shard.

A shard recording (`chatgold expectations update --shard I/N`) rewrites the cells of its own templates
(judge.pipeline.shard_of) and keeps the rest of the file as it was. The merge takes each template's cells from
the recording of the shard that owns it, and each cause they name once: causes are deduplicated by id (one
mechanism found on several machines is one cause), reported with the smallest reproducer any shard confirmed
for it (the one a single recording would keep: causes.confirm_causes tries the smallest first), with every
hand-written reason any shard carried for it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from conformance.judge.expectations import (
    Expectations,
    ExpectationsError,
    KnownCause,
    _parse,
    expectations_path,
    parse_value,
    write_expectations,
)


def load_part(path: Path, runner_name: str) -> Expectations:
    """One shard's baseline file (a folder holding `<runner>.json`, or the file)."""
    path = Path(path)
    if path.is_dir():
        path = expectations_path(runner_name, path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExpectationsError(f"{path}: not a readable baseline: {exc}") from None
    part = _parse(data, path, runner_name)
    if part.runner != runner_name:
        raise ExpectationsError(f"{path}: a baseline of {part.runner}, not of {runner_name}")
    return part


def _repro_size(cause: KnownCause) -> tuple:
    """A reproducer's size as causes._size measures a Found: template lines, messages, template length, data."""
    from conformance.explain.template import lines_of

    repro = cause.repro or {}
    template, case = repro.get("template") or "", repro.get("case") or {}
    return (lines_of(template), len(case.get("messages") or []), len(template),
            len(json.dumps(case, sort_keys=True)))


def _one_cause(records: list) -> KnownCause:
    """One cause from the records shards gave for its id: the smallest reproducer (its title and symptom with
    it), every distinct reason kept, the first link."""
    chosen = min(records, key=_repro_size)
    reasons: list = []
    for record in [chosen] + records:
        text = (record.reason or "").strip()
        if text and text not in reasons:
            reasons.append(text)
    link = chosen.link or next((r.link for r in records if r.link), "")
    return KnownCause(chosen.id, chosen.title, "\n\n".join(reasons), link, list(chosen.constructs), chosen.symptom,
                      chosen.repro)


def merge_expectations(runner_name: str, parts: list, directory: Optional[Path] = None) -> tuple:
    """parts: [(shard index I, shard count N, Expectations)], one per shard of the same N. Returns the merged
    baseline (written to `directory`) and counts."""
    from conformance.judge.pipeline import shard_of

    counts = {count for _, count, _ in parts}
    if len(counts) != 1:
        raise ExpectationsError("the shards to merge must be of one split (the same N in every I/N)")
    total = counts.pop()
    given = sorted(index for index, _, _ in parts)
    if given != list(range(1, total + 1)):
        missing = sorted(set(range(1, total + 1)) - set(given))
        twice = sorted({i for i in given if given.count(i) > 1})
        raise ExpectationsError(f"merging {total} shards needs each of 1..{total} once"
                                + (f"; missing: {', '.join(map(str, missing))}" if missing else "")
                                + (f"; given twice: {', '.join(map(str, twice))}" if twice else ""))
    cells: dict = {}
    records: dict = {}     # cause id -> [distinct KnownCause records the shards naming it gave]
    named_by: dict = {}    # cause id -> the shards naming it
    status_reasons: dict = {}
    rules: list = []
    for index, _, part in sorted(parts, key=lambda p: p[0]):
        for status, reason in part.status_reasons.items():
            status_reasons.setdefault(status, reason)
        for rule in part.rules:
            if rule not in rules:
                rules.append(rule)
        for template_id, cases in part.cells.items():
            if shard_of(template_id, total) != index - 1:
                continue  # another shard's template: that shard's recording is the one to keep
            cells[template_id] = dict(cases)
            for value in cases.values():
                cause = parse_value(value)[2]
                if cause is None:
                    continue
                named_by.setdefault(cause, set()).add(index)
                if part.causes[cause] not in records.setdefault(cause, []):
                    records[cause].append(part.causes[cause])
    causes = {cause_id: _one_cause(found) for cause_id, found in sorted(records.items())}
    merged = Expectations(runner_name, dict(sorted(cells.items())), rules, expectations_path(runner_name, directory),
                          causes, dict(sorted(status_reasons.items())))
    write_expectations(merged)
    return merged, {"shards": total, "templates": len(cells), "cells": len(merged), "causes": len(causes),
                    "found_in_several": sum(1 for shards in named_by.values() if len(shards) > 1),
                    "causes_without_reason": sum(1 for c in causes.values() if not c.reason)}
