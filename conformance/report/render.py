"""Text outputs of a report: terminal summary, Markdown (GitHub step summary / PR comment), JUnit XML,
shields.io endpoint badges."""
from __future__ import annotations

import json
from pathlib import Path

from conformance.judge.status import Verdict, describe_figure
from conformance.report import changes, templates

TOP = 10
UNEXPECTED = (str(Verdict.UNEXPECTED_FAIL), str(Verdict.CHANGED))


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def _expected_suffix(cell: dict) -> str:
    return (f" (expected {cell['expected']['status']})" if cell.get("expected") else " (new)") + _moved_note(cell)


def _moved_note(cell: dict) -> str:
    """For a cell the baseline filed under another cause: which cause it left and which it shows now."""
    cause, before = changes.moved_from(cell)
    return f"; its cause changed from {before['id']} to {cause}" if before else ""


# The statuses where a side refused, each its own column (the terminal counts them apart too).
REFUSAL_COLUMNS = (("engine-raised", "engine raised"), ("raised-differently", "raised differently"),
                   ("engine-rendered", "engine rendered"))


def terminal(report, show_unexpected: int = 20) -> str:
    lines = []
    for name, section in report["runners"].items():
        counts = section["counts"]
        nonzero = ", ".join(f"{s} {n}" for s, n in counts.items() if n)
        lines.append(f"{name}: {describe_figure(section['figure'])} ({nonzero})")
        lines.extend(changes.terminal_lines(section, report.runner_cells(name)))
        if section.get("causes"):
            top = "; ".join(f"{c['title']} (+{c['gain']:.2f} pts)" for c in section["causes"][:3])
            lines.append(f"    top root causes: {top}")
        elif section["blamed_constructs"]:
            top = ", ".join(f"{c} {n}" for c, n in list(section["blamed_constructs"].items())[:5])
            lines.append(f"    divergences by construct: {top}")
        for note in section["notes"]:
            lines.append(f"    note: {note}")
        shown = 0
        for cell in section["unexpected_cells"][:show_unexpected]:
            shown += 1
            lines.append(f"    UNEXPECTED {cell['template']} x {cell['case']}: {cell['status']}"
                         + (f" (expected {cell['expected']['status']})" if cell.get("expected") else "")
                         + _moved_note(cell))
            if cell.get("description"):
                lines.extend("      " + part for part in cell["description"].splitlines())
            elif cell.get("message"):
                lines.append("      " + cell["message"].splitlines()[0][:200])
            if cell.get("reference_message"):
                lines.append("      reference: " + cell["reference_message"].splitlines()[0][:200])
        if section["unexpected"] > shown:
            lines.append(f"    ... {section['unexpected'] - shown} more unexpected (see the JSON/HTML report)")
    lines.extend(terminal_capability_agreement(report))
    lines.extend(templates.terminal_lines(report))
    lines.extend(terminal_analysis(report))
    lines.append(f"unexpected outcomes: {report['unexpected']}")
    return "\n".join(lines)


