"""The report: a pure output stage. It turns judged results into one JSON document (schema:
conformance/schemas/report.schema.json) plus a sidecar holding one record per cell that is not a pass
(report.cells.jsonl.gz, schema: conformance/schemas/report-cell.schema.json), from which every other output
(terminal, JUnit, Markdown, badges, HTML) is rendered, so shard reports can be merged and re-rendered
anywhere. It imports no engine and reads no golden: the judged results carry what it shows.

Rollups are raw counts, so merging shards is a sum; the conformance figure is derived by
conformance.judge.status.figure, the one place it is computed: skipped cells and cells without a golden are
outside its denominator, counted and shown.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import orjson

from conformance.background import Job
from conformance.files import ENCODING_ERRORS
from conformance.judge.status import (
    NO_ANSWER,
    NON_MATCHING,
    NOT_JUDGED,
    PASSING,
    STATUSES,
    Status,
    Verdict,
    figure,
    gain_if_fixed,
)
from conformance.report.templates import finalize_views, merge_views, template_views

# 3: a cell held against a known cause no longer repeats the cause's reason and link: they are written once per
# runner, in the section's `expected_causes` (the full gate's cell records were a third reasons).
REPORT_FORMAT = 3
# Every failing cell is under a cause or unexplained (errored and timed-out ones always unexplained).
EXPLAINED_STATUSES = NON_MATCHING | NO_ANSWER
MESSAGE_LIMIT = 1000
OUTPUT_LIMIT = 2000   # rendered outputs of engine-rendered cells kept in a record
CELLS_SUFFIX = ".cells.jsonl.gz"
# Construct families left out of the per-construct matrix: template-specific names and plain text.
SKIPPED_CONSTRUCT_FAMILIES = ("var:", "text:", "error:")
VERDICTS = tuple(str(v) for v in Verdict)


@dataclass
class Report:
    """The JSON document and its cell records (every cell that is not a pass, one record each)."""

    data: dict
    cells: list = field(default_factory=list)
    _grouped: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)

    def __getitem__(self, key):
        return self.data[key]

    def __contains__(self, key) -> bool:
        return key in self.data

    def get(self, key, default=None):
        return self.data.get(key, default)

    def runner_cells(self, name: str) -> list:
        # Five outputs ask for each runner's records: grouped once (the full gate has ~250k records), again
        # only if records were added since.
        grouped = self._grouped
        if grouped is None or grouped[0] != len(self.cells):
            by_runner: dict = {}
            for record in self.cells:
                by_runner.setdefault(record["runner"], []).append(record)
            grouped = self._grouped = (len(self.cells), by_runner)
        return list(grouped[1].get(name, ()))


def _table_row() -> dict:
    return {"cells": 0, "judged": 0, "matches": 0, "diverged": 0}


def _bump(row: dict, status: Status, n: int = 1) -> None:
    row["cells"] += n
    row["judged"] += n * (status not in NOT_JUDGED)
    row["matches"] += n * (status in PASSING)
    row["diverged"] += n * (status == Status.DIVERGED)


def cell_record(result, expected_causes: Optional[dict] = None) -> dict:
    """The sidecar record of one judged cell (a CellResult that is not a pass).

    expected_causes (cause id -> {"reason", "link"?}), when given, collects the reason of each known cause the
    cells are held against; a record whose reason and link are its cause's leaves them to that entry."""
    record = {"runner": result.runner, "template": result.template_id, "case": result.case_id,
              "status": str(result.status), "verdict": str(result.verdict) if result.verdict else None}
    for name in ("fingerprint", "note", "golden_window", "output_window", "attribution", "cause", "tokens"):
        value = getattr(result, name)
        if value is not None:
            record[name] = value
    if result.message:
        record["message"] = result.message[:MESSAGE_LIMIT]
    if result.refusal:
        record["refusal"] = result.refusal
    if result.reference_message:
        record["reference_message"] = result.reference_message[:MESSAGE_LIMIT]
        record["reference_refusal"] = result.reference_refusal
    if result.detail:
        record["detail"] = result.detail[-MESSAGE_LIMIT:]
    expectation = result.expectation
    if expectation is not None:
        record["expected"] = {"status": str(expectation.status), "reason": expectation.reason}
        if expectation.fingerprint:
            record["expected"]["fingerprint"] = expectation.fingerprint
        if getattr(expectation, "cause", None):
            record["expected"]["cause"] = expectation.cause
        if getattr(expectation, "recorded_cause", None):
            record["expected"]["recorded_cause"] = dict(expectation.recorded_cause)
        if expectation.link:
            record["expected"]["link"] = expectation.link
        if expected_causes is not None and expectation.cause:
            _share_reason(record["expected"], expected_causes)
    if result.divergence is not None:
        record["divergence"] = result.divergence.to_dict()
        record["description"] = result.divergence.describe()
    elif result.output is not None:
        record["output"] = result.output[:OUTPUT_LIMIT]
        if len(result.output) > OUTPUT_LIMIT:
            record["output_truncated"] = len(result.output)
    return record


