"""JUnit XML for CI reporters: what a CI reader acts on, not one element per cell.

One <testsuite> per runner holding
- one <testcase> per template (classname `chatgold.<runner>`, name the template id): a <failure> listing the
  template's unexpected cells (status, what was expected, the first difference), <skipped> when none of its
  cells ran, otherwise a pass; its <system-out> counts every cell of it (match, known non-matching, not run,
  now passing), so no cell goes uncounted;
- one <testcase> per change of root cause (classname `chatgold.<runner>.causes`): a new cause fails, a cell
  moved to a cause the baseline does not know fails, a fixed (stale) cause passes with a note to update the
  baseline.

Size: a line per template and per cause, plus the unexpected cells' texts, each cut to CELL_TEXT characters and
at most CELLS_DETAILED per template in full (the rest by name): bounded per cell whatever the run's size.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from conformance.judge.status import Verdict
from conformance.report import changes

UNEXPECTED = (str(Verdict.UNEXPECTED_FAIL), str(Verdict.CHANGED))
CELL_TEXT = 1500       # characters of one unexpected cell's description
CELLS_DETAILED = 20    # unexpected cells of one template shown with their description; the rest by name

# What XML 1.0 cannot carry, even escaped: most control characters, surrogates, U+FFFE and U+FFFF.
_XML_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """Characters XML 1.0 cannot carry shown as \\xNN."""
    return _XML_UNSAFE.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def _attr(text: str) -> str:
    return quoteattr(xml_safe(text))


def _cell_line(cell: dict) -> str:
    expected = cell.get("expected")
    line = f"{cell['case']}: {cell['status']}" + (f" (expected {expected['status']})" if expected else " (new)")
    cause, before = changes.moved_from(cell)
    if before:
        line += f"; its cause changed from {before['id']} to {cause}"
    elif cause:
        line += f"; cause {cause}"
    return line


def _template_case(runner: str, template: str, passed: int, cells: list) -> tuple[str, bool, bool]:
    """(the <testcase> element, failed, skipped) of one template."""
    tally = Counter()
    unexpected = []
    for cell in cells:
        verdict = cell["verdict"]
        tally[verdict] += 1
        if verdict in UNEXPECTED:
            unexpected.append(cell)
    total = passed + len(cells)
    counted = [f"{passed} match"] + [f"{n} {name}" for name, n in (
        ("known non-matching", tally[str(Verdict.EXPECTED_FAIL)]), ("unexpected", len(unexpected)),
        ("now passing (update the baseline)", tally[str(Verdict.UNEXPECTED_PASS)]),
        ("not run", tally[str(Verdict.NOT_RUN)])) if n]
    out = f"{total} cells: " + ", ".join(counted)
    head = f'    <testcase classname={_attr("chatgold." + runner)} name={_attr(template)}>'
    if unexpected:
        body = []
        for cell in unexpected[:CELLS_DETAILED]:
            text = cell.get("description") or cell.get("message") or ""
            body.append(_cell_line(cell) + ("\n  " + text[:CELL_TEXT].replace("\n", "\n  ") if text else ""))
        if len(unexpected) > CELLS_DETAILED:
            body.append("also: " + "; ".join(_cell_line(c) for c in unexpected[CELLS_DETAILED:]))
        message = f"{len(unexpected)} unexpected cell(s) of {total}"
        return (head + f"<failure message={_attr(message)}>{escape(xml_safe(chr(10).join(body)))}</failure>"
                f"<system-out>{escape(out)}</system-out></testcase>\n", True, False)
    if total and tally[str(Verdict.NOT_RUN)] == total:
        reasons = sorted({(c.get("message") or "").splitlines()[0][:200] if c.get("message") else c["status"]
                          for c in cells})
        return (head + f"<skipped message={_attr(out + ': ' + '; '.join(reasons[:3]))}/></testcase>\n", False, True)
    return head + f"<system-out>{escape(out)}</system-out></testcase>\n", False, False


def _cause_cases(runner: str, section: dict, cells: list) -> list:
    """[(element, failed)] for the runner's new, fixed and moved causes."""
    summary = changes.change_summary(section, cells)
    if summary is None:
        return []
    classname = _attr(f"chatgold.{runner}.causes")
    out = []
    listed = {c["id"]: [f"{t} x {k}" for t, k in c.get("cells", [])] for c in section.get("causes", [])}
    for cause in summary["new"]:
        where = listed.get(cause["id"], [])
        text = "\n".join(where[:CELLS_DETAILED] + ([f"... and {len(where) - CELLS_DETAILED} more"]
                                                   if len(where) > CELLS_DETAILED else []))
        out.append((f'    <testcase classname={classname} name={_attr("new cause " + cause["id"] + ": " + cause["title"])}>'
                    f'<failure message={_attr("new root cause in %d cell(s)" % cause["cells"])}>'
                    f'{escape(xml_safe(text))}</failure></testcase>\n', True))
    for cause in summary["fixed"]:
        out.append((f'    <testcase classname={classname} name={_attr("fixed cause " + cause["id"] + ": " + cause["title"])}>'
                    f'<system-out>{escape(xml_safe(cause["reason"] + "; update the baseline"))}</system-out>'
                    f'</testcase>\n', False))
    known = {c["id"] for c in section.get("causes", []) if c.get("known")}
    for move in summary["moved"]:
        name = f"moved {move['cells']} cell(s) from cause {move['from']} to {move['to']}"
        text = f"from {move['from']} {move['from_title']}\nto {move['to']} {move['to_title']}"
        if move["to"] in known:
            out.append((f'    <testcase classname={classname} name={_attr(name)}><system-out>'
                        f'{escape(xml_safe(text))}</system-out></testcase>\n', False))
        else:
            out.append((f'    <testcase classname={classname} name={_attr(name)}><failure message='
                        f'{_attr("cells moved to a cause the baseline does not know")}>{escape(xml_safe(text))}'
                        f'</failure></testcase>\n', True))
    return out


def write_junit(report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="chatgold">\n')
        for name, section in report["runners"].items():
            records = report.runner_cells(name)
            by_template: dict = defaultdict(list)
            for cell in records:
                by_template[cell["template"]].append(cell)
            templates = sorted(set(section["passed"]) | set(by_template))
            elements, failures, skipped = [], 0, 0
            for template in templates:
                element, failed, skip = _template_case(name, template, len(section["passed"].get(template, ())),
                                                       by_template.get(template, []))
                elements.append(element)
                failures += failed
                skipped += skip
            for element, failed in _cause_cases(name, section, records):
                elements.append(element)
                failures += failed
            fh.write(f'  <testsuite name={_attr("chatgold." + name)} tests="{len(elements)}" failures="{failures}" '
                     f'errors="0" skipped="{skipped}">\n')
            fh.writelines(elements)
            fh.write("  </testsuite>\n")
        fh.write("</testsuites>\n")
    return path