def markdown(report) -> str:
    out = ["## chatgold conformance", ""]
    out.append("| runner | conformance | ran | cells | matches | diverged | "
               + " | ".join(label for _, label in REFUSAL_COLUMNS) + " | other | not run "
               "| new cells | changed cells | now passing |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in report["runners"].items():
        c, fig = s["counts"], s["figure"]
        refused = [c.get(status, 0) for status, _ in REFUSAL_COLUMNS]
        other = fig["judged"] - fig["passed"] - c["diverged"] - sum(refused)
        v = s["verdicts"]
        out.append(f"| {name} | {_pct(fig['conformance'])} | {_pct(fig['ran'])} | {fig['cells']} | {fig['passed']} "
                   f"| {c['diverged']} | {' | '.join(map(str, refused))} | {other} | {fig['not_run']} "
                   f"| {v.get(str(Verdict.UNEXPECTED_FAIL), 0)} | {v.get(str(Verdict.CHANGED), 0)} "
                   f"| {v.get(str(Verdict.UNEXPECTED_PASS), 0)} |")
    out.append("")
    out.append("Conformance counts the cells a runner ran (skipped cells and cells without a golden are outside it); "
               "\"ran\" is the share of cells it ran.")
    out.append("")
    out.extend(changes.markdown_lines(report))
    for name, s in report["runners"].items():
        if s.get("causes"):
            out.append(f"<details><summary>{name}: top root causes</summary>\n")
            out.append("| cause | cells | templates | conformance if fixed |\n|---|---:|---:|---:|")
            for cause in s["causes"][:TOP]:
                out.append(f"| {cause['title']} (`{cause['id']}`) | {len(cause['cells'])} | {cause['templates']} "
                           f"| {_pct(cause['conformance_if_fixed'])} (+{cause['gain']:.2f}) |")
            out.append("\n</details>\n")
        rows = [(row["conformance"], tag) for tag, row in s["features"].items() if row["conformance"] is not None]
        worst = sorted(rows)[:TOP]
        out.append(f"<details><summary>{name}: weakest features and constructs</summary>\n")
        out.append("| feature | conformance |\n|---|---:|")
        out.extend(f"| `{tag}` | {_pct(p)} |" for p, tag in worst)
        rows = [(row["conformance"], tag) for tag, row in s["constructs"].items() if row["conformance"] is not None]
        out.append("\n| construct | conformance |\n|---|---:|")
        out.extend(f"| `{tag}` | {_pct(p)} |" for p, tag in sorted(rows)[:TOP])
        for note in s["notes"]:
            out.append(f"\n> {note}")
        out.append("\n</details>\n")
    out.extend(markdown_capability_agreement(report))
    out.extend(templates.markdown_lines(report))
    out.extend(markdown_analysis(report))
    unexpected = [(name, cell) for name, s in report["runners"].items() for cell in s["unexpected_cells"]]
    if unexpected:
        out.append(f"### {len(unexpected)} unexpected outcome(s)\n")
        for name, cell in unexpected[:50]:
            out.append(f"- **{name}** `{cell['template']}` x `{cell['case']}`: {cell['status']}{_expected_suffix(cell)}")
        if len(unexpected) > 50:
            out.append(f"- ... and {len(unexpected) - 50} more (every cell is in the report's cell records)")
    else:
        out.append("No unexpected outcomes.")
    return "\n".join(out) + "\n"


def _agreement_pct(row: dict) -> str:
    return "n/a" if row["agreement"] is None else f"{100 * row['agreement']:.1f}%"


def markdown_capability_agreement(report) -> list:
    """The capability agreement table, or nothing when the report has no such section."""
    section = report.get("capability_agreement")
    if not section:
        return []
    over = f" over {section['templates']} templates" if section.get("templates") is not None else ""
    engine = (section.get("engine") or {}).get("name", "engine")
    out = [f"### {engine} capability agreement{over}", "",
           "| capability | compared | agree | agreement | unknown |", "|---|---:|---:|---:|---:|"]
    for name, row in section["capabilities"].items():
        out.append(f"| `{name}` | {row['compared']} | {row['agree']} | {_agreement_pct(row)} | {row['unknown']} |")
    out.append("")
    return out


def markdown_analysis(report) -> list:
    """Template properties (violations per property) and the suite audit, when the report has them."""
    out = []
    section = report.get("properties")
    if section:
        out += [f"### Template properties over {section['recorded']} templates ({section['clean']} violate none)", "",
                "| property | violated | exceptions only | pass | n/a |", "|---|---:|---:|---:|---:|"]
        out += [f"| `{name}` | {row['violation']} | {row['exception']} | {row['pass']} | {row['not-applicable']} |"
                for name, row in section["properties"].items()]
        out.append("")
    audit = report.get("audit")
    if audit:
        out += [f"### Suite audit: {audit['told_apart']} of {audit['pairs']} revision pairs told apart"
                + (f" ({_pct(100 * audit['sensitivity'])})" if audit["sensitivity"] is not None else ""), ""]
        out += [f"- missed: `{pair}`" for pair in audit["missed"]]
        out.append("")
    return out


def terminal_analysis(report) -> list:
    lines = []
    section = report.get("properties")
    if section:
        rows = ", ".join(f"{name} {row['violation']}" for name, row in section["properties"].items())
        lines.append(f"template properties of the {section['templates']} selected template(s), templates violating "
                     f"each: {rows}")
    audit = report.get("audit")
    if audit:
        lines.append(f"suite audit: {audit['told_apart']}/{audit['pairs']} revision pairs of the selection told apart")
    return lines


def terminal_capability_agreement(report) -> list:
    section = report.get("capability_agreement")
    if not section:
        return []
    rows = ", ".join(f"{name} {row['agree']}/{row['compared']}" for name, row in section["capabilities"].items())
    return [f"{(section.get('engine') or {}).get('name', 'engine')} capability agreement: {rows}"]


def write_junit(report, path: Path) -> Path:
    """JUnit XML: one test case per runner x template and per change of root cause (conformance/report/junit.py)."""
    from conformance.report.junit import write_junit as write

    return write(report, path)


def badge(section: dict) -> dict:
    value = section["conformance"]
    colour = ("lightgrey" if value is None else "brightgreen" if value >= 99 else "green" if value >= 90
              else "yellow" if value >= 75 else "orange" if value >= 50 else "red")
    ran = section["figure"]["ran"]
    message = _pct(value) + (f" of {ran:.0f}% run" if ran is not None and ran < 100 else "")
    return {"schemaVersion": 1, "label": f"chatgold {section['runner'].get('name', '')}".strip(),
            "message": message, "color": colour}


def write_badges(report, directory: Path) -> list:

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, section in report["runners"].items():
        path = directory / ("".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) + ".json")
        data = badge(section)
        data["label"] = f"chatgold {name}"
        path.write_text(json.dumps(data) + "\n", encoding="utf-8")
        written.append(path)
    return written
