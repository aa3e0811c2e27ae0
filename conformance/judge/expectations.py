"""Expected divergences per engine (web-platform-tests style baselines).

`conformance/expectations/<runner>.json` lists the cells an engine is known not to match, grouped by
template, each as "status" or "status:fingerprint" (the fingerprint hashes the engine's output or message,
so a known divergence whose output changes is noticed). Reasons live in `rules`: the first rule whose
template/case/status globs match a cell explains it. The reference (hf) and the evaluator have no file:
they must match every golden.

    {"format": 1, "runner": "minijinja",
     "rules": [{"template": "*", "case": "*", "status": "engine-raised", "reason": "...", "link": "..."}],
     "cells": {"<template>": {"<case>": "diverged:0123456789abcdef", "<case2>": "engine-raised:..."}}}
"""
from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from conformance import PACKAGE_DIR
from conformance.judge.status import PASSING, STATUSES, CellResult, Verdict

EXPECTATIONS_DIR = PACKAGE_DIR / "expectations"
# Tests and experiments point the gate at another baseline directory without touching the committed one.
EXPECTATIONS_DIR_ENV = "CHATGOLD_EXPECTATIONS_DIR"
FORMAT = 1
# A template's "*" entry covers every case not listed: written only when every case of the template is a
# known non-match (an engine that skips or refuses a whole template), which keeps such baselines tiny.
TEMPLATE_DEFAULT = "*"
# Engines that must match everything: no baseline may excuse them.
STRICT_RUNNERS = frozenset({"hf", "evaluator"})

class ExpectationsError(ValueError):
    """A malformed expectations file (the message names the file and the problem)."""


@dataclass
class Expectation:
    status: str
    fingerprint: Optional[str]
    reason: str = ""
    link: str = ""


@dataclass
class Expectations:
    runner: str
    cells: dict = field(default_factory=dict)   # template -> case -> "status[:fingerprint]"
    rules: list = field(default_factory=list)
    path: Optional[Path] = None

    def get(self, template_id: str, case_id: str) -> Optional[Expectation]:
        cases = self.cells.get(template_id, {})
        value = cases.get(case_id, cases.get(TEMPLATE_DEFAULT))
        if value is None:
            return None
        status, _, fp = value.partition(":")
        reason, link = self.reason_for(template_id, case_id, status)
        return Expectation(status, fp or None, reason, link)

    def reason_for(self, template_id: str, case_id: str, status: str) -> tuple[str, str]:
        for rule in self.rules:
            if (fnmatch.fnmatchcase(template_id, rule.get("template", "*"))
                    and fnmatch.fnmatchcase(case_id, rule.get("case", "*"))
                    and fnmatch.fnmatchcase(status, rule.get("status", "*"))):
                return rule.get("reason", ""), rule.get("link", "")
        return "", ""

    def __len__(self) -> int:
        return sum(len(cases) for cases in self.cells.values())

    def expanded(self, case_ids: Iterable[str]) -> dict:
        """cells with every "*" default spelled out over `case_ids`."""
        out = {}
        for template_id, cases in self.cells.items():
            default = cases.get(TEMPLATE_DEFAULT)
            explicit = {c: v for c, v in cases.items() if c != TEMPLATE_DEFAULT}
            if default is not None:
                explicit = {**{c: default for c in case_ids}, **explicit}
            out[template_id] = explicit
        return out


def runner_file_name(runner_name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in runner_name)
    return f"{safe}.json"


def expectations_path(runner_name: str, directory: Optional[Path] = None) -> Path:
    return Path(directory or os.environ.get(EXPECTATIONS_DIR_ENV) or EXPECTATIONS_DIR) / runner_file_name(runner_name)


