"""Expected divergences per engine (web-platform-tests style baselines), by root cause.

`conformance/expectations/<runner>.json` lists the cells an engine is known not to match, grouped by
template, each as "status", "status:fingerprint" or "status:fingerprint@cause" (the fingerprint hashes the
engine's output or message, so a known divergence whose output changes is noticed; the cause is the id of a
root cause found by `chatgold explain`). Known root causes are recorded once each, with their minimal
reproducer, a reason written once per cause and an optional link to the engine's upstream issue. The
reference (hf) and the evaluator have no file: they must match every golden.

    {"format": 2, "runner": "minijinja",
     "causes": [{"id": "c-9ca88f1462", "title": "...", "reason": "...", "link": "...", "constructs": [...],
                 "symptom": {...}, "repro": {"template": "...", "case": {...}, "bos_token": null, ...}}],
     "status_reasons": {"skipped": "..."},
     "cells": {"<template>": {"<case>": "diverged:0123456789abcdef@c-9ca88f1462", "*": "skipped:..."}}}

Verdicts: a cell whose status and fingerprint are in the baseline is known without explaining (the fast
path); a new or changed cell whose explained cause is a known cause is known too; otherwise it is news. A
known cause whose reproducer no longer differs is news as well: an unexpected pass (conformance/explain/
baseline.py checks). Format 1 files (per-status reason rules, no causes) are still read; `chatgold
expectations update` writes format 2, carrying reasons and links forward by cause id.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import marshal
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from conformance import PACKAGE_DIR
from conformance.files import ENCODING_ERRORS, atomic_write
from conformance.judge import status as _status_module
from conformance.judge.status import NON_MATCHING, PASSING, STATUSES, CellResult, Verdict

EXPECTATIONS_DIR = PACKAGE_DIR / "expectations"
# Tests and experiments point the gate at another baseline directory without touching the committed one.
EXPECTATIONS_DIR_ENV = "CHATGOLD_EXPECTATIONS_DIR"
FORMAT = 2
READABLE_FORMATS = (1, 2)
# A template's "*" entry covers every case not listed: written only when every case of the template is a
# known non-match (an engine that skips or refuses a whole template), which keeps such baselines tiny.
TEMPLATE_DEFAULT = "*"
# Engines that must match everything: no baseline may excuse them.
STRICT_RUNNERS = frozenset({"hf", "evaluator"})
# A checked baseline's parsed record holds while its checks (this module, the statuses they allow) and the
# marshal format are the same.
MAX_RECORDS = 64
_RECORD_SALT = hashlib.sha256(Path(__file__).read_bytes() + Path(_status_module.__file__).read_bytes()
                              + f"{marshal.version} {sys.version_info[:2]}".encode()).digest()


class ExpectationsError(ValueError):
    """A malformed expectations file (the message names the file and the problem)."""


@dataclass
class Expectation:
    status: str
    fingerprint: Optional[str]
    reason: str = ""
    link: str = ""
    cause: Optional[str] = None
    # When a cell is held against its explained cause instead of the entry the baseline has for it: the cause
    # that entry named ({"id", "title"}), so the report can say the cell moved from one cause to another.
    recorded_cause: Optional[dict] = None


@dataclass
class KnownCause:
    """A root cause the baseline knows: its id, a reason written once, an optional upstream link, and the
    minimal reproducer (template, case, special tokens) with the symptom it showed."""

    id: str
    title: str = ""
    reason: str = ""
    link: str = ""
    constructs: list = field(default_factory=list)
    symptom: Optional[dict] = None
    repro: Optional[dict] = None

    def to_dict(self) -> dict:
        data = {"id": self.id, "title": self.title, "reason": self.reason}
        if self.link:
            data["link"] = self.link
        data["constructs"] = list(self.constructs)
        if self.symptom is not None:
            data["symptom"] = self.symptom
        if self.repro is not None:
            data["repro"] = self.repro
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "KnownCause":
        return cls(data["id"], data.get("title", ""), data.get("reason", ""), data.get("link", ""),
                   list(data.get("constructs", [])), data.get("symptom"), data.get("repro"))


def parse_value(value: str) -> tuple[str, Optional[str], Optional[str]]:
    """"status[:fingerprint][@cause]" -> (status, fingerprint, cause)."""
    value, _, cause = value.partition("@")
    status, _, fp = value.partition(":")
    return status, fp or None, cause or None


@dataclass
class Expectations:
    runner: str
    cells: dict = field(default_factory=dict)   # template -> case -> "status[:fingerprint][@cause]"
    rules: list = field(default_factory=list)   # format 1 only: per-status reason rules
    path: Optional[Path] = None
    causes: dict = field(default_factory=dict)  # cause id -> KnownCause
    status_reasons: dict = field(default_factory=dict)  # status -> reason, for cells without a cause

    def get(self, template_id: str, case_id: str) -> Optional[Expectation]:
        cases = self.cells.get(template_id, {})
        value = cases.get(case_id, cases.get(TEMPLATE_DEFAULT))
        if value is None:
            return None
        status, fp, cause = parse_value(value)
        known = self.causes.get(cause) if cause else None
        if known is not None:
            return Expectation(status, fp, known.reason or known.title, known.link, cause)
        reason, link = self.reason_for(template_id, case_id, status)
        return Expectation(status, fp, reason, link, cause)

    def for_cause(self, cause_id: str, status: str) -> Optional[Expectation]:
        """The expectation a cell not in the baseline gets when its explained cause is a known one."""
        known = self.causes.get(cause_id)
        if known is None:
            return None
        return Expectation(status, None, known.reason or known.title, known.link, cause_id)

    def reason_for(self, template_id: str, case_id: str, status: str) -> tuple[str, str]:
        """The reason of a cell without a known cause: the first matching rule, else the status's reason."""
        for rule in self.rules:
            if (_glob_match(template_id, rule.get("template", "*")) and _glob_match(case_id, rule.get("case", "*"))
                    and _glob_match(status, rule.get("status", "*"))):
                return rule.get("reason", ""), rule.get("link", "")
        return self.status_reasons.get(status, ""), ""

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


