"""Text outputs of a report: terminal summary, Markdown (GitHub step summary / PR comment), JUnit XML,
shields.io endpoint badges."""
from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from conformance.judge.expectations import CHANGED, UNEXPECTED_FAIL, UNEXPECTED_PASS, Expectations

TOP = 10


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def terminal(report: dict, show_unexpected: int = 20) -> str:
    lines = []
    for name, section in report["runners"].items():
        counts = section["counts"]
        nonzero = ", ".join(f"{s} {n}" for s, n in counts.items() if n)
        lines.append(f"{name}: {_pct(section['conformance'])} conformance over {section['cells_total']} cells ({nonzero})")
        v = section["verdicts"]
        lines.append(f"    expectations: {v.get('expected-fail', 0)} known, {v.get(UNEXPECTED_FAIL, 0)} new, "
                     f"{v.get(CHANGED, 0)} changed, {v.get(UNEXPECTED_PASS, 0)} now passing")
        if section["blamed_constructs"]:
            top = ", ".join(f"{c} {n}" for c, n in list(section["blamed_constructs"].items())[:5])
            lines.append(f"    divergences by construct: {top}")
        for note in section["notes"]:
            lines.append(f"    note: {note}")
        shown = 0
        for cell in section["cells"]:
            if cell["verdict"] in (UNEXPECTED_FAIL, CHANGED) and shown < show_unexpected:
                shown += 1
                lines.append(f"    UNEXPECTED {cell['template']} x {cell['case']}: {cell['status']}"
                             + (f" (expected {cell['expected']['status']})" if cell.get("expected") else ""))
                if cell.get("description"):
                    lines.extend("      " + part for part in cell["description"].splitlines())
                elif cell.get("message"):
                    lines.append("      " + cell["message"].splitlines()[0][:200] if cell["message"] else "")
        if section["unexpected"] > shown:
            lines.append(f"    ... {section['unexpected'] - shown} more unexpected (see the JSON/HTML report)")
    lines.extend(terminal_capability_agreement(report))
    lines.append(f"unexpected outcomes: {report['unexpected']}")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    out = ["## chatgold conformance", ""]
    out.append("| runner | conformance | cells | matches | diverged | other | new | changed | now passing |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in report["runners"].items():
        c = s["counts"]
        matches = c["match"] + c["both-raised"]
        other = s["cells_total"] - matches - c["diverged"]
        v = s["verdicts"]
        out.append(f"| {name} | {_pct(s['conformance'])} | {s['cells_total']} | {matches} | {c['diverged']} | {other} "
                   f"| {v.get(UNEXPECTED_FAIL, 0)} | {v.get(CHANGED, 0)} | {v.get(UNEXPECTED_PASS, 0)} |")
    out.append("")
    for name, s in report["runners"].items():
        worst = sorted(((row["conformance"], tag) for tag, row in s["features"].items()), key=lambda x: (x[0], x[1]))[:TOP]
        out.append(f"<details><summary>{name}: weakest features and constructs</summary>\n")
        out.append("| feature | conformance |\n|---|---:|")
        out.extend(f"| `{tag}` | {_pct(p)} |" for p, tag in worst)
        worst_c = sorted(((row["conformance"], tag) for tag, row in s["constructs"].items()))[:TOP]
        out.append("\n| construct | conformance |\n|---|---:|")
        out.extend(f"| `{tag}` | {_pct(p)} |" for p, tag in worst_c)
        if s["blamed_constructs"]:
            out.append("\n| construct emitting the first differing golden byte | divergences |\n|---|---:|")
            out.extend(f"| `{c}` | {n} |" for c, n in list(s["blamed_constructs"].items())[:TOP])
        for note in s["notes"]:
            out.append(f"\n> {note}")
        out.append("\n</details>\n")
    out.extend(markdown_capability_agreement(report))
    unexpected = [(name, cell) for name, s in report["runners"].items() for cell in s["cells"]
                  if cell["verdict"] in (UNEXPECTED_FAIL, CHANGED)]
    if unexpected:
        out.append(f"### {len(unexpected)} unexpected outcome(s)\n")
        for name, cell in unexpected[:50]:
            out.append(f"- **{name}** `{cell['template']}` x `{cell['case']}`: {cell['status']}"
                       + (f" (expected {cell['expected']['status']})" if cell.get("expected") else " (new)"))
        if len(unexpected) > 50:
            out.append(f"- ... and {len(unexpected) - 50} more")
    else:
        out.append("No unexpected outcomes.")
    return "\n".join(out) + "\n"


def _agreement_pct(row: dict) -> str:
    return "n/a" if row["agreement"] is None else f"{100 * row['agreement']:.1f}%"


def markdown_capability_agreement(report: dict) -> list:
    """The capability agreement table, or nothing when the report has no such section."""
    section = report.get("capability_agreement")
    if not section:
        return []
    over = f" over {section['templates']} templates" if section.get("templates") is not None else ""
    out = [f"### llama.cpp capability agreement{over}", "",
           "| capability | compared | agree | agreement | unknown |", "|---|---:|---:|---:|---:|"]
    for name, row in section["capabilities"].items():
        out.append(f"| `{name}` | {row['compared']} | {row['agree']} | {_agreement_pct(row)} | {row['unknown']} |")
    out.append("")
    return out


def terminal_capability_agreement(report: dict) -> list:
    section = report.get("capability_agreement")
    if not section:
        return []
    rows = ", ".join(f"{name} {row['agree']}/{row['compared']}" for name, row in section["capabilities"].items())
    return [f"llama.cpp capability agreement: {rows}"]


def write_junit(report: dict, path: Path) -> Path:
    """One <testcase> per cell; expected divergences are reported as skipped with their reason."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="chatgold">\n')
        for name, s in report["runners"].items():
            rules = Expectations(name, rules=s.get("rules", []))
            failures = s["unexpected"]
            skipped = s["verdicts"].get("expected-fail", 0)
            fh.write(f'  <testsuite name={quoteattr("chatgold." + name)} tests="{s["cells_total"]}" '
                     f'failures="{failures}" errors="0" skipped="{skipped}">\n')
            for template, cases in s["passed"].items():
                for case in cases:
                    fh.write(f'    <testcase classname={quoteattr(f"{name}.{template}")} name={quoteattr(case)}/>\n')
            for template, cases in s.get("known", {}).items():
                for case, value in cases.items():
                    status = value.partition(":")[0]
                    reason = rules.reason_for(template, case, status)[0] or "known divergence"
                    fh.write(f'    <testcase classname={quoteattr(f"{name}.{template}")} name={quoteattr(case)}>'
                             f'<skipped message={quoteattr(_xml_safe(status + ": " + reason))}/></testcase>\n')
            for cell in s["cells"]:
                fh.write(f'    <testcase classname={quoteattr(name + "." + cell["template"])} name={quoteattr(cell["case"])}>')
                text = cell.get("description") or cell.get("message") or ""
                if cell["verdict"] in (UNEXPECTED_FAIL, CHANGED):
                    summary = f"{cell['status']}" + (f" (expected {cell['expected']['status']})" if cell.get("expected") else " (new)")
                    fh.write(f'<failure message={quoteattr(summary)}>{escape(_xml_safe(text))}</failure>')
                elif cell["verdict"] == "expected-fail":
                    reason = ((cell.get("expected") or {}).get("reason") or rules.reason_for(
                        cell["template"], cell["case"], cell["status"])[0] or "known divergence")
                    fh.write(f'<skipped message={quoteattr(_xml_safe(cell["status"] + ": " + reason))}/>')
                elif cell["verdict"] == UNEXPECTED_PASS:
                    fh.write(f'<system-out>{escape("now passes; expected " + cell["expected"]["status"])}</system-out>')
                fh.write("</testcase>\n")
            fh.write("  </testsuite>\n")
        fh.write("</testsuites>\n")
    return path


def _xml_safe(text: str) -> str:
    """XML 1.0 cannot carry most control characters, even escaped: show them as \\xNN."""
    return "".join(ch if ch in "\t\n\r" or (ord(ch) >= 0x20 and ord(ch) not in (0xFFFE, 0xFFFF)
                                           and not 0xD800 <= ord(ch) <= 0xDFFF) else f"\\x{ord(ch):02x}"
                   for ch in text)


def badge(section: dict) -> dict:
    value = section["conformance"]
    colour = ("lightgrey" if value is None else "brightgreen" if value >= 99 else "green" if value >= 90
              else "yellow" if value >= 75 else "orange" if value >= 50 else "red")
    return {"schemaVersion": 1, "label": f"chatgold {section['runner'].get('name', '')}".strip(),
            "message": _pct(value), "color": colour}


def write_badges(report: dict, directory: Path) -> list:
    from conformance.judge.expectations import runner_file_name

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, section in report["runners"].items():
        path = directory / runner_file_name(name)
        data = badge(section)
        data["label"] = f"chatgold {name}"
        path.write_text(json.dumps(data) + "\n", encoding="utf-8")
        written.append(path)
    return written
