"""The divergence report: one JSON document (schema: conformance/schemas/report.schema.json) from which
every other output (terminal, JUnit, Markdown, badges, HTML) is rendered, so shard reports can be merged
and re-rendered anywhere.

Rollups are kept as raw counts (cells, matches, diverged) so merging shards is a sum; conformance % is
derived. Unexpected outcomes and up to FULL_RECORD_BUDGET known divergences are stored in full (`cells`);
passing cells and the other known divergences are listed compactly per template (`passed`, `known`:
JUnit needs one test case per cell).
"""
from __future__ import annotations

import datetime as _dt
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Optional

from conformance.judge.status import DIVERGED, PASSING, STATUSES, CellResult, summarize
from conformance.judge.expectations import (CHANGED, EXPECTED_FAIL, EXPECTED_PASS, FAILING_VERDICTS, UNEXPECTED_FAIL,
                            UNEXPECTED_PASS, Expectations, verdict)

REPORT_FORMAT = 1
WINDOW = 300          # bytes of golden/output kept either side of the first difference
MESSAGE_LIMIT = 2000
# Known divergences get full records (windows, template context) only up to this many per runner and
# report: the HTML drill-down shows no more, and 84k cells x several runners must stay a sane JSON size.
# Unexpected outcomes always get full records.
FULL_RECORD_BUDGET = 200
OUTPUT_LIMIT = 4000   # non-diverged outputs (engine-rendered) kept in the report
TEMPLATE_CONTEXT = 3  # template lines shown around an attributed line
# Construct families left out of the per-construct matrix: template-specific names and plain text.
SKIPPED_CONSTRUCT_FAMILIES = ("var:", "text:")


def template_constructs(source: str, recorded: Optional[list] = None) -> tuple[list, Optional[str]]:
    """(construct names, problem): the names recorded with the corpus (templates/constructs.json, where an
    "error:" name marks a failed inventory) when given, else the evaluator's inventory, or why it is
    unavailable."""
    if recorded is None:
        try:
            # The submodule, not the package attribute: importing runners.evaluator.inventory rebinds the
            # package's `inventory` name to the submodule (the function and the module share a name).
            from runners.evaluator.inventory import inventory
        except Exception as exc:
            return [], f"attribution unavailable: runners.evaluator cannot be imported ({exc})"
        try:
            recorded = inventory(source).names()
        except Exception as exc:
            return [], f"inventory unavailable: {type(exc).__name__}: {str(exc)[:200]}"
    return [n for n in recorded if not n.startswith(SKIPPED_CONSTRUCT_FAMILIES + ("error:",))], None


def _recorded_constructs() -> dict:
    """sha256 -> construct names from templates/constructs.json (written with the corpus), or {}.

    Computing an inventory costs about 90 ms a template; the report needs every template's, per runner."""
    try:
        from conformance.corpus.manifest import load_constructs

        return load_constructs()
    except (OSError, ValueError):
        return {}


def _bump(table: dict, key: str, result: CellResult) -> None:
    row = table.setdefault(key, {"cells": 0, "matches": 0, "diverged": 0})
    row["cells"] += 1
    row["matches"] += result.status in PASSING
    row["diverged"] += result.status == DIVERGED


def _window(data: bytes, offset: int) -> dict:
    start = max(0, offset - WINDOW)
    return {"start": start, "before": data[start:offset].decode("utf-8", "backslashreplace"),
            "after": data[offset:offset + WINDOW].decode("utf-8", "backslashreplace"),
            "truncated_after": offset + WINDOW < len(data)}