def _share_reason(expected: dict, expected_causes: dict) -> None:
    """Leave a known cause's reason and link to its one entry in expected_causes (the first cell's sets it)."""
    said = {"reason": expected["reason"]}
    if "link" in expected:
        said["link"] = expected["link"]
    if expected_causes.setdefault(expected["cause"], said) == said:
        del expected["reason"]
        expected.pop("link", None)


def runner_section(run, metadata: dict) -> tuple[dict, list]:
    """(section, cell records) for one runner's judged results (judge.pipeline.RunnerResults).

    metadata: {"cases": {id: {"features": [...]}}, "templates": {id: {"constructs": [...] | None}}}."""
    features: dict = defaultdict(_table_row)
    per_template: dict = defaultdict(_table_row)
    blamed, blamed_lines = Counter(), defaultdict(Counter)
    passed, records, unexpected = defaultdict(list), [], []
    expected_causes: dict = {}
    # Tallied per (case, status) and (template, status) first, then spread over the tables: a full run has
    # hundreds of thousands of cells but only a few hundred such pairs.
    # Counted by Counter over generators (its counting loop is C), the verdicts by object and named once each.
    results = run.results
    verdicts = Counter({str(verdict): n for verdict, n in Counter(r.verdict for r in results).items()})
    by_case = Counter((r.case_id, r.status) for r in results)
    by_template = Counter((r.template_id, r.status) for r in results)
    for result in results:
        if result.status in PASSING and result.verdict == Verdict.EXPECTED_PASS:
            passed[result.template_id].append(result.case_id)
            continue
        record = cell_record(result, expected_causes)
        records.append(record)
        if result.verdict is not None and result.verdict.failing:
            unexpected.append(record)
        attribution = result.attribution or {}
        if "construct" in attribution:
            blamed[attribution["construct"]] += 1
            blamed_lines[attribution["construct"]][f"{result.template_id}:{attribution['line']}"] += 1
    for (case_id, status), n in by_case.items():
        for tag in metadata["cases"].get(case_id, {}).get("features", ()):
            _bump(features[tag], status, n)
    for (template_id, status), n in by_template.items():
        _bump(per_template[template_id], status, n)
    explanation = run.explanation
    # Causal attribution: with an explanation, a non-matching cell counts against the constructs of its root
    # cause only, not against every construct its template uses.
    blamed_on: dict = defaultdict(lambda: defaultdict(_table_row))  # template -> construct -> failing tally
    if explanation is not None:
        cause_constructs = {cause.id: cause.constructs for cause in explanation.causes}
        for result in run.results:
            cause = result.cause
            if cause in cause_constructs:
                for construct in cause_constructs[cause]:
                    row = blamed_on[result.template_id][construct]
                    _bump(row, result.status)
    constructs: dict = defaultdict(_table_row)
    notes = set()
    for template_id, tally in per_template.items():
        names = metadata["templates"].get(template_id, {}).get("constructs")
        if names is None:
            notes.add("some templates have no recorded construct inventory (run `chatgold corpus build`)")
            names = ["(no inventory)"]
        for construct in names:
            if construct.startswith(SKIPPED_CONSTRUCT_FAMILIES):
                continue
            row = constructs[construct]
            if explanation is None:
                for key in row:
                    row[key] += tally[key]
                continue
            failing = blamed_on[template_id].get(construct, _table_row())
            row["cells"] += tally["cells"]
            row["judged"] += tally["judged"]
            row["matches"] += tally["judged"] - failing["judged"]
            row["diverged"] += failing["diverged"]
    counts = run.counts()
    section = {
        "runner": {k: v for k, v in run.info.items() if k != "template_facts"},
        "counts": counts,
        "verdicts": {v: verdicts.get(v, 0) for v in VERDICTS},
        "expectations": {"file": str(run.expectations.path) if run.expectations.path else None,
                         "known": len(run.expectations)},
        "features": dict(sorted(features.items())),
        "constructs": dict(sorted(constructs.items())),
        "blamed_constructs": dict(blamed.most_common()),
        "blamed_lines": {c: dict(lines.most_common(5)) for c, lines in blamed_lines.items()},
        "notes": sorted(notes),
        "rules": list(run.expectations.rules),
        "unexpected_cells": unexpected,
        "expected_causes": dict(sorted(expected_causes.items())),
        "records": len(records),
        "passed": {t: sorted(c) for t, c in sorted(passed.items())},
        **template_views(run),
    }
    if explanation is not None:
        section["constructs_basis"] = "cause"
        section["causes"] = [cause.to_dict() for cause in explanation.causes]
        section["unexplained"] = list(explanation.unexplained)
        section["stale_causes"] = list(explanation.stale)
        section["explain_stats"] = dict(explanation.stats)
    return section, records


