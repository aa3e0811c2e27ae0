"""A static, self-contained HTML report (no scripts, no external resources): the runners x features and
runners x constructs matrix coloured by conformance, and a drill-down for diverged cells with golden and
output side by side (whitespace and control characters visible, the first differing byte marked) and the
template line that emitted the golden's first differing byte."""
from __future__ import annotations

import json
from html import escape

from conformance.judge.expectations import CHANGED, UNEXPECTED_FAIL

MAX_DRILLDOWN = 200  # diverged cells shown per runner (unexpected ones first); the JSON has them all

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f3f3f3;text-align:left}
td.name{text-align:left;font-family:monospace}
.c100{background:#2e7d32;color:#fff}.c95{background:#66bb6a}.c80{background:#d4e157}
.c50{background:#ffb74d}.c0{background:#e57373}.cna{background:#eee}
.matrix-wrap{overflow-x:auto}
.cell{border:1px solid #bbb;margin:.6em 0;padding:.3em .6em}
.cell.unexpected{border-color:#c62828;border-width:2px}
.side{display:grid;grid-template-columns:1fr 1fr;gap:.6em}
pre{white-space:pre-wrap;word-break:break-all;background:#fafafa;border:1px solid #ddd;padding:.4em;margin:.2em 0;
    font:12px/1.35 monospace;max-height:28em;overflow:auto}
mark.diff{background:#ffcdd2;outline:1px solid #c62828}
mark.first{background:#c62828;color:#fff}
.ws{color:#999}
.ctl{color:#fff;background:#7b1fa2;border-radius:2px;padding:0 1px}
.blame{background:#fff59d;display:block}
.lineno{color:#999;user-select:none}
.note{color:#6d4c41}
"""


def show(text: str) -> str:
    """Escaped HTML with whitespace and control characters visible."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == " ":
            out.append('<span class="ws">·</span>')
        elif ch == "\n":
            out.append('<span class="ws">↵</span>\n')
        elif ch == "\t":
            out.append('<span class="ws">→</span>\t')
        elif ch == "\r":
            out.append('<span class="ctl">\\r</span>')
        elif code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0 or code in (0x2028, 0x2029, 0xFEFF, 0x200B, 0x85):
            label = f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"
            out.append(f'<span class="ctl">{label}</span>')
        else:
            out.append(escape(ch))
    return "".join(out)


def _colour(value) -> str:
    if value is None:
        return "cna"
    return "c100" if value >= 100 else "c95" if value >= 95 else "c80" if value >= 80 else "c50" if value >= 50 else "c0"


def _matrix(report: dict, key: str, title: str) -> str:
    runners = list(report["runners"])
    rows = sorted({tag for s in report["runners"].values() for tag in s[key]})
    head = "".join(f"<th>{escape(r)}</th>" for r in runners)
    body = []
    for tag in rows:
        tds = []
        for r in runners:
            row = report["runners"][r][key].get(tag)
            if row is None:
                tds.append('<td class="cna">–</td>')
            else:
                pct = row["conformance"]
                tds.append(f'<td class="{_colour(pct)}" title="{row["matches"]}/{row["cells"]} match, '
                           f'{row["diverged"]} diverged">{"n/a" if pct is None else f"{pct:.1f}%"}</td>')
        body.append(f'<tr><td class="name">{escape(tag)}</td>{"".join(tds)}</tr>')
    return (f'<h2>{title}</h2><div class="matrix-wrap"><table class="matrix" id="matrix-{key}">'
            f'<tr><th>{key[:-1]}</th>{head}</tr>{"".join(body)}</table></div>')


def _side(window: dict, label: str) -> str:
    if not window:
        return f"<div><b>{label}</b><pre>(not recorded)</pre></div>"
    after = window["after"]
    first, rest = after[:1], after[1:]
    lead = "…" if window["start"] > 0 else ""
    tail = "…" if window.get("truncated_after") else ('<span class="ws">⟨end⟩</span>' if not after else "")
    return (f'<div><b>{label}</b> (from byte {window["start"]})<pre>{lead}{show(window["before"])}'
            f'<mark class="diff"><mark class="first">{show(first) or "⟨end⟩"}</mark>{show(rest)}</mark>{tail}</pre></div>')


def _template_excerpt(attribution: dict) -> str:
    if not attribution:
        return ""
    if "line" not in attribution:
        return f'<p class="note">{escape(attribution.get("unavailable", ""))}</p>'
    first = attribution.get("context_first_line", attribution["line"])
    lines = []
    for number, text in enumerate(attribution.get("context", []), first):
        cls = ' class="blame"' if number == attribution["line"] else ""
        lines.append(f'<span{cls}><span class="lineno">{number:5d} </span>{show(text)}</span>')
    return (f'<p>golden\'s first differing byte emitted by template line <b>{attribution["line"]}</b> '
            f'(<code>{escape(attribution["construct"])}</code>)'
            f'{" — the golden ends there" if attribution.get("at_golden_end") else ""}</p>'
            f'<pre class="template">{"".join(lines)}</pre>')


def _drilldown(name: str, section: dict) -> str:
    diverged = [c for c in section["cells"] if c["status"] == "diverged"]
    # unexpected first, then cells the JSON kept in full (known divergences beyond its budget are lean)
    diverged.sort(key=lambda c: (c["verdict"] not in (UNEXPECTED_FAIL, CHANGED), "golden_window" not in c,
                                 c["template"], c["case"]))
    parts = [f'<h3 id="runner-{escape(name)}">{escape(name)}: {len(diverged)} diverged cell(s)</h3>']
    if len(diverged) > MAX_DRILLDOWN:
        parts.append(f'<p class="note">showing the first {MAX_DRILLDOWN} of {len(diverged)} diverged cells '
                     f'(unexpected first); the JSON report has every one.</p>')
    for index, cell in enumerate(diverged[:MAX_DRILLDOWN]):
        unexpected = cell["verdict"] in (UNEXPECTED_FAIL, CHANGED)
        reason = (cell.get("expected") or {}).get("reason", "")
        div = cell.get("divergence", {})
        parts.append(
            f'<details{" open" if index == 0 else ""} class="cell{" unexpected" if unexpected else ""}" data-cell="{escape(name)}/{escape(cell["template"])}/{escape(cell["case"])}">'
            f'<summary><code>{escape(cell["template"])}</code> × <code>{escape(cell["case"])}</code> — '
            f'{escape(cell["verdict"])}, byte {div.get("offset")} (line {div.get("line")}, column {div.get("column")})'
            f'</summary>'
            + (f'<p class="note">expected: {escape(reason)}</p>' if reason else "")
            + f'<div class="side">{_side(cell.get("golden_window"), "golden")}{_side(cell.get("output_window"), "output")}</div>'
            + _template_excerpt(cell.get("attribution")) + "</details>")
    return "".join(parts)


def _value(value) -> str:
    return escape(json.dumps(value, ensure_ascii=False)[:200])


def _capability_agreement(report: dict) -> str:
    """Per capability agreement with llama.cpp, each row listing the templates it disagrees on."""
    section = report.get("capability_agreement")
    if not section:
        return ""
    engine = section.get("engine") or {}
    what = " ".join(str(engine[k]) for k in ("name", "version") if engine.get(k))
    rows = []
    for name, row in section["capabilities"].items():
        pct = None if row["agreement"] is None else 100 * row["agreement"]
        examples = "".join(f'<li><code>{escape(d["template"])}</code>: reference {_value(d.get("reference"))}, '
                           f'llama.cpp {_value(d.get("llamacpp"))}</li>' for d in row["disagreements"])
        unlisted = row["disagree"] - len(row["disagreements"])
        if unlisted > 0:
            examples += f"<li>… and {unlisted} more</li>"
        rows.append(f'<tr><td class="name">{escape(name)}</td><td>{row["compared"]}</td><td>{row["agree"]}</td>'
                    f'<td class="{_colour(pct)}">{"n/a" if pct is None else f"{pct:.1f}%"}</td>'
                    f'<td>{row["unknown"]}</td><td class="name">'
                    + (f"<ul>{examples}</ul>" if examples else "–") + "</td></tr>")
    source = f'; loaded from {escape(section["source"])}' if section.get("source") else ""
    over = f' over {section["templates"]} template(s)' if section.get("templates") is not None else ""
    return (f'<h2>llama.cpp capability agreement</h2><p class="note">{escape(what)}{over}{source}: '
            'llama-server\'s own view of each template (/props chat_template_caps, generation prompt) '
            'against the capability goldens; unknown = one side could not tell.</p>'
            '<table id="capability-agreement"><tr><th>capability</th><th>compared</th><th>agree</th>'
            '<th>agreement</th><th>unknown</th><th>disagreeing templates</th></tr>' + "".join(rows) + "</table>")


def render_html(report: dict) -> str:
    summary_rows = []
    for name, s in report["runners"].items():
        v = s["verdicts"]
        summary_rows.append(
            f'<tr><td class="name"><a href="#runner-{escape(name)}">{escape(name)}</a></td>'
            f'<td class="{_colour(s["conformance"])}">{s["conformance"]}%</td><td>{s["cells_total"]}</td>'
            f'<td>{s["counts"]["diverged"]}</td><td>{v.get("unexpected-fail", 0)}</td><td>{v.get("changed", 0)}</td>'
            f'<td>{v.get("unexpected-pass", 0)}</td><td>{escape(", ".join(list(s["blamed_constructs"])[:3]))}</td></tr>')
    notes = sorted({n for s in report["runners"].values() for n in s["notes"]})
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>chatgold conformance report</title>'
        f'<style>{STYLE}</style></head><body><h1>chatgold conformance report</h1>'
        f'<p>generated {escape(report["generated"])}; {report["unexpected"]} unexpected outcome(s)</p>'
        + "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
        + '<table id="summary"><tr><th>runner</th><th>conformance</th><th>cells</th><th>diverged</th><th>new</th>'
          '<th>changed</th><th>now passing</th><th>top blamed constructs</th></tr>' + "".join(summary_rows) + "</table>"
        + _matrix(report, "features", "Conformance by case feature")
        + _matrix(report, "constructs", "Conformance by Jinja construct (templates using it)")
        + _capability_agreement(report)
        + "<h2>Diverged cells</h2>"
        + "".join(_drilldown(name, s) for name, s in report["runners"].items())
        + "</body></html>\n")