def _cell_record(result: CellResult, verdict_name: str, expectation, source: str, golden_data: Optional[bytes]) -> dict:
    record = {"template": result.template_id, "case": result.case_id, "status": result.status,
              "verdict": verdict_name}
    if result.extra.get("fingerprint"):
        record["fingerprint"] = result.extra["fingerprint"]
    if result.message:
        record["message"] = result.message[:MESSAGE_LIMIT]
    if result.detail:
        record["detail"] = result.detail[-MESSAGE_LIMIT:]
    if expectation is not None:
        record["expected"] = {"status": expectation.status, "reason": expectation.reason}
        if expectation.fingerprint:
            record["expected"]["fingerprint"] = expectation.fingerprint
        if expectation.link:
            record["expected"]["link"] = expectation.link
    if result.divergence is not None:
        record["divergence"] = result.divergence.to_dict()
        record["description"] = result.divergence.describe()
        offset = result.divergence.offset
        if golden_data is not None:
            record["golden_window"] = _window(golden_data, offset)
        if result.output is not None:
            from conformance.judge.goldens import ENCODING_ERRORS

            record["output_window"] = _window(result.output.encode("utf-8", ENCODING_ERRORS), offset)
    elif result.output is not None:
        record["output"] = result.output[:OUTPUT_LIMIT]
    attribution = result.extra.get("attribution")
    if attribution:
        attribution = dict(attribution)
        if "line" in attribution:
            lines = source.splitlines()
            first = max(1, attribution["line"] - TEMPLATE_CONTEXT)
            attribution["context_first_line"] = first
            attribution["context"] = [line[:240] for line in lines[first - 1:attribution["line"] + TEMPLATE_CONTEXT]]
        record["attribution"] = attribution
    return record


def _blame(result: CellResult, blamed: Counter, blamed_lines: dict, notes: set) -> None:
    attribution = result.extra.get("attribution") or {}
    if "construct" in attribution:
        blamed[attribution["construct"]] += 1
        blamed_lines[attribution["construct"]][f"{result.template_id}:{attribution['line']}"] += 1
    elif attribution.get("unavailable", "").startswith("attribution unavailable: runners.evaluator"):
        notes.add(attribution["unavailable"])


def runner_section(runner_info: dict, results: list, expectations: Expectations, templates: dict,
                   cases: dict, goldens_root=None) -> dict:
    """Everything the report says about one runner. templates: id -> TemplateEntry; cases: id -> Case."""
    from conformance.judge.goldens import read_golden

    features: dict = {}
    constructs: dict = {}
    construct_cache: dict = {}
    notes = set()
    cells, passed = [], defaultdict(list)
    verdicts = Counter()
    blamed = Counter()
    blamed_lines = defaultdict(Counter)
    full_budget = FULL_RECORD_BUDGET
    known = defaultdict(dict)  # known divergences outside the budget, as "status[:fingerprint]"
    recorded = _recorded_constructs()
    per_template: dict = {}  # template id -> its cells' tallies, spread over its constructs after the loop
    for result in results:
        expectation = expectations.get(result.template_id, result.case_id)
        name = verdict(result, expectation)
        verdicts[name] += 1
        for tag in cases[result.case_id].features:
            _bump(features, tag, result)
        entry = templates[result.template_id]
        if result.template_id not in construct_cache:
            known_names = recorded.get(entry.sha256)
            names, problem = template_constructs(entry.source() if known_names is None else "", known_names)
            if problem and problem.startswith("attribution unavailable"):
                notes.add(problem)
            construct_cache[result.template_id] = names or ["(no inventory)"]
        _bump(per_template, result.template_id, result)
        if name == EXPECTED_PASS:
            passed[result.template_id].append(result.case_id)
            continue
        if name == EXPECTED_FAIL:
            if result.status != DIVERGED or full_budget <= 0:
                fp = result.extra.get("fingerprint")
                known[result.template_id][result.case_id] = result.status + (f":{fp}" if fp else "")
                _blame(result, blamed, blamed_lines, notes)
                continue
            full_budget -= 1
        golden_data = None
        if result.divergence is not None:
            golden = read_golden(result.template_id, result.case_id, goldens_root)
            golden_data = golden.data if golden else None
        _blame(result, blamed, blamed_lines, notes)
        cells.append(_cell_record(result, name, expectation, entry.source(), golden_data))
    for template_id, tally in per_template.items():
        for construct in construct_cache[template_id]:
            row = constructs.setdefault(construct, {"cells": 0, "matches": 0, "diverged": 0})
            for key in row:
                row[key] += tally[key]
    summary = summarize(results)
    return {
        "runner": runner_info,
        "counts": summary["counts"],
        "verdicts": {v: verdicts.get(v, 0) for v in (EXPECTED_PASS, EXPECTED_FAIL, UNEXPECTED_FAIL, CHANGED,
                                                      UNEXPECTED_PASS)},
        "expectations": {"file": str(expectations.path) if expectations.path else None,
                         "known": len(expectations)},
        "features": dict(sorted(features.items())),
        "constructs": dict(sorted(constructs.items())),
        "blamed_constructs": dict(blamed.most_common()),
        "blamed_lines": {c: dict(lines.most_common(5)) for c, lines in blamed_lines.items()},
        "notes": sorted(notes),
        "rules": list(expectations.rules),
        "cells": cells,
        "passed": {t: sorted(c) for t, c in sorted(passed.items())},
        "known": {t: dict(sorted(c.items())) for t, c in sorted(known.items())},
    }


