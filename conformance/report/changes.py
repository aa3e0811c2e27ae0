"""The gate's change summary by root cause: what a baseline diff means to the engine author.

From a runner's report section and its cell records (so merged shard reports summarise the same way):

- new causes: explained causes the baseline does not know (their cells are unexpected);
- fixed causes: causes the baseline knows whose reproducer no longer differs ("stale": update the baseline);
- moved cells: cells the baseline filed under one cause that now show another, grouped by (from, to).

Cell counts (known, new, changed, now passing, not run) stay beside it, named as cells. Without an explanation
(`--no-explain`) there are no causes to compare: the summary says so rather than print zeros.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

from conformance.judge.status import Verdict


def cell_counts(section: dict) -> dict:
    v = section["verdicts"]
    return {"known": v.get(str(Verdict.EXPECTED_FAIL), 0), "new": v.get(str(Verdict.UNEXPECTED_FAIL), 0),
            "changed": v.get(str(Verdict.CHANGED), 0), "now passing": v.get(str(Verdict.UNEXPECTED_PASS), 0),
            "not run": v.get(str(Verdict.NOT_RUN), 0)}


def change_summary(section: dict, records: list) -> Optional[dict]:
    """{"new": [{id, title, cells}], "fixed": [{id, title, reason}], "moved": [{from, from_title, to, to_title,
    cells}]}, or None when the run was not explained."""
    if "causes" not in section:
        return None
    titles = {c["id"]: c.get("title", "") for c in section["causes"]}
    new = [{"id": c["id"], "title": c.get("title", ""), "cells": len(c.get("cells", []))}
           for c in section["causes"] if c.get("known") is False]
    fixed = [{"id": s["id"], "title": s.get("title", ""), "reason": str(s.get("reason", ""))}
             for s in section.get("stale_causes", [])]
    moves: Counter = Counter()
    old_titles: dict = {}
    for record in records:
        cause, before = moved_from(record)
        if before is not None:
            moves[(before["id"], cause)] += 1
            old_titles[before["id"]] = before.get("title", "")
    moved = [{"from": old, "from_title": old_titles.get(old) or titles.get(old, ""), "to": to,
              "to_title": titles.get(to, ""), "cells": n}
             for (old, to), n in sorted(moves.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {"new": sorted(new, key=lambda c: (-c["cells"], c["id"])), "fixed": sorted(fixed, key=lambda c: c["id"]),
            "moved": moved}


def moved_from(record: dict) -> tuple:
    """(the cell's cause now, {"id", "title"} of the cause the baseline filed it under) when they differ, else
    (cause, None)."""
    cause = record.get("cause")
    expected = record.get("expected") or {}
    before = expected.get("recorded_cause")
    if before is None and expected.get("cause"):
        before = {"id": expected["cause"], "title": ""}
    if cause and before and before["id"] != cause:
        return cause, before
    return cause, None


def _cells(n: int) -> str:
    return f"{n} cell{'s' if n != 1 else ''}"


def run_change_summary(run) -> Optional[dict]:
    """The change summary of judged results (judge.pipeline.RunnerResults) before any report is built (the
    pytest gate's terminal summary)."""
    explanation = run.explanation
    if explanation is None:
        return None
    section = {"causes": [{"id": c.id, "title": c.title, "known": c.known, "cells": list(c.cells)}
                          for c in explanation.causes],
               "stale_causes": list(explanation.stale)}
    records = [{"cause": r.cause, "expected": {"cause": r.expectation.cause, **(
                   {"recorded_cause": r.expectation.recorded_cause} if r.expectation.recorded_cause else {})}}
               for r in run.results if r.expectation is not None and r.cause]
    return change_summary(section, records)


def terminal_lines(section: dict, records: list, limit: int = 10) -> list:
    counts = cell_counts(section)
    lines = ["    cells: " + ", ".join(f"{n} {name}" for name, n in counts.items())]
    return lines + summary_lines(change_summary(section, records), limit)


def summary_lines(summary: Optional[dict], limit: int = 10) -> list:
    lines = []
    if summary is None:
        lines.append("    causes: not looked for (run without --no-explain to compare root causes)")
        return lines
    lines.append(f"    causes: {len(summary['new'])} new, {len(summary['fixed'])} fixed, "
                 f"{sum(m['cells'] for m in summary['moved'])} cells moved to another cause")
    for cause in summary["new"][:limit]:
        lines.append(f"      NEW   {cause['id']} {cause['title']} ({_cells(cause['cells'])})")
    for cause in summary["fixed"][:limit]:
        lines.append(f"      FIXED {cause['id']} {cause['title']}: {cause['reason']} (update the baseline)")
    for move in summary["moved"][:limit]:
        lines.append(f"      MOVED {_cells(move['cells'])} from {move['from']} {move['from_title']} to "
                     f"{move['to']} {move['to_title']}".rstrip())
    hidden = sum(max(0, len(summary[k]) - limit) for k in ("new", "fixed", "moved"))
    if hidden:
        lines.append(f"      ... {hidden} more (see the JSON/HTML report)")
    return lines


def markdown_lines(report) -> list:
    """A "Changes by root cause" section: every runner's new, fixed and moved causes, or nothing to say."""
    out = []
    for name, section in report["runners"].items():
        summary = change_summary(section, report.runner_cells(name))
        if summary is None or not any(summary.values()):
            continue
        if not out:
            out += ["### Changes by root cause", ""]
        out.append(f"**{name}**: {len(summary['new'])} new, {len(summary['fixed'])} fixed, "
                   f"{sum(m['cells'] for m in summary['moved'])} cells moved\n")
        out += [f"- new `{c['id']}` {_md(c['title'])} ({_cells(c['cells'])})" for c in summary["new"]]
        out += [f"- fixed `{c['id']}` {_md(c['title'])}: {_md(c['reason'])}" for c in summary["fixed"]]
        out += [f"- moved {_cells(m['cells'])} from `{m['from']}` {_md(m['from_title'])} to `{m['to']}` "
                f"{_md(m['to_title'])}" for m in summary["moved"]]
        out.append("")
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def cause_command(cause_id: str, section: dict) -> str:
    """The command line that replays a report's cause (the HTML report's "copy as command" line)."""
    import shlex

    runner = section.get("runner") or {}
    baseline = (section.get("expectations") or {}).get("file")
    if "protocol" not in runner:  # a runner the suite ships: its name is its spec
        return f"chatgold render --cause {shlex.quote(cause_id)} --runner {shlex.quote(str(runner.get('name', 'R')))}"
    # A command: harness: its argv is the user's own (the report does not hold it); its baseline folder is known.
    folder = f" --expectations {shlex.quote(str(Path(baseline).parent))}" if baseline else ""
    return f"chatgold render --cause {shlex.quote(cause_id)} --runner command:'<your harness>'{folder}"


def html_section(report) -> str:
    """The same changes for the HTML report, under the summary table."""
    from html import escape

    parts = []
    for name, section in report["runners"].items():
        summary = change_summary(section, report.runner_cells(name))
        if summary is None or not any(summary.values()):
            continue
        items = [f"<li>new <code>{escape(c['id'])}</code> {escape(c['title'])} ({_cells(c['cells'])})</li>"
                 for c in summary["new"]]
        items += [f"<li>fixed <code>{escape(c['id'])}</code> {escape(c['title'])}: {escape(c['reason'])}</li>"
                  for c in summary["fixed"]]
        items += [f"<li>moved {_cells(m['cells'])} from <code>{escape(m['from'])}</code> {escape(m['from_title'])} "
                  f"to <code>{escape(m['to'])}</code> {escape(m['to_title'])}</li>" for m in summary["moved"]]
        parts.append(f"<p><b>{escape(name)}</b>: {len(summary['new'])} new, {len(summary['fixed'])} fixed, "
                     f"{sum(m['cells'] for m in summary['moved'])} cells moved</p><ul>{''.join(items)}</ul>")
    return "<h2>Changes by root cause</h2>" + "".join(parts) if parts else ""