_GLOB_MATCHES: dict = {}


def _glob_match(name: str, pattern: str) -> bool:
    """fnmatchcase, remembered: a run asks the same few rules about the same ids for every known cell."""
    if pattern == "*":
        return True
    key = (name, pattern)
    found = _GLOB_MATCHES.get(key)
    if found is None:
        if len(_GLOB_MATCHES) > 200_000:
            _GLOB_MATCHES.clear()
        found = _GLOB_MATCHES[key] = fnmatch.fnmatchcase(name, pattern)
    return found


def runner_file_name(runner_name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in runner_name)
    return f"{safe}.json"


# An engine author's baselines, when no directory is given: a folder in the current directory (their repository).
AUTHOR_DIR = "chatgold-expectations"


def chosen_directory(directory=None) -> Optional[Path]:
    """The directory the user chose (--expectations, else $CHATGOLD_EXPECTATIONS_DIR), or None."""
    chosen = directory or os.environ.get(EXPECTATIONS_DIR_ENV)
    return Path(chosen) if chosen else None


def is_suite_directory(directory: Path) -> bool:
    return Path(directory).resolve() == EXPECTATIONS_DIR.resolve()


def baseline_directory(suite_runner: bool, directory=None) -> Path:
    """Where a runner's baseline is read from. A runner the suite ships (a builtin, a bundled example harness)
    reads the suite's own folder unless told otherwise; any other harness (`command:`) reads the folder the user
    chose, else ./chatgold-expectations, and never the suite's: a harness that names itself after a bundled runner
    must not be judged against a baseline it never recorded."""
    chosen = chosen_directory(directory)
    if suite_runner:
        return chosen or EXPECTATIONS_DIR
    if chosen is None:
        return Path(AUTHOR_DIR)
    if is_suite_directory(chosen):
        raise ExpectationsError(f"{chosen}: the suite's own baselines, for the runners it ships; a command: "
                                f"runner's baseline lives in your own folder (--expectations DIR)")
    return chosen


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
        raw = path.read_bytes()
    except OSError as exc:
        raise ExpectationsError(f"{path}: not readable JSON: {exc}") from None
    record = _checked_record(raw)
    data = _read_record(record)
    if data is not None:
        return _build(data, path, runner_name)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExpectationsError(f"{path}: not readable JSON: {exc}") from None
    expectations = _parse(data, path, runner_name)
    _write_record(record, data)
    return expectations