def build_report(sections: dict, selection: dict, capability_agreement: Optional[dict] = None) -> dict:
    report = {"format": REPORT_FORMAT, "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "selection": selection, "runners": sections}
    if capability_agreement is not None:
        report["capability_agreement"] = capability_agreement
    return finalize(report)


# -- capability agreement (issue 8): llama.cpp's own view of each template's capabilities vs our goldens --------

AGREEMENT_COUNTS = ("agree", "disagree", "unknown")
MAX_DISAGREEMENTS = 20  # examples kept per capability (llamacpp_agreement keeps as many per run)


def supports_capability_agreement(runner) -> bool:
    """Only llama.cpp reports per-template capabilities (llama-server /props chat_template_caps)."""
    return getattr(runner, "name", None) == "llamacpp" and callable(getattr(runner, "props", None))


def capability_agreement(templates, llama_runner) -> dict:
    """The report's `capability_agreement` section for these templates, computed with an open llama.cpp runner."""
    from conformance.analysis.capabilities import agreement_summary, llamacpp_agreement

    templates = list(templates)
    summary = agreement_summary(llamacpp_agreement(templates, llama_runner), llama_runner.describe())
    summary["templates"] = len(templates)
    return summary


def load_capability_agreement(path) -> dict:
    """A summary written by `chatgold capabilities compare --out PATH`, checked enough to render."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable capability agreement JSON: {exc}") from None
    what = "a capability agreement summary (from `chatgold capabilities compare --out`)"
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("capabilities"), dict):
        raise ValueError(f"{path}: not {what}: expected an object with format 1 and `capabilities`")
    for name, row in data["capabilities"].items():
        if not isinstance(row, dict) or not all(isinstance(row.get(k), int) and row[k] >= 0 for k in AGREEMENT_COUNTS):
            raise ValueError(f"{path}: capability {name!r}: expected non-negative integer "
                             f"{'/'.join(AGREEMENT_COUNTS)} counts")
        if not isinstance(row.get("disagreements", []), list):
            raise ValueError(f"{path}: capability {name!r}: `disagreements` must be a list")
    data.setdefault("engine", {})
    data["source"] = str(path)
    return data


def _finalize_agreement(section: dict) -> None:
    for row in section["capabilities"].values():
        row.setdefault("disagreements", [])
        row["compared"] = row["agree"] + row["disagree"]
        row["agreement"] = round(row["agree"] / row["compared"], 4) if row["compared"] else None


def _merge_agreement(sections: list) -> Optional[dict]:
    """Shards hold disjoint templates: counts add up, examples concatenate (up to the per-capability cap)."""
    if not sections:
        return None
    merged = {"format": 1, "engine": sections[0].get("engine", {}), "capabilities": {},
              "templates": sum(s.get("templates", 0) for s in sections)}
    for section in sections:
        for name, row in section["capabilities"].items():
            into = merged["capabilities"].setdefault(name, {k: 0 for k in AGREEMENT_COUNTS} | {"disagreements": []})
            for key in AGREEMENT_COUNTS:
                into[key] += row[key]
            room = MAX_DISAGREEMENTS - len(into["disagreements"])
            into["disagreements"].extend(row.get("disagreements", [])[:max(room, 0)])
    merged["capabilities"] = dict(sorted(merged["capabilities"].items()))
    return merged


def finalize(report: dict) -> dict:
    """Derived numbers (conformance %, totals) recomputed from counts: after a build and after a merge."""
    unexpected = 0
    for section in report["runners"].values():
        counts = section["counts"]
        total = sum(counts.values())
        passed = sum(counts[s] for s in PASSING)
        section["cells_total"] = total
        section["conformance"] = round(100.0 * passed / total, 2) if total else None
        for table in (section["features"], section["constructs"]):
            for row in table.values():
                row["conformance"] = round(100.0 * row["matches"] / row["cells"], 2) if row["cells"] else None
        section["unexpected"] = sum(section["verdicts"][v] for v in FAILING_VERDICTS)
        unexpected += section["unexpected"]
    report["unexpected"] = unexpected
    if report.get("capability_agreement"):
        _finalize_agreement(report["capability_agreement"])
    return report


def merge_reports(reports: Iterable[dict]) -> dict:
    """Combine shard reports (disjoint templates) into one: counts add up, cell lists concatenate."""
    reports = list(reports)
    if not reports:
        raise ValueError("report merge: no input reports")
    merged = {"format": REPORT_FORMAT, "generated": max(r["generated"] for r in reports),
              "selection": dict(reports[0]["selection"], shard=None,
                                merged_from=[r["selection"].get("shard") for r in reports]),
              "runners": {}}
    for report in reports:
        if report.get("format") != REPORT_FORMAT:
            raise ValueError(f"report merge: format {report.get('format')!r}, expected {REPORT_FORMAT}")
        for name, section in report["runners"].items():
            into = merged["runners"].setdefault(name, {
                "runner": section["runner"], "counts": {s: 0 for s in STATUSES}, "verdicts": Counter(),
                "expectations": section["expectations"], "features": {}, "constructs": {},
                "blamed_constructs": Counter(), "blamed_lines": {}, "notes": [], "rules": section.get("rules", []),
                "cells": [], "passed": {}, "known": {}})
            for status, n in section["counts"].items():
                into["counts"][status] += n
            into["verdicts"].update(section["verdicts"])
            for key in ("features", "constructs"):
                for tag, row in section[key].items():
                    target = into[key].setdefault(tag, {"cells": 0, "matches": 0, "diverged": 0})
                    for field in ("cells", "matches", "diverged"):
                        target[field] += row[field]
            into["blamed_constructs"].update(section["blamed_constructs"])
            for construct, lines in section["blamed_lines"].items():
                into["blamed_lines"].setdefault(construct, Counter()).update(lines)
            into["notes"] = sorted(set(into["notes"]) | set(section["notes"]))
            into["cells"].extend(section["cells"])
            overlap = into["passed"].keys() & section["passed"].keys()
            if overlap:
                raise ValueError(f"report merge: template {sorted(overlap)[0]} appears in two shards for {name}")
            into["passed"].update(section["passed"])
            into["known"].update(section.get("known", {}))
    for section in merged["runners"].values():
        section["verdicts"] = dict(section["verdicts"])
        section["blamed_constructs"] = dict(section["blamed_constructs"].most_common())
        section["blamed_lines"] = {c: dict(Counter(l).most_common(5)) for c, l in section["blamed_lines"].items()}
        section["features"] = dict(sorted(section["features"].items()))
        section["constructs"] = dict(sorted(section["constructs"].items()))
        section["passed"] = dict(sorted(section["passed"].items()))
        section["known"] = dict(sorted(section["known"].items()))
        section["cells"].sort(key=lambda c: (c["template"], c["case"]))
    agreement = _merge_agreement([r["capability_agreement"] for r in reports if r.get("capability_agreement")])
    if agreement is not None:
        merged["capability_agreement"] = agreement
    return finalize(merged)


def load_report(path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON report: {exc}") from None


def write_outputs(report: dict, json_path=None, junit_path=None, markdown_path=None, badges_dir=None,
                  html_path=None) -> list:
    """Write every requested output; returns the paths written."""
    from conformance.report import html, render

    written = []

    def write_text(path, produce) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(produce(report), encoding="utf-8")
        written.append(target)

    if json_path:
        write_text(json_path, lambda r: json.dumps(r, ensure_ascii=False, separators=(",", ":")))
    if junit_path:
        written.append(render.write_junit(report, Path(junit_path)))
    if markdown_path:
        write_text(markdown_path, render.markdown)
    if badges_dir:
        written.extend(render.write_badges(report, Path(badges_dir)))
    if html_path:
        write_text(html_path, html.render_html)
    return written