def load_expectations(runner_name: str, directory: Optional[Path] = None) -> Expectations:
    """The runner's baseline; an empty one when there is no file (everything must then match)."""
    path = expectations_path(runner_name, directory)
    if runner_name in STRICT_RUNNERS:
        if path.exists():
            raise ExpectationsError(f"{path}: {runner_name} must match every golden; it may not have expectations")
        return Expectations(runner_name, path=path)
    if not path.exists():
        return Expectations(runner_name, path=path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExpectationsError(f"{path}: not readable JSON: {exc}") from None
    return _parse(data, path, runner_name)


def _parse(data, path: Path, runner_name: str) -> Expectations:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ExpectationsError(f"{path}: expected an object with \"format\": {FORMAT}")
    cells, rules = data.get("cells", {}), data.get("rules", [])
    if not isinstance(cells, dict) or not isinstance(rules, list):
        raise ExpectationsError(f"{path}: \"cells\" must be an object and \"rules\" a list")
    for rule in rules:
        if not isinstance(rule, dict) or not isinstance(rule.get("reason", ""), str):
            raise ExpectationsError(f"{path}: every rule must be an object with a string \"reason\": {rule!r}")
    for template_id, cases in cells.items():
        if not isinstance(cases, dict):
            raise ExpectationsError(f"{path}: cells[{template_id!r}] must map case ids to \"status[:fingerprint]\"")
        for case_id, value in cases.items():
            if not isinstance(case_id, str):
                raise ExpectationsError(f"{path}: cells[{template_id!r}]: case ids must be strings")
            status = value.partition(":")[0] if isinstance(value, str) else None
            if status not in STATUSES or status in PASSING:
                raise ExpectationsError(f"{path}: cells[{template_id!r}][{case_id!r}] = {value!r}: status must be "
                                        f"one of {', '.join(s for s in STATUSES if s not in PASSING)}")
    return Expectations(data.get("runner", runner_name), cells, rules, path)


def verdict(result: CellResult, expectation: Optional[Expectation]) -> Verdict:
    if not result.status.judged:
        return Verdict.NOT_RUN  # skipped or without a golden: counted and shown, never a pass or a failure
    if result.passed:
        return Verdict.UNEXPECTED_PASS if expectation else Verdict.EXPECTED_PASS
    if expectation is None:
        return Verdict.UNEXPECTED_FAIL
    if expectation.status != result.status:
        return Verdict.CHANGED
    current = result.extra.get("fingerprint")
    if expectation.fingerprint and current and expectation.fingerprint != current:
        return Verdict.CHANGED
    return Verdict.EXPECTED_FAIL


def describe_cell(result: CellResult) -> str:
    """A readable account of a cell that is not as expected (its verdict and expectation are on it)."""
    expectation, verdict_name = result.expectation, result.verdict
    lines = [f"{result.runner} {result.template_id} x {result.case_id}: {result.status}"]
    if verdict_name == Verdict.UNEXPECTED_FAIL:
        lines[0] += " (not in the expectations: a new divergence)"
    elif verdict_name == Verdict.CHANGED:
        if expectation.status != result.status:
            lines[0] += f" (expected {expectation.status})"
        else:
            lines[0] += (f" (expected {expectation.status} with fingerprint {expectation.fingerprint}, "
                         f"got {result.extra.get('fingerprint')}: the output changed)")
    elif verdict_name == Verdict.UNEXPECTED_PASS:
        lines[0] += f" (expected {expectation.status}: now passes; update the baseline)"
    if result.divergence is not None:
        lines.append(result.divergence.describe())
    if result.message:
        lines.append(f"  engine: {result.message[:500]}" + (f" [{result.refusal}]" if result.refusal else ""))
    if result.reference_message:
        lines.append(f"  reference: {result.reference_message[:500]} [{result.reference_refusal}]")
    if result.extra.get("note"):
        lines.append(f"  {result.extra['note']}")
    attribution = result.extra.get("attribution")
    if attribution:
        if "line" in attribution:
            lines.append(f"  golden byte emitted by template line {attribution['line']} ({attribution['construct']}): "
                         f"{attribution['source_line'].strip()[:200]}")
        else:
            lines.append(f"  {attribution.get('unavailable')}")
    if expectation is not None and expectation.reason:
        lines.append(f"  expectation's reason: {expectation.reason}"
                     + (f" ({expectation.link})" if expectation.link else ""))
    return "\n".join(lines)


DEFAULT_REASONS = {
    "diverged": "renders different bytes from the reference",
    "engine-raised": "the engine refuses a cell the reference renders",
    "engine-rendered": "the engine renders a cell the reference refuses",
    "raised-differently": "both refuse, but with refusals of different kinds or messages",
    "errored": "the runner fails on this cell",
    "timeout": "the runner times out on this cell",
    "skipped": "the runner declines this cell on purpose (see its skip reason)",
    "no-golden": "no golden exists for this cell",
}


def update_expectations(runner_name: str, results: Iterable[CellResult], selected: Optional[set] = None,
                        directory: Optional[Path] = None) -> tuple[Expectations, dict]:
    """Rewrite the baseline from fresh results. With `selected` ((template, case) pairs), only those cells
    change; the rest of the file is kept. Rules are kept; a generic rule per status is added when none
    explains it. Returns the new baseline and counts of added/removed/changed cells."""
    if runner_name in STRICT_RUNNERS:
        raise ExpectationsError(f"{runner_name} must match every golden; it has no expectations to update")
    from conformance.corpus.cases import load_cases

    case_ids = [c.id for c in load_cases()]
    old = load_expectations(runner_name, directory)
    old_cells = old.expanded(case_ids)
    cells = {} if selected is None else {t: dict(c) for t, c in old_cells.items()}
    if selected is not None:
        for template_id, case_id in selected:
            cells.get(template_id, {}).pop(case_id, None)
    for result in results:
        if result.passed or not result.status.judged:
            continue
        fp = result.extra.get("fingerprint")
        cells.setdefault(result.template_id, {})[result.case_id] = result.status + (f":{fp}" if fp else "")
    cells = {t: dict(sorted(c.items())) for t, c in sorted(cells.items()) if c}
    before = {(t, c): v for t, cs in old_cells.items() for c, v in cs.items()}
    after = {(t, c): v for t, cs in cells.items() for c, v in cs.items()}
    cells = compact_cells(cells, case_ids)
    rules = list(old.rules)
    used = {v.partition(":")[0] for c in cells.values() for v in c.values()}
    for status in sorted(used):
        if not any(fnmatch.fnmatchcase(status, r.get("status", "*")) for r in rules):
            rules.append({"template": "*", "case": "*", "status": status,
                          "reason": f"{DEFAULT_REASONS[status]} (recorded by `chatgold expectations update`)"})
    new = Expectations(runner_name, cells, rules, expectations_path(runner_name, directory))
    counts = {"added": len(after.keys() - before.keys()), "removed": len(before.keys() - after.keys()),
              "changed": sum(1 for k in after.keys() & before.keys() if after[k] != before[k]), "total": len(after)}
    write_expectations(new)
    return new, counts


def compact_cells(cells: dict, case_ids: list) -> dict:
    """Replace a template's most common value by a "*" default when every case of it is listed."""
    from collections import Counter

    out = {}
    wanted = set(case_ids)
    for template_id, cases in cells.items():
        if wanted and wanted <= cases.keys() and len(cases) > 1:
            value, count = Counter(cases[c] for c in wanted).most_common(1)[0]
            if count > 1:
                cases = {TEMPLATE_DEFAULT: value, **{c: v for c, v in cases.items() if c not in wanted or v != value}}
        out[template_id] = cases
    return out


def write_expectations(expectations: Expectations) -> Path:
    """One template per line: compact, and diffs stay readable."""
    from conformance.judge.goldens import atomic_write

    path = expectations.path or expectations_path(expectations.runner)
    path.parent.mkdir(parents=True, exist_ok=True)
    dump = lambda value: json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    parts = ['{"format": %d,' % FORMAT, ' "runner": %s,' % dump(expectations.runner), ' "rules": [']
    parts.append(",\n".join("  " + dump(rule) for rule in expectations.rules))
    parts.append(' ],\n "cells": {')
    parts.append(",\n".join(f"  {dump(t)}: {dump(c)}" for t, c in sorted(expectations.cells.items())))
    parts.append(" }\n}\n")
    atomic_write(path, "\n".join(parts).encode("utf-8"))
    path.chmod(0o644)  # mkstemp creates 0600; the baseline is an ordinary committed file
    return path