def _checked_record(raw: bytes) -> Path:
    """Where a baseline that passed _parse's checks is kept, parsed (marshal), by its bytes and this module:
    a gate reads all of them (26 MB of JSON), and parsing and checking every cell again cost half a second."""
    from runners.versions import cache_root

    digest = hashlib.sha256(_RECORD_SALT)
    digest.update(raw)
    return cache_root() / "expectations" / f"{digest.hexdigest()}.marshal"


def _read_record(record: Path):
    try:
        data = marshal.loads(record.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def _write_record(record: Path, data: dict) -> None:
    """Write the record, and keep the newest MAX_RECORDS (every edit of a baseline makes a new one)."""
    try:
        atomic_write(record, marshal.dumps(data))
        records = sorted(record.parent.glob("*.marshal"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in records[MAX_RECORDS:]:
            old.unlink()
    except (OSError, ValueError):  # a cache that cannot be written or pruned costs only the time
        pass


def _parse(data, path: Path, runner_name: str) -> Expectations:
    if not isinstance(data, dict) or data.get("format") not in READABLE_FORMATS:
        raise ExpectationsError(f"{path}: expected an object with \"format\": {FORMAT} (or 1)")
    cells, rules = data.get("cells", {}), data.get("rules", [])
    if not isinstance(cells, dict) or not isinstance(rules, list):
        raise ExpectationsError(f"{path}: \"cells\" must be an object and \"rules\" a list")
    for rule in rules:
        if not isinstance(rule, dict) or not isinstance(rule.get("reason", ""), str):
            raise ExpectationsError(f"{path}: every rule must be an object with a string \"reason\": {rule!r}")
    causes = set()
    raw_causes = data.get("causes", [])
    if not isinstance(raw_causes, list):
        raise ExpectationsError(f"{path}: \"causes\" must be a list")
    for entry in raw_causes:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) \
                or not isinstance(entry.get("reason", ""), str):
            raise ExpectationsError(f"{path}: every cause must be an object with a string \"id\" and \"reason\": "
                                    f"{str(entry)[:200]}")
        if entry["id"] in causes:
            raise ExpectationsError(f"{path}: cause {entry['id']} is listed twice")
        causes.add(entry["id"])
    status_reasons = data.get("status_reasons", {})
    if not isinstance(status_reasons, dict):
        raise ExpectationsError(f"{path}: \"status_reasons\" must map statuses to reasons")
    for template_id, cases in cells.items():
        if not isinstance(cases, dict):
            raise ExpectationsError(f"{path}: cells[{template_id!r}] must map case ids to \"status[:fingerprint]\"")
        for case_id, value in cases.items():
            if not isinstance(case_id, str):
                raise ExpectationsError(f"{path}: cells[{template_id!r}]: case ids must be strings")
            status, _, cause = parse_value(value) if isinstance(value, str) else (None, None, None)
            if status not in STATUSES or status in PASSING:
                raise ExpectationsError(f"{path}: cells[{template_id!r}][{case_id!r}] = {value!r}: status must be "
                                        f"one of {', '.join(s for s in STATUSES if s not in PASSING)}")
            if cause is not None and cause not in causes:
                raise ExpectationsError(f"{path}: cells[{template_id!r}][{case_id!r}] = {value!r}: cause {cause} is "
                                        f"not among the file's causes")
    return _build(data, path, runner_name)


def _build(data: dict, path: Path, runner_name: str) -> Expectations:
    """Expectations from a baseline _parse has checked."""
    causes = {entry["id"]: KnownCause.from_dict(entry) for entry in data.get("causes", [])}
    return Expectations(data.get("runner", runner_name), data.get("cells", {}), data.get("rules", []), path, causes,
                        dict(data.get("status_reasons", {})))


def verdict(result: CellResult, expectation: Optional[Expectation], known_causes=()) -> Verdict:
    """The verdict of a judged cell against its expectation; a cell that is new or changed but whose explained
    cause (result.cause) is one of `known_causes` is known."""
    if not result.status.judged:
        return Verdict.NOT_RUN  # skipped or without a golden: counted and shown, never a pass or a failure
    if result.passed:
        return Verdict.UNEXPECTED_PASS if expectation else Verdict.EXPECTED_PASS
    cause = result.cause
    known = cause is not None and cause in known_causes
    if expectation is None:
        return Verdict.EXPECTED_FAIL if known else Verdict.UNEXPECTED_FAIL
    if expectation.status != result.status:
        return Verdict.EXPECTED_FAIL if known else Verdict.CHANGED
    current = result.fingerprint
    if expectation.fingerprint and current and expectation.fingerprint != current:
        return Verdict.EXPECTED_FAIL if known else Verdict.CHANGED
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
                         f"got {result.fingerprint}: the output changed)")
    elif verdict_name == Verdict.UNEXPECTED_PASS:
        lines[0] += f" (expected {expectation.status}: now passes; update the baseline)"
    if result.divergence is not None:
        lines.append(result.divergence.describe())
    if result.message:
        lines.append(f"  engine: {result.message[:500]}" + (f" [{result.refusal}]" if result.refusal else ""))
    if result.reference_message:
        lines.append(f"  reference: {result.reference_message[:500]} [{result.reference_refusal}]")
    if result.note:
        lines.append(f"  {result.note}")
    attribution = result.attribution
    if attribution:
        if "line" in attribution:
            lines.append(f"  golden byte emitted by template line {attribution['line']} ({attribution['construct']}): "
                         f"{attribution['source_line'].strip()[:200]}")
        else:
            lines.append(f"  {attribution.get('unavailable')}")
    cause = result.cause
    if cause:
        known = expectation is not None and expectation.cause == cause
        lines.append(f"  root cause {cause}{' (known)' if known else ' (new)'}: {result.cause_title or ''}")
        before = (expectation.recorded_cause or ({"id": expectation.cause, "title": ""} if expectation.cause else None)
                  if expectation is not None else None)
        if before and before["id"] != cause:
            lines.append(f"  its cause changed: the baseline filed it under {before['id']} {before.get('title', '')}"
                         .rstrip())
        repro = result.cause_repro
        if repro:
            lines.append("  minimal reproducer: " + repro)
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


GENERATED_RULE = "(recorded by `chatgold expectations update`)"
UNEXPLAINED_REASON = "not reduced to a root cause (`chatgold explain` says why)"


def update_expectations(runner_name: str, results: Iterable[CellResult], selected: Optional[set] = None,
                        directory: Optional[Path] = None, causes: Optional[dict] = None) -> tuple[Expectations, dict]:
    """Rewrite the baseline from fresh results, in format 2. With `selected` ((template, case) pairs), only those
    cells change; the rest of the file is kept. A result's explained cause (result.cause) is recorded with
    the cell; `causes` (cause id -> the explanation's cause record: title, constructs, symptom, repro) gives
    the known causes' new records, whose reasons and links are carried forward from the old file by mechanism
    (carried_reasons: by the cells the old cause held, and by id). Returns the new baseline and counts of
    added/removed/changed cells, of causes without a reason, and of how reasons were carried over."""
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
        fp = result.fingerprint
        cause = result.cause
        cells.setdefault(result.template_id, {})[result.case_id] = (
            result.status + (f":{fp}" if fp else "") + (f"@{cause}" if cause else ""))
    fresh = dict(causes or {})
    heirs = carried_reasons(old, old_cells, cells)
    carried = {"by_id": 0, "by_cells": 0, "merged": [], "used": set()}
    known: dict = {}
    for template_id, cases in cells.items():
        for case_id, value in list(cases.items()):
            status, fp, cause = parse_value(value)
            if cause is None or cause in known:
                continue
            record = fresh.get(cause)
            previous = old.causes.get(cause)
            if record is not None:
                reason, link = _inherited(cause, heirs.get(cause, []), old.causes, carried)
                entry = KnownCause(cause, record.get("title", ""), reason, link, list(record.get("constructs", [])),
                                   record.get("symptom"), _baseline_repro(record.get("repro")))
            elif previous is not None:
                entry = previous
                carried["used"].add(cause)
            else:  # a cause nobody describes: keep the cell, drop the dangling id
                cases[case_id] = status + (f":{fp}" if fp else "")
                continue
            known[cause] = entry
    cells = {t: dict(sorted(c.items())) for t, c in sorted(cells.items()) if c}
    before = {(t, c): v for t, cs in old_cells.items() for c, v in cs.items()}
    after = {(t, c): v for t, cs in cells.items() for c, v in cs.items()}
    cells = compact_cells(cells, case_ids)
    rules = [rule for rule in old.rules if GENERATED_RULE not in rule.get("reason", "")]
    status_reasons = dict(old.status_reasons)
    for rule in old.rules:  # a format 1 file's hand-written catch-all reasons become status reasons
        if (rule.get("template", "*"), rule.get("case", "*")) == ("*", "*") and GENERATED_RULE not in rule.get(
                "reason", "") and "*" not in rule.get("status", "*"):
            status_reasons.setdefault(rule["status"], rule["reason"])
    for value in after.values():
        status, _, cause = parse_value(value)
        if cause is None and status not in status_reasons and not any(
                fnmatch.fnmatchcase(status, r.get("status", "*")) for r in rules):
            status_reasons[status] = UNEXPLAINED_REASON if status in NON_MATCHING else DEFAULT_REASONS[status]
    ordered = dict(sorted(known.items(), key=lambda kv: kv[0]))
    new = Expectations(runner_name, cells, rules, expectations_path(runner_name, directory), ordered,
                       dict(sorted(status_reasons.items())))
    counts = {"added": len(after.keys() - before.keys()), "removed": len(before.keys() - after.keys()),
              "changed": sum(1 for k in after.keys() & before.keys() if after[k] != before[k]), "total": len(after),
              "causes": len(ordered), "causes_without_reason": sum(1 for c in ordered.values() if not c.reason),
              "reasons_by_id": carried["by_id"], "reasons_by_cells": carried["by_cells"],
              "reasons_merged": carried["merged"],
              # old reasons no new cause took: their cells match now, or are no longer explained
              "reasons_dropped": sorted(c for c, k in old.causes.items() if k.reason and c not in carried["used"])}
    write_expectations(new)
    return new, counts




def carried_reasons(old: "Expectations", old_cells: dict, new_cells: dict) -> dict:
    """new cause id -> the old causes whose hand-written reasons it inherits, largest share first.

    Identity by mechanism merges causes the old baseline kept apart (and may split one), so ids change on a
    re-record; the cells do not. An old cause's reason goes to the new cause that holds most of its cells (ties:
    the smaller id), and only there; an old cause whose id is still a cause keeps its reason by id alone, and
    the cells it lost take none of it. An old cause that split was several mechanisms: its prose is known true
    of one part at most, so the others wait for a reason of their own (a re-record after a false merge had
    spread one reason over 32 unrelated causes). Only old causes with a reason count."""
    from collections import Counter

    moved: dict = {}        # old cause -> Counter(new cause -> cells)
    new_ids = {parse_value(v)[2] for cases in new_cells.values() for v in cases.values()}
    for template_id, cases in old_cells.items():
        for case_id, value in cases.items():
            before = parse_value(value)[2]
            known = old.causes.get(before) if before else None
            now = new_cells.get(template_id, {}).get(case_id)
            after = parse_value(now)[2] if now else None
            if known is None or not known.reason or after is None:
                continue
            moved.setdefault(before, Counter())[after] += 1
    heirs: dict = {}
    for before, counts in moved.items():
        if before in new_ids:
            continue  # the old cause is still there by id: its reason stays with its mechanism (by id)
        after, n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        heirs.setdefault(after, Counter())[before] = n
    return {after: [c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
            for after, counts in heirs.items()}


MERGED_REASONS = "One mechanism, recorded before as {n} causes ({ids}); their reasons, kept until rewritten as one:"


def _inherited(cause_id: str, sources: list, old_causes: dict, carried: dict) -> tuple[str, str]:
    """(reason, link) of a re-recorded cause: its own old reason by id when it had one, then the reasons of the
    old causes whose cells it took (carried_reasons); several distinct reasons are all kept, joined, and say
    so. The link is the first one given (the largest share); the others are named in the reason."""
    same = old_causes.get(cause_id)
    order = ([cause_id] if same is not None and same.reason else []) + [c for c in sources if c != cause_id]
    distinct: dict = {}     # reason text -> old ids giving it
    links: list = []
    for old_id in order:
        known = old_causes[old_id]
        if known.reason:
            distinct.setdefault(known.reason.strip(), []).append(old_id)
            carried["used"].add(old_id)
        if known.link and known.link not in links:
            links.append(known.link)
    if not distinct:
        return "", ""
    if order and order[0] == cause_id:
        carried["by_id"] += 1
    else:
        carried["by_cells"] += 1
    if len(distinct) == 1:
        reason = next(iter(distinct))
    else:
        carried["merged"].append(cause_id)
        parts = [f"({i}) [{', '.join(ids)}] {text}" for i, (text, ids) in enumerate(distinct.items(), 1)]
        reason = " ".join([MERGED_REASONS.format(n=len(order), ids=", ".join(order))] + parts)
    if len(links) > 1:
        reason += " Upstream: " + ", ".join(links[1:]) + "."
    return reason, links[0] if links else ""


def _baseline_repro(repro: Optional[dict]) -> Optional[dict]:
    """What a baseline keeps of a reproducer: enough to render it again and to show both sides."""
    if not repro:
        return None
    keep = ("template", "case", "bos_token", "eos_token", "reference", "engine", "owner")
    return {k: repro[k] for k in keep if k in repro}


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
    """Format 2, one cause and one template per line: compact, and diffs stay readable."""
    from conformance.files import atomic_write

    path = expectations.path or expectations_path(expectations.runner)
    path.parent.mkdir(parents=True, exist_ok=True)
    dump = lambda value: json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    # A cause keeps its reproducer's key order: a case's objects are data the template may print in order
    # (tools through tojson), so sorting them would record a reproducer that no longer reproduces.
    exact = lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    parts = ['{"format": %d,' % FORMAT, ' "runner": %s,' % dump(expectations.runner), ' "causes": [']
    parts.append(",\n".join("  " + exact(cause.to_dict()) for cause in expectations.causes.values()))
    parts.append(' ],\n "status_reasons": %s,' % dump(expectations.status_reasons))
    if expectations.rules:
        parts.append(' "rules": [')
        parts.append(",\n".join("  " + dump(rule) for rule in expectations.rules))
        parts.append(' ],')
    parts.append(' "cells": {')
    parts.append(",\n".join(f"  {dump(t)}: {dump(c)}" for t, c in sorted(expectations.cells.items())))
    parts.append(" }\n}\n")
    atomic_write(path, "\n".join(parts).encode("utf-8", ENCODING_ERRORS))
    path.chmod(0o644)  # mkstemp creates 0600; the baseline is an ordinary committed file
    return path