def build_report(runs: Iterable, selection: dict, metadata: dict, capability_agreement: Optional[dict] = None,
                 extra_sections: Optional[dict] = None) -> Report:
    """The report of several runners' judged results over one selection."""
    data = {"format": REPORT_FORMAT, "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "selection": selection, "runners": {}}
    cells: list = []
    for run in runs:
        section, records = runner_section(run, metadata)
        data["runners"][run.name] = section
        cells.extend(records)
    if capability_agreement is not None:
        data["capability_agreement"] = capability_agreement
    for key, value in (extra_sections or {}).items():
        data[key] = value
    return finalize(Report(data, cells))


def _finalize_agreement(section: dict) -> None:
    for row in section["capabilities"].values():
        row.setdefault("disagreements", [])
        row["compared"] = row["agree"] + row["disagree"]
        row["agreement"] = round(row["agree"] / row["compared"], 4) if row["compared"] else None


def _merge_agreement(sections: list) -> Optional[dict]:
    """Shards hold disjoint templates: counts add up, examples concatenate (up to 20 per capability)."""
    if not sections:
        return None
    merged = {"format": 1, "engine": sections[0].get("engine", {}), "capabilities": {},
              "templates": sum(s.get("templates", 0) for s in sections)}
    for section in sections:
        for name, row in section["capabilities"].items():
            into = merged["capabilities"].setdefault(name, {"agree": 0, "disagree": 0, "unknown": 0,
                                                            "disagreements": []})
            for key in ("agree", "disagree", "unknown"):
                into[key] += row[key]
            room = 20 - len(into["disagreements"])
            into["disagreements"].extend(row.get("disagreements", [])[:max(room, 0)])
    merged["capabilities"] = dict(sorted(merged["capabilities"].items()))
    notes = [s["autoparser"] for s in sections if s.get("autoparser")]
    if notes:
        merged["autoparser"] = {key: sum(n.get(key, 0) for n in notes)
                                for key in ("analysed", "specialized", "unavailable")}
        merged["autoparser"]["not_logged"] = notes[0].get("not_logged", [])
    return merged


def _merge_properties(sections: list) -> Optional[dict]:
    """Shards hold disjoint templates: template counts and kind counts add up, violations join."""
    if not sections:
        return None
    merged = {"format": sections[0]["format"], "violations": {},
              **{key: sum(s[key] for s in sections) for key in ("templates", "recorded", "clean")},
              "properties": {}}
    for section in sections:
        merged["violations"].update(section["violations"])
        for name, row in section["properties"].items():
            into = merged["properties"].setdefault(name, {key: 0 for key in row if isinstance(row[key], int)}
                                                   | {"violation_kinds": {}, "exception_kinds": {}})
            for key, value in row.items():
                if isinstance(value, int):
                    into[key] += value
                else:
                    for kind, n in value.items():
                        into[key][kind] = into[key].get(kind, 0) + n
    merged["violations"] = dict(sorted(merged["violations"].items()))
    return merged


def finalize(report: Report) -> Report:
    """Derived numbers (figures, totals) recomputed from counts: after a build and after a merge."""
    unexpected = 0
    for section in report.data["runners"].values():
        fig = figure(section["counts"])
        section["figure"] = fig
        section["conformance"] = fig["conformance"]
        section["cells_total"] = fig["cells"]
        for table in (section["features"], section["constructs"]):
            for row in table.values():
                row["conformance"] = round(100.0 * row["matches"] / row["judged"], 2) if row["judged"] else None
        section["unexpected"] = sum(section["verdicts"].get(str(v), 0) for v in Verdict if v.failing)
        unexpected += section["unexpected"]
        for cause in section.get("causes", ()):
            cause["templates"] = len({template for template, _ in cause["cells"]})
            if fig["judged"]:
                cause["conformance_if_fixed"], cause["gain"] = gain_if_fixed(fig, len(cause["cells"]))
        if section.get("causes"):
            section["causes"].sort(key=lambda c: (-len(c["cells"]), c["id"]))
        finalize_views(section)
    report.data["unexpected"] = unexpected
    report.data["cell_records"] = len(report.cells)
    if report.data.get("capability_agreement"):
        _finalize_agreement(report.data["capability_agreement"])
    return report


def merge_reports(reports: Iterable[Report]) -> Report:
    """Combine shard reports (disjoint templates) into one: counts add up, cell records concatenate."""
    reports = list(reports)
    if not reports:
        raise ValueError("report merge: no input reports")
    merged = {"format": REPORT_FORMAT, "generated": max(r["generated"] for r in reports),
              "selection": dict(reports[0]["selection"], shard=None,
                                merged_from=[r["selection"].get("shard") for r in reports]),
              "runners": {}}
    cells: list = []
    for report in reports:
        if report.get("format") != REPORT_FORMAT:
            raise ValueError(f"report merge: format {report.get('format')!r}, expected {REPORT_FORMAT}")
        cells.extend(report.cells)
        for name, section in report["runners"].items():
            into = merged["runners"].setdefault(name, {
                "runner": section["runner"], "counts": {str(s): 0 for s in STATUSES}, "verdicts": Counter(),
                "expectations": section["expectations"], "features": {}, "constructs": {},
                "blamed_constructs": Counter(), "blamed_lines": {}, "notes": [], "rules": section.get("rules", []),
                "unexpected_cells": [], "expected_causes": {}, "records": 0, "passed": {}})
            for status, n in section["counts"].items():
                into["counts"][status] = into["counts"].get(status, 0) + n
            into["verdicts"].update(section["verdicts"])
            for key in ("features", "constructs"):
                for tag, row in section[key].items():
                    target = into[key].setdefault(tag, _table_row())
                    for name_ in target:
                        target[name_] += row[name_]
            into["blamed_constructs"].update(section["blamed_constructs"])
            for construct, lines in section["blamed_lines"].items():
                into["blamed_lines"].setdefault(construct, Counter()).update(lines)
            into["notes"] = sorted(set(into["notes"]) | set(section["notes"]))
            if "causes" in section:
                _merge_causes(into, section)
            _merge_expected_causes(into, section, name, report.cells)
            into["unexpected_cells"].extend(section["unexpected_cells"])
            into["records"] += section["records"]
            overlap = into["passed"].keys() & section["passed"].keys()
            if overlap:
                raise ValueError(f"report merge: template {sorted(overlap)[0]} appears in two shards for {name}")
            into["passed"].update(section["passed"])
            merge_views(into, section)
    for section in merged["runners"].values():
        section["verdicts"] = {v: section["verdicts"].get(v, 0) for v in VERDICTS}
        section["blamed_constructs"] = dict(section["blamed_constructs"].most_common())
        section["blamed_lines"] = {c: dict(Counter(l).most_common(5)) for c, l in section["blamed_lines"].items()}
        section["features"] = dict(sorted(section["features"].items()))
        section["constructs"] = dict(sorted(section["constructs"].items()))
        section["passed"] = dict(sorted(section["passed"].items()))
        section["unexpected_cells"].sort(key=lambda c: (c["template"], c["case"]))
        section["expected_causes"] = dict(sorted(section["expected_causes"].items()))
    agreement = _merge_agreement([r["capability_agreement"] for r in reports if r.get("capability_agreement")])
    if agreement is not None:
        merged["capability_agreement"] = agreement
    properties = _merge_properties([r["properties"] for r in reports if r.get("properties")])
    if properties is not None:
        merged["properties"] = properties
    audits = [r["audit"] for r in reports if r.get("audit")]
    if audits:
        merged["audit"] = audits[0]  # corpus-wide: every shard computes the same one
    cells.sort(key=lambda c: (c["runner"], c["template"], c["case"]))
    return finalize(Report(merged, cells))


def _merge_expected_causes(into: dict, section: dict, name: str, cells: list) -> None:
    """Shards read one baseline, so a known cause's reason is the same in each; where a shard's differs, its
    cells get theirs back inline, so none takes another shard's reason."""
    differs = set()
    for cause, said in section.get("expected_causes", {}).items():
        if into["expected_causes"].setdefault(cause, said) != said:
            differs.add(cause)
    if not differs:
        return
    own = section["expected_causes"]
    for record in [c for c in cells if c["runner"] == name] + section["unexpected_cells"]:
        expected = record.get("expected") or {}
        if expected.get("cause") in differs and "reason" not in expected:
            expected.update(own[expected["cause"]])


def _merge_causes(into: dict, section: dict) -> None:
    """Shards hold disjoint templates: a cause's cells concatenate; its reproducer is the first shard's."""
    into["constructs_basis"] = section.get("constructs_basis", "cause")
    causes = {cause["id"]: cause for cause in into.setdefault("causes", [])}
    for cause in section["causes"]:
        if cause["id"] in causes:
            causes[cause["id"]]["cells"] = causes[cause["id"]]["cells"] + cause["cells"]
            for status, n in cause.get("statuses", {}).items():
                counts = causes[cause["id"]].setdefault("statuses", {})
                counts[status] = counts.get(status, 0) + n
        else:
            causes[cause["id"]] = dict(cause)
    into["causes"] = list(causes.values())
    into.setdefault("unexplained", []).extend(section.get("unexplained", []))
    stale = {entry["id"]: entry for entry in into.setdefault("stale_causes", [])}
    for entry in section.get("stale_causes", []):
        stale.setdefault(entry["id"], entry)
    into["stale_causes"] = list(stale.values())


def check_report(report: Report) -> None:
    """Raise ValueError unless the report is well formed: the JSON against report.schema.json, every cell record
    against report-cell.schema.json and with a reason to be expected for, and one record for every cell that is
    not a pass."""
    from jsonschema import ValidationError

    from conformance import schema_validator

    try:
        schema_validator("report.schema.json").validate(report.data)
        record_schema = schema_validator("report-cell.schema.json")
        for cell in report.cells:
            record_schema.validate(cell)
    except ValidationError as exc:
        raise ValueError(f"report does not follow its schema: {exc.message}") from None
    if len(report.cells) != report["cell_records"]:
        raise ValueError(f"{len(report.cells)} cell records, the report says {report['cell_records']}")
    for name, section in report["runners"].items():
        records = report.runner_cells(name)
        passed = sum(len(cases) for cases in section["passed"].values())
        if len(records) != section["records"] or passed + len(records) != section["cells_total"]:
            raise ValueError(f"{name}: {passed} passing cells and {len(records)} records, but {section['cells_total']} "
                             f"cells ({section['records']} records announced)")
        said = section["expected_causes"]
        orphans = [r for r in records if "expected" in r and "reason" not in r["expected"]
                   and r["expected"].get("cause") not in said]
        if orphans:
            raise ValueError(f"{name}: {len(orphans)} cell record(s) held against a cause with no reason here or in "
                             f"expected_causes (first: {orphans[0]['template']} x {orphans[0]['case']})")
        found = Counter(record["status"] for record in records)
        for status, n in section["counts"].items():
            if status not in PASSING and found.get(status, 0) != n:
                raise ValueError(f"{name}: {found.get(status, 0)} {status} records for {n} {status} cells")
        if "causes" in section:
            # every non-matching cell under exactly one cause or unexplained
            placed = Counter((t, c) for cause in section["causes"] for t, c in cause["cells"])
            placed.update((u["template"], u["case"]) for u in section.get("unexplained", []))
            wanted = {(r["template"], r["case"]) for r in records if r["status"] in EXPLAINED_STATUSES}
            twice = [cell for cell, n in placed.items() if n > 1]
            if twice or set(placed) != wanted:
                raise ValueError(f"{name}: causes and unexplained cells do not cover each non-matching cell once "
                                 f"({len(twice)} placed twice, {len(wanted - set(placed))} missing, "
                                 f"{len(set(placed) - wanted)} not non-matching)")


def cells_path(json_path) -> Path:
    """The sidecar beside a JSON report: report.json -> report.cells.jsonl.gz."""
    path = Path(json_path)
    return path.with_name(path.name[:-len(".json")] + CELLS_SUFFIX if path.name.endswith(".json")
                          else path.name + CELLS_SUFFIX)


def load_report(path) -> Report:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON report: {exc}") from None
    if not isinstance(data, dict) or data.get("format") not in (2, REPORT_FORMAT):
        raise ValueError(f"{path}: not a chatgold report of format {REPORT_FORMAT} (or 2)")
    if data["format"] == 2:
        # Format 2 wrote every reason inline, which format 3 still reads: the same report with no shared reasons.
        for section in data.get("runners", {}).values():
            section.setdefault("expected_causes", {})
        data["format"] = REPORT_FORMAT
    cells = []
    sidecar = path.parent / data.get("cells_file", cells_path(path).name)
    if data.get("cell_records"):
        try:
            with gzip.open(sidecar, "rt", encoding="utf-8") as handle:
                cells = [json.loads(line) for line in handle if line.strip()]
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{sidecar}: the report's cell records are not readable: {exc}") from None
        if len(cells) != data["cell_records"]:
            raise ValueError(f"{sidecar}: {len(cells)} cell records, the report says {data['cell_records']}")
    return Report(data, cells)


_CELL_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _cell_line(record: dict) -> bytes:
    """One record as a JSON line's bytes, compact and not ASCII-escaped, by orjson (a quarter of json's time:
    the full gate writes ~630k records; the bytes are json's for the strings, integers and lists records hold).
    A record orjson refuses (a lone surrogate, kept byte-exact; a non-string key) goes through json."""
    try:
        return orjson.dumps(record)
    except orjson.JSONEncodeError:
        return _CELL_ENCODER.encode(record).encode("utf-8", ENCODING_ERRORS)


def _document_bytes(data: dict) -> bytes:
    """report.json's bytes: orjson (a sixth of json's time on the full gate's 50 MB), json where orjson
    refuses (a lone surrogate, a non-string key). They differ in how a float is spelt (1e-05 / 0.00001, the
    same number to any JSON reader) and in NaN and infinity, which orjson writes as null where json writes
    NaN, which is not JSON."""
    try:
        return orjson.dumps(data)
    except orjson.JSONEncodeError:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8", ENCODING_ERRORS)


def _write_sidecar(sidecar: Path, cells: list) -> None:
    # mtime 0: the same records give the same bytes. The full gate writes ~630k records: encoded by orjson
    # (_cell_line), handed to gzip thousands at a time, compressed at level 1 (a third of level 9's time; the
    # file is about half as large again).
    with open(sidecar, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=1) as handle:
        for start in range(0, len(cells), 4096):
            handle.write(b"\n".join(map(_cell_line, cells[start:start + 4096])) + b"\n")


def write_json(report: Report, path) -> list:
    """report.json and its sidecar of cell records; returns both paths."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sidecar = cells_path(path)
    _write_sidecar(sidecar, report.cells)
    path.write_bytes(_document_bytes(dict(report.data, cells_file=sidecar.name)))
    return [path, sidecar]


def write_outputs(report: Report, json_path=None, junit_path=None, markdown_path=None, badges_dir=None,
                  html_path=None) -> list:
    """Write every requested output; returns the paths written."""
    from conformance.report import html, render

    written = []
    # report.json and its sidecar are written on a second thread while the other outputs render on this one:
    # zlib lets go of the GIL, so compressing the full gate's ~560 MB of cell records (1.8 CPU-s) overlaps the
    # HTML, JUnit and Markdown rendering. Both threads only read the report.
    json_job = Job("report-json", lambda: write_json(report, json_path)).start() if json_path else None

    def write_text(path, produce) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(produce(report), encoding="utf-8", errors=ENCODING_ERRORS)
        written.append(target)

    try:
        if junit_path:
            written.append(render.write_junit(report, Path(junit_path)))
        if markdown_path:
            write_text(markdown_path, render.markdown)
        if badges_dir:
            written.extend(render.write_badges(report, Path(badges_dir)))
        if html_path:
            write_text(html_path, html.render_html)
    finally:
        json_paths = json_job.result() if json_job is not None else []  # waited for also on an error
    return json_paths + written

